"""Lazy package exports (PEP 562): a package names what it exports and where each name lives,
and the submodule (torch, transformers) loads on first use, so importing a light submodule (a
config, a constant) through the package stays cheap."""

from __future__ import annotations

import atexit
import gc
import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

TRAINING_STACK = ("torch", "deepspeed", "moe_core.train.loop")
"""What a process that trains (a trial, a parent's task) imports: :func:`import_frozen`."""


def lazy_exports(package: str, table: Mapping[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: ``table`` maps an exported name to
    the module that defines it."""

    def __getattr__(name: str) -> Any:
        if name in table:
            return getattr(importlib.import_module(table[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(table))

    return __getattr__, __dir__


def lazy_function(module: str, name: str) -> Callable[..., Any]:
    """``module.name`` (a function or a class to call), imported at its first call: a module
    that only passes it on (a Ray task, a trial body the sweep driver hands to Tune) binds it at
    import without importing ``module`` (torch). The name stays a plain global of the importing
    module, so a test can still replace it there."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``{module}.{name}``, imported at the first call."
    return call


def freeze_heap() -> None:
    """Move what the process holds now out of the cyclic collector's sight (``gc.freeze``).
    Only in a process nothing froze yet (a sweep's driver, a trial's worker; the test process
    freezes its own heap, tests/conftest.py): what is garbage in cycles now is kept, and a
    process that froze before knows its heap better. Imported modules live until exit, yet
    each full collection walks them again: a ``gc.collect()`` over a trial worker's training
    stack took 0.24 s, a few microseconds frozen. At exit the heap stays frozen, so the
    interpreter's last collections skip it too (a driver's exit: 0.5 s of CPU less; a
    process with the training stack: 1.5 s), unless torch is loaded: its triton counts the
    nanobind objects a frozen heap keeps at exit and prints them as leaks."""
    if gc.get_freeze_count() == 0:
        atexit.register(_unfreeze_for_nanobind)
        gc.freeze()


def _unfreeze_for_nanobind() -> None:
    if "torch" in sys.modules:
        gc.unfreeze()


def import_frozen(*modules: str) -> None:
    """Import ``modules`` with the cyclic collector paused, then :func:`freeze_heap`: the
    collections an import triggers walk the growing heap again and again (a trial worker's
    training stack, torch, DeepSpeed and the model, about 420,000 objects: 5.7-6.0 s of CPU
    to import, 4.5-5.0 s paused). Once they are all imported (a reused Tune actor's next
    trial), nothing is done."""
    if all(m in sys.modules for m in modules):
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        for m in modules:
            importlib.import_module(m)
    finally:
        if enabled:
            gc.enable()
    freeze_heap()

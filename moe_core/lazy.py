"""Lazy package exports (PEP 562): a package names what it exports and where each name lives,
and the submodule (torch, transformers) loads on first use, so importing a light submodule (a
config, a constant) through the package stays cheap."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


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

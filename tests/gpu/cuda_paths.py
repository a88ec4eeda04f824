"""The code paths a CUDA bf16 run takes, forced in a CPU process, so the GPU tier
(``tests/gpu``) runs in CI without a GPU: bf16 through DeepSpeed's real wrappers (``optim.dtype``
auto and bf16 give bf16 on the CPU), ``torch._grouped_mm`` for the bf16 experts (it runs forward
and backward on CPU in torch 2.13), and the atomic-free dispatch/combine.

:func:`force` patches this process. ``ENV=1`` with ``SITE`` on ``PYTHONPATH`` patches every
Python process started with that environment (a sweep's driver and its Ray workers) through
``SITE/sitecustomize.py``, as each patched module is imported (Ray's own helper processes, which
never import the project, start as fast as before). Each patched name must exist: a renamed
switch fails here, loudly, instead of letting the tier pass on the CPU paths."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

ENV = "UPCYCLE_CUDA_PATHS_ON_CPU"
SITE = Path(__file__).resolve().parent / "cpu_site"


def _pick_dtype(cfg_dtype: str, device):
    """``moe_core.train.engine.pick_dtype`` as on a bf16-capable CUDA device."""
    import torch

    return torch.float32 if cfg_dtype == "fp32" else torch.bfloat16


def _grouped(x) -> bool:
    import torch

    return x.dtype == torch.bfloat16


PATCHES: dict[str, tuple[tuple[str, object], ...]] = {
    "moe_core.train.engine": (("pick_dtype", _pick_dtype),),
    "moe_core.moe.layer": (("_use_grouped_mm", _grouped), ("ATOMIC_FREE", True)),
}
"""Module -> (name, value): the choice CUDA bf16 makes, on any device."""


def apply(module: ModuleType, setattr_=setattr) -> None:
    for name, value in PATCHES.get(module.__name__, ()):
        if not hasattr(module, name):
            raise AttributeError(f"{module.__name__}.{name} is gone: update "
                                 "tests/gpu/cuda_paths.py so the GPU tier still takes the CUDA "
                                 "code paths on CPU")
        setattr_(module, name, value)


def force(setattr_=setattr) -> None:
    """Apply every patch now (``setattr_``: e.g. a pytest ``MonkeyPatch.setattr``)."""
    for name in PATCHES:
        apply(importlib.import_module(name), setattr_)

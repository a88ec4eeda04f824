"""Count the device-to-host reads a piece of training code makes, on any device (CPU included).

On CUDA each of these stops the host until the GPU has caught up (a "host sync"): the CPU can
then no longer queue kernels ahead of the GPU, and its launch latency shows at every one. The
counter sees them at the ATen dispatcher (``TorchDispatchMode``), forward and backward, so
what C++ does inside an op is counted too:

- ``_local_scalar_dense``: ``.item()``, ``float(t)``, ``int(t)``, ``bool(t)`` (an ``if`` on a
  tensor);
- ops whose output size depends on the data: ``nonzero``, ``masked_select``, ``unique``,
  ``repeat_interleave`` without ``output_size``, and indexing with a boolean mask;
- ``bincount`` counts 2: on CUDA it reads ``min()`` and ``max()`` to size its output
  (``aten/src/ATen/native/cuda/SummaryOps.cu``);
- ``Tensor.tolist`` / ``.numpy()`` (no dispatcher op on CPU; wrapped in Python while counting).

Each read is attributed to the innermost frame of the stack that is not torch's own code
(torch.optim excepted), e.g. ``moe_core/train/loop.py:226`` or ``deepspeed/runtime/utils.py:293``.
torch's AdamW reads its ``step`` counters with ``.item()``; those tensors stay on the host on
CUDA (unless ``capturable``/``fused``), so ``SyncCount.host_side`` keeps them apart and
``total`` leaves them out. Eager code only: a compiled region is not looked into.
"""

from __future__ import annotations

import collections
import contextlib
import os
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_SYNC_OPS = {
    "_local_scalar_dense": 1, "nonzero": 1, "masked_select": 1, "unique": 1,
    "_unique": 1, "_unique2": 1, "unique_dim": 1, "unique_consecutive": 1, "bincount": 2,
}
_HERE = os.path.abspath(__file__).replace(os.sep, "/")
_HOST_SIDE = ("torch/optim/",)
"""Frames whose scalar reads are of host tensors on CUDA too (AdamW's step counters)."""


@dataclass
class SyncCount:
    """Host syncs by call site (``path:line``) and by kind (op name)."""

    sites: collections.Counter = field(default_factory=collections.Counter)
    kinds: collections.Counter = field(default_factory=collections.Counter)
    host_side: collections.Counter = field(default_factory=collections.Counter)

    @property
    def total(self) -> int:
        return sum(self.sites.values())

    def by_source(self, sources: dict[str, tuple[str, ...]]) -> dict[str, int]:
        """Totals per named source, a site belonging to the first source any of whose path
        prefixes it starts with; sites matching none go to ``other``."""
        out = dict.fromkeys([*sources, "other"], 0)
        for site, n in self.sites.items():
            name = next((s for s, prefixes in sources.items()
                         if any(site.startswith(p) for p in prefixes)), "other")
            out[name] += n
        return out

    def add(self, kind: str, n: int) -> None:
        site = _site()
        (self.host_side if site.startswith(_HOST_SIDE) else self.sites)[site] += n
        self.kinds[kind] += n


def _site() -> str:
    """``path:line`` of the innermost caller outside torch (torch.optim counts as a caller),
    the path from its package (``moe_core/...``, ``deepspeed/...``)."""
    for fr in reversed(traceback.extract_stack()[:-3]):
        path = fr.filename.replace(os.sep, "/")
        if "/torch/" in path and "/torch/optim/" not in path:
            continue
        if path == _HERE:
            continue
        if "site-packages/" in path:
            path = path.split("site-packages/", 1)[1]
        else:  # from the outermost project folder: tests/moe_core/..., not moe_core/...
            hits = [(path.find(f"/{r}"), r) for r in ("moe_core/", "sweeps/", "bench/", "tests/")
                    if f"/{r}" in path]
            if hits:
                i, root = min(hits)
                path = path[i + 1:]
        return f"{path}:{fr.lineno}"
    return "?"


def _data_dependent(func: Any, args: tuple, kwargs: dict[str, Any]) -> str | None:
    name = func._schema.name.split("::")[-1]
    if name in _SYNC_OPS:
        return name
    if name == "repeat_interleave" and kwargs.get("output_size") is None and \
            func._overloadname in ("Tensor", "self_Tensor"):
        return name
    if name in ("index", "index_put", "index_put_") and len(args) > 1 and any(
            isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
            for i in args[1]):
        return f"{name}[bool mask]"
    return None


class _Mode(TorchDispatchMode):
    def __init__(self, count: SyncCount):
        super().__init__()
        self.count = count

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: D105
        kwargs = kwargs or {}
        kind = _data_dependent(func, args, kwargs)
        if kind is not None:
            self.count.add(kind, _SYNC_OPS.get(kind, 1))
        return func(*args, **kwargs)


@contextlib.contextmanager
def count_host_syncs() -> Iterator[SyncCount]:
    """``with count_host_syncs() as c: ...``: ``c`` holds the reads made inside."""
    count = SyncCount()
    wrapped = {n: getattr(torch.Tensor, n) for n in ("tolist", "numpy")}

    def wrap(name: str, orig: Any) -> Any:
        def f(self: torch.Tensor, *a: Any, **k: Any) -> Any:
            count.add(name, 1)
            return orig(self, *a, **k)
        return f

    for n, orig in wrapped.items():
        setattr(torch.Tensor, n, wrap(n, orig))
    try:
        with _Mode(count):
            yield count
    finally:
        for n, orig in wrapped.items():
            setattr(torch.Tensor, n, orig)

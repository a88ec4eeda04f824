"""Which kernel computes the experts (``moe.experts_kernel``): torch's grouped path or
liger-kernel's fused MoE, and for ``auto`` the one measured faster at the nearest measured shape.

The measurements live in ``kernel_choice.json`` next to this module, written only by
``bench/moe_experts.py --record`` / ``--merge`` from a GPU run (``bench/gpu_session.sh`` step
``experts``), never by hand. Each entry is one shape timed on one device class::

    {"device": "H100", "device_name": "NVIDIA H100 80GB HBM3", "dtype": "bfloat16",
     "E": 64, "K": 8, "d": 2048, "f": 1024, "tokens": 16384,
     "grouped_s": 0.0123, "liger_s": 0.0101, "choice": "liger", "date": "2026-11-25"}

``device`` is a device-class pattern: a word of the CUDA device's name (``H100`` matches
"NVIDIA H100 80GB HBM3" and "NVIDIA H100 PCIe"), or ``cuda`` for any CUDA device. Nothing in
this module imports torch: :func:`choose` and :func:`pick` are pure functions of their
arguments and the table.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from moe_core.errors import ConfigError
from moe_core.fsio import atomic_write_text

TABLE = Path(__file__).with_name("kernel_choice.json")
KERNELS = ("grouped", "liger")
SHAPE_KEYS = ("E", "K", "d", "f")
ENTRY_KEYS = ("device", "dtype", *SHAPE_KEYS, "grouped_s", "liger_s", "choice", "date")
MAX_RATIO = 2.0
"""A measured shape stands for a layer's shape only when each of E, K, d and f lies within
this factor of it; further away, ``auto`` takes ``grouped``."""


def device_class(name: str) -> str:
    """The class pattern of a CUDA device name: its model word (``NVIDIA H100 80GB HBM3`` ->
    ``H100``, ``NVIDIA A100-SXM4-80GB`` -> ``A100``, ``NVIDIA L40S`` -> ``L40S``), else the
    whole name."""
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", name.upper())
    return m.group(1) if m else name


def matches(pattern: str, device_name: str) -> bool:
    """Whether an entry's ``device`` pattern covers a CUDA device: ``cuda`` covers all, else
    the pattern must be a whole word (or words) of the name, case-insensitively."""
    if pattern.lower() == "cuda":
        return True
    return re.search(rf"(?<![A-Z0-9]){re.escape(pattern.upper())}(?![A-Z0-9])",
                     device_name.upper()) is not None


def shape_distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """Sum over E, K, d, f of |log2(a/b)|: 0 for the same shape, 1 per doubling."""
    return sum(abs(math.log2(a[k] / b[k])) for k in SHAPE_KEYS)


def _near(a: Mapping[str, Any], b: Mapping[str, Any], max_ratio: float) -> bool:
    return all(max(a[k], b[k]) <= max_ratio * min(a[k], b[k]) for k in SHAPE_KEYS)


def choose(entries: Iterable[Mapping[str, Any]], *, device_name: str, dtype: str, E: int,
           K: int, d: int, f: int, max_ratio: float = MAX_RATIO) -> str:
    """``liger`` or ``grouped`` for a layer of shape (E, K, d, f) in ``dtype`` on the CUDA
    device ``device_name``: the entry's ``choice`` (the kernel measured faster) at the nearest
    measured shape (:func:`shape_distance`) among the entries of that dtype whose device
    pattern names this device's class, or failing those, the ``cuda`` entries; ``grouped``
    where no such entry lies within ``max_ratio`` in every dimension. A tie in distance goes
    to ``grouped``."""
    shape = {"E": E, "K": K, "d": d, "f": f}
    same_dtype = [e for e in entries if e["dtype"] == dtype and matches(e["device"], device_name)]
    named = [e for e in same_dtype if e["device"].lower() != "cuda"]
    for pool in (named, same_dtype):
        near = [e for e in pool if _near(e, shape, max_ratio)]
        if near:
            best = min(near, key=lambda e: (shape_distance(e, shape), e["choice"] != "grouped"))
            return best["choice"]
    return "grouped"


def _entry_problem(e: Any) -> str | None:
    if not isinstance(e, dict):
        return "is not a mapping"
    missing = [k for k in ENTRY_KEYS if k not in e]
    if missing:
        return f"lacks {', '.join(missing)}"
    if e["choice"] not in KERNELS:
        return f"has choice {e['choice']!r}; use grouped or liger"
    if any(not isinstance(e[k], int) or e[k] < 1 for k in SHAPE_KEYS):
        return "needs E, K, d and f as integers >= 1"
    times = (e["grouped_s"], e["liger_s"])
    if any(not isinstance(t, (int, float)) or not t > 0 for t in times):
        return "needs grouped_s and liger_s as times > 0"
    if e["choice"] != ("liger" if e["liger_s"] < e["grouped_s"] else "grouped"):
        return "has a choice that is not the faster of grouped_s and liger_s"
    return None


def load_table(path: str | Path = TABLE) -> list[dict[str, Any]]:
    """The entries of a kernel-choice table (checked: one-line errors naming the file)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: cannot read the kernel-choice table ({e})") from None
    entries = doc.get("entries") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: needs an object with a list 'entries'")
    for i, e in enumerate(entries):
        problem = _entry_problem(e)
        if problem:
            raise ConfigError(f"{path}: entry {i} {problem}; rewrite it with "
                              "bench/moe_experts.py --record")
    return entries


def entry_key(e: Mapping[str, Any]) -> tuple:
    return (e["device"].upper(), e["dtype"], *(e[k] for k in SHAPE_KEYS))


def merge(entries: Iterable[Mapping[str, Any]],
          new: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``entries`` with ``new`` added; a new entry replaces one of the same device, dtype and
    shape. Sorted by device, dtype and shape."""
    out = {entry_key(e): dict(e) for e in entries}
    for e in new:
        problem = _entry_problem(e)
        if problem:
            raise ConfigError(f"a measured entry {problem}: {dict(e)}")
        out[entry_key(e)] = dict(e)
    return [out[k] for k in sorted(out)]


def write_table(path: str | Path, entries: list[dict[str, Any]]) -> None:
    """Rewrite a table atomically (``bench/moe_experts.py`` only)."""
    doc = {"about": "Measured expert-kernel times per shape and device class: written by "
                    "bench/moe_experts.py --record/--merge, read by moe.experts_kernel: auto "
                    "(moe_core.moe.kernel_choice).", "entries": entries}
    atomic_write_text(Path(path), json.dumps(doc, indent=1) + "\n")


def liger_available() -> bool:
    """Whether liger-kernel and triton are installed (the ``gpu`` extra); nothing is imported."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("liger_kernel", "triton"))


def pick(setting: str, *, device_type: str, device_name: str, dtype: str, E: int, K: int,
         d: int, f: int, ep_size: int = 1,
         entries: Iterable[Mapping[str, Any]] | None = None) -> str:
    """The kernel a layer runs, ``grouped`` or ``liger``, for ``moe.experts_kernel``:
    ``grouped`` as it says; ``liger`` as it says, or a one-line ConfigError where it cannot
    run (no liger-kernel/triton; no CUDA device and no Triton interpreter,
    ``TRITON_INTERPRET=1``; expert parallelism); ``auto`` by :func:`choose` on a CUDA device
    with liger-kernel installed and one expert rank, else ``grouped``. ``entries``: the table
    (default: :data:`TABLE`, read only when ``auto`` needs it)."""
    if setting == "grouped":
        return "grouped"
    if setting == "liger":
        runs_here = device_type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
        if not liger_available() or not runs_here:
            raise ConfigError(
                "moe.experts_kernel=liger needs liger-kernel and triton (pip install -e "
                f"'.[gpu]') and a CUDA device (this run is on {device_type}); set "
                "moe.experts_kernel: auto")
        if ep_size > 1:
            raise ConfigError(
                f"moe.experts_kernel=liger does not run with expert parallelism ({ep_size} "
                "expert ranks); set moe.experts_kernel: auto or optim.expert_parallel: 1")
        return "liger"
    if device_type != "cuda" or ep_size > 1 or not liger_available():
        return "grouped"
    table = load_table() if entries is None else entries
    return choose(table, device_name=device_name, dtype=dtype, E=E, K=K, d=d, f=f)

"""Where a result came from: the code, the libraries that computed it and the device.

:func:`provenance` builds one record, kept in ``summary.json``, the results Parquet's schema
metadata and every W&B run's config (docs/results-and-export.md); ``python -m sweeps.run.verify``
compares a rerun's with it. No torch or Ray import (versions come from the installed
distributions' metadata, the device from ``/proc``, or torch when it is already imported), so
``--dry-run`` stays light. It describes the calling process: the sweep's driver.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

PACKAGES = ("torch", "deepspeed", "ray", "transformers", "pyarrow")
"""The libraries whose versions a result records (besides Python's)."""
DISTRIBUTION = "upcycle-sweeps"
ROOT = Path(__file__).resolve().parents[2]
"""The folder the running code is imported from (a git checkout, or site-packages)."""
KEYS = ("code", "python", "packages", "device")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                             timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def code_version() -> dict[str, Any]:
    """``{"commit", "dirty", "version"}``: the git commit of the imported code and whether
    its tracked files differ from it (untracked files are not counted), when the code is a git
    checkout; else commit and dirty are None (installed from a wheel). ``version`` is the
    installed distribution's, or None."""
    top = _git("rev-parse", "--show-toplevel")
    commit = _git("rev-parse", "HEAD") if top and Path(top).resolve() == ROOT else None
    dirty = None
    if commit:
        status = _git("status", "--porcelain", "--untracked-files=no")
        dirty = None if status is None else bool(status)
    return {"commit": commit, "dirty": dirty, "version": _version(DISTRIBUTION)}


def _version(name: str) -> str | None:
    """The installed distribution's version (None when it is not installed)."""
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


_ISA = ("avx512f", "avx2", "avx", "sse4_2")
"""Widest vector extension named in a CPU's record: what BLAS and torch pick their kernels by."""


def _cpu_model() -> str:
    """``AMD EPYC (family 25 model 17, avx512f)``: the model name, which a virtual machine may
    shorten, with the CPUID family and model and the widest vector extension (Linux); the
    processor string elsewhere."""
    try:
        fields: dict[str, str] = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            k, _, v = line.partition(":")
            if not k.strip():
                break  # the first processor's record is enough
            fields.setdefault(k.strip(), v.strip())
    except OSError:
        fields = {}
    if "model name" not in fields:
        return platform.processor() or platform.machine()
    flags = set(fields.get("flags", "").split())
    isa = next((f for f in _ISA if f in flags), "no avx")
    return (f"{fields['model name']} (family {fields.get('cpu family', '?')} model "
            f"{fields.get('model', '?')}, {isa})")


def _gpus() -> list[str]:
    torch = sys.modules.get("torch")  # only when the caller has imported it already
    if torch is not None and torch.cuda.is_available():
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    names = []
    base = Path("/proc/driver/nvidia/gpus")
    for info in sorted(base.glob("*/information")) if base.is_dir() else []:
        for line in info.read_text().splitlines():
            if line.startswith("Model:"):
                names.append(line.split(":", 1)[1].strip())
    return names


def device_info() -> dict[str, Any]:
    """``{"cpu", "cpus", "gpu", "gpus"}``: CPU model and the cores this process may use, GPU
    name (the first; None without one) and count."""
    gpus = _gpus()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": _cpu_model(), "cpus": cpus, "gpu": gpus[0] if gpus else None,
            "gpus": len(gpus)}


@functools.cache
def provenance() -> dict[str, Any]:
    """The record (:data:`KEYS`): code, Python version, :data:`PACKAGES`' versions, device.
    Built once per process; treat it as read-only."""
    return {"code": code_version(), "python": platform.python_version(),
            "packages": {n: _version(n) for n in PACKAGES}, "device": device_info()}


def describe(p: dict[str, Any] | None) -> str:
    """One line: ``code 3c9aac6 (dirty) · Python 3.11.14 · torch 2.13.0 ... · AMD EPYC × 2``."""
    if not p:
        return "not recorded (written before provenance was kept)"
    c = p.get("code") or {}
    code = (f"code {str(c['commit'])[:12]}{' (dirty)' if c.get('dirty') else ''}"
            if c.get("commit") else f"{DISTRIBUTION} {c.get('version') or '?'} (no git)")
    pk = " ".join(f"{k} {v or '—'}" for k, v in (p.get("packages") or {}).items())
    d = p.get("device") or {}
    dev = f"{d.get('cpu')} × {d.get('cpus')} cores"
    if d.get("gpus"):
        dev += f", {d['gpus']} × {d.get('gpu')}"
    return f"{code} · Python {p.get('python')} · {pk} · {dev}"


def differences(recorded: dict[str, Any] | None, now: dict[str, Any]) -> list[str]:
    """What differs between two records, one phrase each (``torch 2.12.0 → 2.13.0``); [] when
    code, versions and device are the same (a dirty tree never counts as the same code)."""
    if not recorded:
        return ["no provenance recorded"]
    out = []
    rc, nc = recorded.get("code") or {}, now.get("code") or {}
    if rc.get("commit") != nc.get("commit") or rc.get("version") != nc.get("version"):
        out.append(f"code {rc.get('commit') or rc.get('version')} → "
                   f"{nc.get('commit') or nc.get('version')}")
    elif rc.get("dirty") or nc.get("dirty"):
        out.append("code: a dirty tree (uncommitted changes) on "
                   + ("both sides" if rc.get("dirty") and nc.get("dirty") else
                      "the recorded side" if rc.get("dirty") else "this side"))
    if recorded.get("python") != now.get("python"):
        out.append(f"Python {recorded.get('python')} → {now.get('python')}")
    rp, np_ = recorded.get("packages") or {}, now.get("packages") or {}
    out += [f"{k} {rp.get(k)} → {np_.get(k)}" for k in sorted(set(rp) | set(np_))
            if rp.get(k) != np_.get(k)]
    rd, nd = recorded.get("device") or {}, now.get("device") or {}
    out += [f"device {k} {rd.get(k)} → {nd.get(k)}" for k in ("cpu", "cpus", "gpu", "gpus")
            if rd.get(k) != nd.get(k)]
    return out

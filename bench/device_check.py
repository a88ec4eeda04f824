"""The GPU session's first step (≤ 30 s on a device): import every package the session needs and
run one optimizer step of a tiny E8 top-2 model on the DeepSpeed engine, naming the package that
fails. The device has torch 2.11 while everything else here is tested on 2.13 (no CPU wheel of
2.11 is on PyPI: its 530 MB wheel is the CUDA build), so this is where a version gap shows first.

    python bench/device_check.py
Ends with one JSON line (``ok``, the versions, ``failed``: {package: error}); exit 1 when a
required package or the step fails.
"""

from __future__ import annotations

import importlib
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

REQUIRED = ("torch", "numpy", "pyarrow", "deepspeed", "ray", "pydantic", "optuna")
OPTIONAL = ("triton", "liger_kernel", "transformers")
ROOT = Path(__file__).resolve().parents[1]


def package_of(exc: BaseException) -> str:
    """The top-level package of the innermost traceback frame outside the standard library:
    the failing package (``upcycle-sweeps`` for this project's own code)."""
    for fr in reversed(traceback.extract_tb(exc.__traceback__)):
        parts = Path(fr.filename).parts
        for marker in ("site-packages", "dist-packages"):
            if marker in parts and parts.index(marker) + 1 < len(parts):
                return parts[parts.index(marker) + 1].removesuffix(".py")
        if Path(fr.filename).is_relative_to(ROOT):
            return "upcycle-sweeps"
    return type(exc).__module__.split(".")[0] or "python"


def one_step() -> dict:
    import torch

    from moe_core.train import Trainer, train_config_from_dict

    with tempfile.TemporaryDirectory() as tmp:
        cfg = {"model": {"preset": "debug"},
               "data": {"source": "synthetic", "synthetic_vocab": 64, "synthetic_tokens": 40000,
                        "seq_len": 64, "cache_dir": tmp},
               "batch": {"global_batch": 4, "micro_batch": 4}, "tokens": 4 * 64 * 2,
               "schedule": {"kind": "constant", "warmup_steps": 0},
               "eval": {"every_steps": 10**6, "batches": 1}}
        dense = Trainer(train_config_from_dict(cfg))
        moe = Trainer(train_config_from_dict(
            {**cfg, "moe": {"num_experts": 8, "top_k": 2}, "parent": {"tokens": 512},
             "upcycle": {"method": "dense_to_moe"}}), parent=dense.parent_state())
        t = time.perf_counter()
        moe.step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return {"step_s": round(time.perf_counter() - t, 3),
                "dtype": str(next(moe.model.parameters()).dtype).replace("torch.", "")}


def main() -> int:
    t0 = time.perf_counter()
    out: dict = {"bench": "device_check", "python": sys.version.split()[0], "failed": {}}
    for m in REQUIRED + OPTIONAL:
        try:
            out[m] = getattr(importlib.import_module(m), "__version__", "?")
        except Exception as e:  # noqa: BLE001 - any failure to import is the finding
            out[m] = "missing"
            if m in REQUIRED:
                out["failed"][package_of(e) if not isinstance(e, ModuleNotFoundError)
                              else m] = f"import {m}: {type(e).__name__}: {e}"[:300]
    if "torch" not in out["failed"]:
        import torch

        cuda = torch.cuda.is_available()
        out.update(cuda=torch.version.cuda, grouped_mm=hasattr(torch, "_grouped_mm"),
                   device_name=torch.cuda.get_device_name(0) if cuda else "cpu")
        try:
            out["step"] = one_step()
        except Exception as e:  # noqa: BLE001 - name the package the step broke in
            out["failed"][package_of(e)] = f"one E8 step: {type(e).__name__}: {e}"[:300]
    out["ok"] = not out["failed"]
    out["seconds"] = round(time.perf_counter() - t0, 1)
    for pkg, err in out["failed"].items():
        print(f"device_check: FAILED in package {pkg}: {err}", flush=True)
    print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

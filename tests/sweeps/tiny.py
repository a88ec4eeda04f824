"""What the sweep-level tests share: the tiny sweep base (the debug model on synthetic tokens,
8 steps of 8 × 32 tokens, an eval every 2 steps: steps 0, 2, 4, 6, 8) and running a spec through
``python -m sweeps.run`` in its own process."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import yaml

TINY_BASE: dict[str, Any] = {
    "model": {"preset": "debug"},
    "data": {"source": "synthetic", "synthetic_vocab": 32, "synthetic_tokens": 60000,
             "seq_len": 32},
    "batch": {"global_batch": 8, "micro_batch": 8},
    "optim": {"lr": 3e-3},
    "schedule": {"kind": "wsd", "warmup_steps": 2},
    "eval": {"every_steps": 2, "batches": 2},
    "tokens": 2048,
}


def tiny_base(**over: Any) -> dict[str, Any]:
    """A fresh copy of ``TINY_BASE`` with top-level keys replaced by ``over``."""
    return {**copy.deepcopy(TINY_BASE), **copy.deepcopy(over)}


def run_sweep_cli(tmp_path: Path, name: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Run ``spec`` as sweep ``name`` (results under ``tmp_path/r``, parents cached under
    ``tmp_path/cache``, W&B off) with ``python -m sweeps.run``; its rows."""
    f = tmp_path / f"{name}.yaml"
    f.write_text(yaml.safe_dump(dict(spec, sweep=name, results=str(tmp_path / "r"))))
    env = dict(os.environ, WANDB_MODE="disabled", UPCYCLE_CACHE=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-m", "sweeps.run", str(f)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return pq.read_table(tmp_path / "r" / name / "results.parquet").to_pylist()

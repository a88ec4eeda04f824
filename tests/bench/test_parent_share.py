"""``bench/parent_share.py`` at a tiny size: it resolves ``resources.gpus: auto`` against its own
Ray (as the driver does), trains the one shared parent once and hands it to every task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.distributed
def test_parent_share_runs_at_tiny_size(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    env.pop("RAY_ADDRESS", None)
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "parent_share.py"), "--trials", "2",
                          "--preset", "debug", "--repeats", "1", "--work", str(tmp_path)],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    row = json.loads(res.stdout.strip().splitlines()[-1])
    assert row["bench"] == "parent_share" and row["trials"] == 2
    assert row["parent_trainings"] == row["distinct_parents"] == 1
    assert row["store_s"] > 0 and row["disk_s"] > 0

"""``bench/gpu_session.sh --rehearse``: every step of the GPU session, at a tiny size on the CPU,
runs to the end and writes its JSON, so a broken script is caught before a GPU is spent on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = {"env", "tier", "tier_sweep", "layer", "head", "mfu_dense", "mfu_moe", "step64", "core",
         "sweep", "compile", "profile", "experts"}


def _json(out: Path, name: str) -> dict:
    return json.loads((out / f"{name}.json").read_text())


@pytest.mark.slow
def test_the_rehearsal_runs_every_step(tmp_path):
    """Not marked ``distributed``: of its minute or so, one step runs a two-trial sweep on a
    local Ray of its own (free ports, its own session folder); the rest are one-process steps.
    Outside the groups of ``distributed`` tests (tests/conftest.py), it goes to whichever worker
    is free first."""
    out = tmp_path / "out"
    env = dict(os.environ, PY=sys.executable, OMP_NUM_THREADS="1")  # TMPDIR as is: Ray's
    # socket paths must stay short
    env.pop("RAY_ADDRESS", None)
    res = subprocess.run(["bash", str(ROOT / "bench" / "gpu_session.sh"), "--rehearse", "--out",
                          str(out)], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    steps = summary["steps"]
    assert set(steps) == STEPS
    bad = {k: v for k, v in steps.items() if v["exit"] != 0 or v["timed_out"]}
    assert not bad, {k: (out / f"{k}.log").read_text()[-1500:] for k in bad}
    for name in ("tier", "core"):
        t = _json(out, name)["tests"]
        assert t["passed"] > 0 and t["failed"] == [], name
    # collected only (the sweep step runs a sweep)
    assert "test_two_trial_sweep_on_one_gpu" in (out / "tier_sweep.log").read_text()
    env_row = _json(out, "env")["result"]
    assert env_row["device"] == "cpu" and env_row["sdpa_ms_fwd_bwd"]["MATH"] > 0
    sweep = _json(out, "sweep")["result"]
    assert sweep["trials"] == sweep["ok"] == 2
    assert json.loads((out / "smi_sweep.json").read_text()) == {
        "nvidia_smi": "absent or no samples"}
    assert set(summary["best_mfu"]) == {"debug-dense", "debug-E8top2"}
    assert summary["layer"]["ours_vs_dense_active"] > 0
    assert {r["moe"] for r in summary["compile"]} == {False, True}
    assert all(r["compile.graphs"] > 0 for r in summary["compile"])
    assert summary["head"]["chunked_vs_plain_time"] > 0
    assert abs(sum(summary["profile_shares"].values()) - 1) < 1e-3
    assert summary["e8_micro64"] == "ran"
    experts = summary["experts"]  # Liger under the interpreter: equal maths, nothing recorded
    assert max(experts["check_rel_err"].values()) < 1e-5
    assert [r["choice"] for r in experts["per_shape"]] == ["grouped"]
    assert isinstance(experts["per_shape"][0]["liger_s"], float)
    assert experts["recorded"]["new"] == 0
    assert json.loads((out / "kernel_choice.json").read_text())["entries"] == []

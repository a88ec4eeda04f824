"""A tiny end-to-end sweep on local Ray (CPU): a planted collapsing trial (no balancing loss, a
skewed router init) is pruned by the max_load_fraction rule while the healthy ones finish, with
ASHA as the scheduler next to the health stopper."""

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import yaml

from tests.sweeps.tiny import tiny_base

HEALTHY = [{"order": "softmax_topk", "aux_coef": 1.0e-2},
           {"order": "softmax_topk", "aux_coef": 1.0e-1}]
PLANTED = {"order": "softmax_topk", "aux_coef": 0.0, "init_std": 1.0}
SPEC = {
    "sweep": "prune_e2e",
    "base": tiny_base(moe={"num_experts": 4, "top_k": 1, "router": HEALTHY[0]}),
    "search": {"moe.router": {"grid": [*HEALTHY, PLANTED]}},
    # ASHA's only rung is the last eval: it composes with the stopper without pruning anyone
    "scheduler": {"kind": "asha", "grace_period": 5, "reduction_factor": 2},
    "prune": {"max_load_fraction": {"above": 0.75, "for_evals": 2}},
    "logging": {"wandb": {"mode": "disabled"}},
    "checkpoint": {"every_minutes": None, "at_end": False},
}


@pytest.mark.slow
@pytest.mark.distributed
def test_planted_collapsing_trial_is_pruned_for_the_right_reason(tmp_path):
    spec = dict(SPEC, results=str(tmp_path / "results"))
    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump(spec))
    env = dict(os.environ, WANDB_MODE="disabled", UPCYCLE_CACHE=str(tmp_path / "cache"))
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-m", "sweeps.run", str(f), "--json"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    res = tmp_path / "results" / "prune_e2e"
    rows = pq.read_table(res / "results.parquet").to_pylist()
    by_trial: dict = {}
    for r in rows:
        by_trial.setdefault(r["trial_id"], []).append(r)
    assert len(by_trial) == 3
    planted = [t for t, rs in by_trial.items()
               if json.loads(rs[0]["knob.moe.router"])["aux_coef"] == 0.0]
    assert len(planted) == 1
    for t, rs in by_trial.items():
        rs.sort(key=lambda r: r["step"])
        if t in planted:
            # collapsed: router.max_load above 0.75 at steps 2 and 4 -> pruned at step 4, its
            # curve so far kept
            assert [r["step"] for r in rs] == [0, 2, 4]
            assert {r["status"] for r in rs} == {"pruned"}
            last = rs[-1]
            assert (last["prune_rule"], last["prune_metric"], last["prune_step"]) == (
                "max_load_fraction", "router.max_load", 4)
            assert last["prune_value"] == last["router.max_load"] > 0.75
            assert rs[-2]["router.max_load"] > 0.75
            assert last["reason"].startswith("pruned by max_load_fraction: router.max_load")
        else:
            assert [r["step"] for r in rs] == [0, 2, 4, 6, 8]
            assert {r["status"] for r in rs} == {"ok"}
            assert all(r["prune_rule"] is None for r in rs)
            assert max(r["router.max_load"] for r in rs) < 0.75
    summary = json.loads((res / "summary.json").read_text())
    assert (summary["ok"], summary["failed"], summary["pruned"], summary["complete"]) == (
        2, 0, 1, True)

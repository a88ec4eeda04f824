"""Token-budget grids run as WSD decay branches of one shared stable run, with results equal
(bit for bit on CPU) to training each budget on its own."""

import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import yaml

from sweeps.branches import plan_branches, stable_tokens_saved
from sweeps.spec import parse_spec

SPEC = {
    "sweep": "dgrid",
    "base": {
        "model": {"preset": "debug"},
        "moe": {"num_experts": 4, "top_k": 2},
        "data": {"source": "synthetic", "synthetic_vocab": 32, "synthetic_tokens": 60000,
                 "seq_len": 32},
        "batch": {"global_batch": 8, "micro_batch": 8},
        "optim": {"lr": 3e-3},
        "schedule": {"kind": "wsd", "warmup_steps": 2, "decay_frac": 0.25},
        # every 3 steps: budgets of 4 and 8 steps end between periodic evals (their final
        # eval must still be reported), the 4-step budget's decay starts after the last one
        "eval": {"every_steps": 3, "batches": 2},
        "tokens": 2048,
    },
    "search": {"tokens": {"grid": [1024, 1536, 2048]}},
    "logging": {"wandb": {"enabled": False}},
}


def test_plan_groups_budgets():
    spec = parse_spec(SPEC)
    groups = plan_branches(spec)
    assert len(groups) == 1
    g = next(iter(groups.values()))
    # T = 4, 6, 8 steps; decay = round(0.25·T) = 1, 2, 2 → decay starts 3, 4, 6
    assert g["starts"] == {1024: 3, 1536: 4, 2048: 6}
    assert stable_tokens_saved(spec, groups) == (3 + 4) * 256
    off = parse_spec(dict(SPEC, wsd_branches=False))
    assert plan_branches(off) == {}


def _run(tmp_path, name, branches):
    spec = dict(SPEC, sweep=name, wsd_branches=branches, results=str(tmp_path / "r"))
    f = tmp_path / f"{name}.yaml"
    f.write_text(yaml.safe_dump(spec))
    env = dict(os.environ, WANDB_MODE="disabled", UPCYCLE_CACHE=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-m", "sweeps.run", str(f)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return pq.read_table(tmp_path / "r" / name / "results.parquet").to_pylist()


@pytest.mark.slow
@pytest.mark.distributed
def test_branches_equal_separate_runs(tmp_path):
    br = _run(tmp_path, "with", True)
    sep = _run(tmp_path, "without", False)

    def curves(rows):
        out = {}
        for r in rows:
            out.setdefault(r["tokens_budget"], {})[r["step"]] = r["val_loss"]
        return out

    cb, cs = curves(br), curves(sep)
    assert set(cb) == set(cs) == {1024, 1536, 2048}
    for c in (cb, cs):  # every trial reports its final eval, at its last step
        assert {b: max(c[b]) for b in c} == {1024: 4, 1536: 6, 2048: 8}
        assert sorted(c[1024]) == [0, 3, 4] and sorted(c[2048]) == [0, 3, 6, 8]
    for budget in cs:
        assert cb[budget].keys() == cs[budget].keys()
        for step in cs[budget]:
            assert cb[budget][step] == cs[budget][step], (budget, step)
    assert (tmp_path / "r" / "with" / "stable").is_dir()
    assert {r.get("branch_from_step") for r in br if r["tokens_budget"] == 2048} == {6}

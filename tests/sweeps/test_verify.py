"""``python -m sweeps.run.verify``: re-train sampled trials from what the results record and say,
per trial, "bit-exact" or the difference; with a differing provenance, judged within a stated
tolerance instead."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

from moe_core.train import Trainer, train_config_from_dict
from moe_core.train.callbacks import FunctionCallback
from sweeps.run import verify as vf
from sweeps.store.provenance import provenance
from sweeps.store.results import config_columns, read_rows, write_rows
from sweeps.store.sink import ResultsSink
from tests.sweeps.tiny import run_sweep_cli, tiny_base


def _record(res, tmp_path):
    """A finished trial's rows as a sweep writes them (config columns, its curve), trained
    here; the provenance recorded is this process's, as from a clean checkout."""
    cfg = train_config_from_dict({**tiny_base(moe={"num_experts": 4, "top_k": 2}),
                                  "tokens": 1024, "name": "t"})
    curve = []
    Trainer(cfg, callbacks=(FunctionCallback(on_eval=curve.append),)).fit()
    static = {"sweep": "v", "trial_id": "t0", "parent_key": "", "seed": cfg.seed, "ranks": 1,
              **config_columns(cfg.to_dict())}
    sink = ResultsSink(res, flush_s=1e9)
    for m in curve:
        sink.add({**static, **{k: v for k, v in m.items() if not isinstance(v, (list, dict))},
                  "status": "running"})
    sink.mark("t0", "ok")
    sink.close()
    clean = copy.deepcopy(provenance())
    clean["code"]["dirty"] = False
    (res / "summary.json").write_text(json.dumps({"provenance": clean}))
    return clean


def test_the_same_provenance_reruns_bit_exact_and_a_planted_change_is_caught(tmp_path):
    res = tmp_path / "res"
    clean = _record(res, tmp_path)
    out = vf.verify(res, trials=3, now=clean)
    assert out["differences"] == [] and out["rtol"] is None and out["ok"]
    (v,) = out["verdicts"]
    assert v.line(None) == "t0: bit-exact (3 evals)"  # steps 0, 2, 4
    # one recorded loss off by 1e-12 relative: not bit-exact, and no tolerance excuses it
    rows = read_rows(res)
    rows[-1]["val_loss"] *= 1 + 1e-12
    write_rows(res / "results.parquet", rows)
    out = vf.verify(res, now=clean)
    (v,) = out["verdicts"]
    assert not out["ok"] and v.step == 4 and v.max_rel == pytest.approx(1e-12, rel=1e-3)
    assert v.line(None).startswith("t0: differs, max relative 1e-12 at step 4")
    # another torch: the difference is named and judged within the stated tolerance
    other = copy.deepcopy(clean)
    other["packages"]["torch"] = "0.0.0"
    out = vf.verify(res, now=other)
    assert out["differences"] == [f"torch {clean['packages']['torch']} → 0.0.0"]
    assert out["rtol"] == vf.RTOL and out["ok"]
    assert "within rtol 0.01" in out["verdicts"][0].line(out["rtol"])


def test_a_row_that_does_not_rebuild_its_config_is_refused():
    row = {"trial_id": "t", "seed": 0, "tokens_budget": 1024, "model.preset": "debug",
           "optim.lr": 3e-3, "moe": None, "optim.betas": "[0.9, 0.95]", "batch.micro_batch": 8,
           "batch.global_batch": 8}
    assert vf.trial_config(row).optim.lr == 3e-3
    # text the config reads as a number (a hand-edited file): rebuilt, it is not what was recorded
    with pytest.raises(vf.UpcycleError, match=r"config column optim.lr is '3e-3' in the results "
                                              r"but rebuilds as 0.003"):
        vf.trial_config({**row, "optim.lr": "3e-3"})


def test_compare_names_missing_evals():
    v = vf.compare("t", {0: 1.0, 2: 0.9}, {0: 1.0})
    assert v.missing == [2] and not v.ok(1.0) and "no eval at step(s) [2]" in v.line(None)


@pytest.mark.slow
@pytest.mark.distributed
def test_verify_a_real_sweep_on_the_same_machine(tmp_path):
    """Two trials of a tiny upcycling sweep (Ray workers, a cached parent), re-trained here:
    bit-exact, whatever the tree's dirty flag says."""
    spec = {"base": tiny_base(parent={"tokens": 1024, "seed": 0},
                              moe={"num_experts": 4, "top_k": 2,
                                   "router": {"order": "topk_softmax"}},
                              upcycle={"method": "dense_to_moe"}),
            "search": {"optim.lr": {"grid": [1e-3, 3e-3]}},
            "logging": {"wandb": {"enabled": False}}}
    run_sweep_cli(tmp_path, "ver", spec)
    env = dict(os.environ, UPCYCLE_CACHE=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-m", "sweeps.run.verify", str(tmp_path / "r" / "ver"),
                          "--trials", "2"], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    lines = [ln for ln in out.stdout.splitlines() if not ln.startswith("[")]  # DeepSpeed's log
    assert lines[0].startswith("recorded: code ") and lines[1].startswith("now:      code "), \
        out.stdout
    assert sum(line.endswith("bit-exact (5 evals)") for line in lines) == 2, out.stdout

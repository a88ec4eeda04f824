"""End-to-end sweeps on local Ray (CPU): shared parent, injected failures. (The driver stopped
by a signal and resumed without rerunning its finished trials: test_reliability.py's SIGTERM
test, which takes Ctrl+C's path.)"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from sweeps.store.provenance import KEYS
from sweeps.store.results import is_static, read_provenance
from tests.sweeps.tiny import tiny_base
from tests.sweeps.wandb_files import mismatches, offline_runs

SPEC = {
    "sweep": "e2e",
    "base": tiny_base(
        parent={"tokens": 2048, "seed": 0},
        moe={"num_experts": 4, "top_k": 2, "router": {"order": "topk_softmax"}},
        upcycle={"method": "dense_to_moe"}),
    "search": {"upcycle.lr_policy": {"grid": [
        {"policy": "constant"}, {"policy": "reset", "peak": 1e-3},
        {"policy": "reset", "peak": 3e-3}, {"policy": "ratio", "ratio": 0.5}]}},
    "logging": {"wandb": {"mode": "offline"}},
    "failure": {"max_failures": 2},
    # a checkpoint at every other eval (steps 4 and 8): steps 0, 2 and 6 are reported without
    "checkpoint": {"every_evals": 2, "every_minutes": None},
}


def _write(tmp_path: Path, **over) -> Path:
    spec = dict(SPEC, results=str(tmp_path / "results"), **over)
    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump(spec))
    return f


def _env(tmp_path: Path, **extra) -> dict:
    env = dict(os.environ, WANDB_MODE="offline", UPCYCLE_CACHE=str(tmp_path / "cache"),
               RAY_DEDUP_LOGS="1", **extra)
    env.pop("RAY_ADDRESS", None)
    return env


def _rows(tmp_path: Path) -> list[dict]:
    return pq.read_table(tmp_path / "results" / "e2e" / "results.parquet").to_pylist()


TWO_POLICIES = {"upcycle.lr_policy": {"grid": [{"policy": "constant"},
                                               {"policy": "ratio", "ratio": 0.5}]}}
"""Two of SPEC's four trials (constant and ratio; test_preemption_notice's sweep runs the two
resets): two trials at once share the parent and each fails once as four did, at half the CPU."""


@pytest.mark.slow
@pytest.mark.distributed
def test_sweep_shares_one_parent_and_survives_trial_failures(tmp_path):
    spec = _write(tmp_path, search=TWO_POLICIES)
    out = subprocess.run(
        [sys.executable, "-m", "sweeps.run", str(spec), "--json"],
        env=_env(tmp_path, UPCYCLE_SWEEPS_FAIL_ONCE_AFTER="3"), capture_output=True, text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = _rows(tmp_path)
    trials = sorted({r["trial_id"] for r in rows})
    assert len(trials) == 2
    for t in trials:
        mine = sorted(r["step"] for r in rows if r["trial_id"] == t)
        # every trial raised once after its 3rd report (step 4, the first with a checkpoint)
        # and was restored from that checkpoint: its curve is still complete, no step twice
        assert mine == [0, 2, 4, 6, 8], (t, mine)
        walls = [r["wall_s"] for r in sorted((r for r in rows if r["trial_id"] == t),
                                             key=lambda r: r["step"])]
        assert walls == sorted(walls), (t, walls)  # the resumed run continues the clock
        assert {r["status"] for r in rows if r["trial_id"] == t} == {"ok"}
    assert len({r["parent_key"] for r in rows}) == 1
    parents = [p for p in (tmp_path / "results" / "e2e" / "parents").iterdir()
               if p.is_dir() and not p.name.startswith(".")]  # .setup: the trials' set-up boards
    assert len(parents) == 1  # trained once for both trials
    # the offline W&B runs, read back with wandb's own reader, are the Parquet's rows: knobs,
    # effective values and static columns as config, every metric at each eval (per-layer
    # health under health/layer<i>/<stat>), one group for the sweep
    runs = offline_runs(tmp_path / "results" / "e2e" / "wandb")
    assert sorted(runs) == trials and {(r.group, r.exit_code) for r in runs.values()} == {
        ("e2e", 0)}
    static = {c for c in rows[0] if is_static(c)}
    for t in trials:
        assert mismatches(runs[t], [r for r in rows if r["trial_id"] == t], static) == [], t
        assert "health/layer1/max_load" in runs[t].history[-1]
        assert runs[t].config["knob"]["upcycle"]["lr_policy"]
    assert {r["kind"] for r in rows} == {"upcycled"}
    assert all(r["D1"] == 2048 and r["N1"] < r["N_total"] for r in rows)
    failed_once = list((tmp_path / "results" / "e2e" / "parents").glob(".failed-*"))
    assert len(failed_once) == 2
    # the restarted trials resumed from the step-4 checkpoint: their first report was step 6
    # (a restart from scratch would report step 0 first)
    resumed = (tmp_path / "results" / "e2e" / "parents").glob(".resumed-*")
    assert sorted(p.read_text() for p in resumed) == ["6"] * 2
    # Tune keeps one checkpoint per trial (checkpoint.keep = 1): the last step's
    kept = sorted((tmp_path / "results" / "e2e" / "tune").glob("*/checkpoint_*"))
    assert len(kept) == 2, kept
    # the ranked table was printed
    assert "trials ranked by val_loss" in out.stdout
    # the analysis report reads the real output: ledger from results + summary.json
    res = tmp_path / "results" / "e2e"
    assert (res / "summary.json").exists()
    rep = subprocess.run([sys.executable, "-m", "analysis.report", str(res), "--bootstrap", "0"],
                         capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr[-3000:]
    md = (res / "report.md").read_text()
    assert "| tokens saved by shared parents | 2,048 |" in md  # the second trial reuses it
    assert (res / "curves.png").stat().st_size > 1000
    # provenance: the same record in summary.json and the Parquet, printed by the report
    prov = json.loads((res / "summary.json").read_text())["provenance"]
    assert tuple(prov) == KEYS and read_provenance(res) == prov
    assert "## Provenance" in md and f"torch {prov['packages']['torch']}" in md

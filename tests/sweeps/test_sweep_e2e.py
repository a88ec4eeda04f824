"""End-to-end sweeps on local Ray (CPU): shared parent, injected failures, driver resume."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from sweeps.store.provenance import KEYS
from sweeps.store.results import is_static, read_provenance
from sweeps.testing.faults import SIM_STEP_ENV
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


@pytest.mark.slow
@pytest.mark.distributed
def test_interrupted_driver_resumes_without_rerunning_finished_trials(tmp_path):
    # W&B off: the offline runs are the other test's (and test_reliability's, across a resume);
    # here they only cost each trial a W&B run to start and close
    spec = _write(tmp_path, max_concurrent=1, logging={"wandb": {"enabled": False}})
    log = open(tmp_path / "driver.log", "w")  # a file, not a pipe nobody drains
    # each trial sleeps 1 s per step (8 s) in this run only (sweeps.testing.faults.stretch):
    # trials left to interrupt when the first one's row is seen, whatever the machine's speed
    # (unstretched, all 4 could finish between the row's flush and the Ctrl+C)
    proc = subprocess.Popen([sys.executable, "-m", "sweeps.run", str(spec)],
                            env=_env(tmp_path, **{SIM_STEP_ENV: "trial=1.0"}), stdout=log,
                            stderr=subprocess.STDOUT)
    res = tmp_path / "results" / "e2e" / "results.parquet"
    deadline = time.time() + 300
    done_before: dict = {}
    while time.time() < deadline:
        time.sleep(1)
        if res.exists():
            try:
                rows = pq.read_table(res).to_pylist()
            except Exception:
                continue
            ok = {r["trial_id"] for r in rows if r["status"] == "ok"}
            if ok:
                done_before = {(r["trial_id"], r["step"]): r["wall_s"] for r in rows
                               if r["trial_id"] in ok}
                break
    assert done_before, "no trial finished in time"
    proc.send_signal(signal.SIGINT)  # Ctrl+C: Tune saves the experiment state and stops
    proc.wait(timeout=180)
    log.close()
    rows = _rows(tmp_path)
    assert len({r["trial_id"] for r in rows if r["status"] == "ok"}) < 4
    out = subprocess.run([sys.executable, "-m", "sweeps.run", str(spec), "--resume"],
                         env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = _rows(tmp_path)
    assert len({r["trial_id"] for r in rows}) == 4
    assert all(r["status"] == "ok" for r in rows)
    after = {(r["trial_id"], r["step"]): r["wall_s"] for r in rows}
    for k, wall in done_before.items():  # finished trials were not rerun
        assert after[k] == wall

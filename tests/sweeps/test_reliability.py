"""Honest endings, secrets and trust: a stopped sweep says it is incomplete and resumes; the W&B
key never reaches Ray's logs or the results; --resume refuses experiment state someone else
could have written; an unreachable cluster fails in seconds."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import ray.cloudpickle
import yaml

from moe_core.errors import UpcycleError
from sweeps.run.driver import ResultsCallback
from sweeps.run.health import HealthStopper
from sweeps.store.generations import STATE_DIR, handler_of, tune_storage
from sweeps.store.results import summarize
from sweeps.store.trust import UntrustedStateError, hide_wandb_key, verify_experiment_state
from sweeps.testing.faults import SIM_STEP_ENV
from tests.sweeps.tiny import tiny_base

SENTINEL = "sentinel-wandb-key-7f3a9c0e5d"
RESULTS_FILE_NAME = "results.parquet"


def test_verify_experiment_state(tmp_path):
    tune = tmp_path / "tune"
    (tune / "trial").mkdir(parents=True)
    (tune / "tuner.pkl").write_bytes(b"x")
    verify_experiment_state(tune)  # ours, not writable by others: fine
    os.chmod(tune / "tuner.pkl", 0o664)
    with pytest.raises(UntrustedStateError, match=r"tuner\.pkl is writable by group"):
        verify_experiment_state(tune)
    os.chmod(tune / "tuner.pkl", 0o644)
    if os.geteuid() == 0:  # root can give the file away, as another user's write would
        os.chown(tune / "trial", 65534, 65534)
        with pytest.raises(UntrustedStateError, match="is owned by uid 65534"):
            verify_experiment_state(tune)
        os.chown(tune / "trial", 0, 0)
    (tune / "link.pkl").symlink_to(tmp_path / "elsewhere.pkl")
    with pytest.raises(UntrustedStateError, match="symbolic link"):
        verify_experiment_state(tune)


def test_hide_wandb_key_moves_it_into_a_private_file(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", SENTINEL)
    monkeypatch.delenv("NETRC", raising=False)
    path = hide_wandb_key()
    assert "WANDB_API_KEY" not in os.environ and os.environ["NETRC"] == str(path)
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    assert SENTINEL in path.read_text()
    assert hide_wandb_key() is None  # nothing left to hide
    shutil.rmtree(path.parent)


def test_unreachable_address_fails_in_seconds():
    import socket

    from sweeps.run.driver import check_address

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = time.perf_counter()
    with pytest.raises(UpcycleError, match=f"nothing answers at 127.0.0.1:{port}"):
        check_address(f"127.0.0.1:{port}")
    assert time.perf_counter() - t < 10
    with pytest.raises(UpcycleError, match="must be auto"):
        check_address("no-port-here")
    check_address(None)


def test_summary_is_honest_about_unfinished_trials():
    finals = [{"trial_id": "a", "status": "ok", "val_loss": 1.0},
              {"trial_id": "b", "status": "running", "val_loss": 2.0}]
    planned = {"trials": 3, "parents": 0, "tokens_saved_by_sharing": 0,
               "tokens_saved_by_branches": 0}
    s = summarize(finals, sweep="s", metric="val_loss", mode="min", planned=planned,
                  results="r", wall_s=1.0, parent_wall_s=0.0)
    assert s["complete"] is False and s["unfinished"] == ["b"] and s["not_started"] == 1
    done = summarize([dict(finals[0], trial_id=t) for t in "abc"], sweep="s",
                     metric="val_loss", mode="min", planned=planned, results="r", wall_s=1.0,
                     parent_wall_s=0.0)
    assert done["complete"] is True and done["unfinished"] == []


SPEC = {
    "sweep": "rel",
    "base": tiny_base(moe={"num_experts": 4, "top_k": 2}),
    "search": {"optim.lr": {"grid": [1e-3, 2e-3, 3e-3]}},
    "logging": {"wandb": {"mode": "offline"}},
    "max_concurrent": 1,
}


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {tempfile.gettempdir()}/upcycle-pwned",))


@pytest.mark.slow
@pytest.mark.distributed
def test_sigterm_resume_tamper_and_sentinel_key(tmp_path):
    """SIGTERM mid-sweep: exit 143, summary complete: false; a tampered tuner.pkl is refused
    without being unpickled; --resume finishes; the sentinel W&B key is nowhere on disk. ASHA
    (its only rung the last eval) and a health rule that never fires ride along, so the resume
    goes through ``ResumableASHA``'s replay and the stopper's reseeding in a real restore."""
    ray_tmp = Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))  # short: Ray's socket paths
    spec = dict(SPEC, results=str(tmp_path / "results"),
                scheduler={"kind": "asha", "grace_period": 5, "reduction_factor": 2},
                prune={"max_load_fraction": {"above": 0.99, "for_evals": 3}})
    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump(spec))
    env = dict(os.environ, WANDB_API_KEY=SENTINEL, UPCYCLE_CACHE=str(tmp_path / "cache"),
               RAY_TMPDIR=str(ray_tmp), WANDB_DIR=str(tmp_path / "wandb"))
    env.pop("RAY_ADDRESS", None)
    env.pop("WANDB_MODE", None)
    res = tmp_path / "results" / "rel"
    try:
        log = open(tmp_path / "driver.log", "w")
        # each trial sleeps 1 s per step in this run only (sweeps.testing.faults.stretch):
        # trials left to cut when the first one's row is seen, whatever the machine's speed
        proc = subprocess.Popen([sys.executable, "-m", "sweeps.run", str(f)],
                                env={**env, SIM_STEP_ENV: "trial=1.0"}, stdout=log,
                                stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            time.sleep(1)
            try:
                rows = pq.read_table(res / "results.parquet").to_pylist()
            except Exception:
                continue
            if any(r["status"] == "ok" for r in rows):
                break
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=180) == 143, (tmp_path / "driver.log").read_text()[-3000:]
        log.close()
        assert "rerun with --resume" in (tmp_path / "driver.log").read_text()
        summary = yaml.safe_load((res / "summary.json").read_text())
        assert summary["complete"] is False
        assert summary["ok"] < 3 and summary["unfinished"] or summary["not_started"]
        # a trial the signal cut is interrupted, never ok (#32): every ok trial reached step 8
        finals = {}
        before = pq.read_table(res / "results.parquet").to_pylist()
        for r in before:
            if r["trial_id"] not in finals or r["step"] >= finals[r["trial_id"]]["step"]:
                finals[r["trial_id"]] = r
        assert all(r["step"] == 8 for r in finals.values() if r["status"] == "ok"), finals
        assert summary["ok"] == sum(r["status"] == "ok" for r in finals.values())
        done = {t for t, r in finals.items() if r["status"] == "ok"}
        done_before = {(r["trial_id"], r["step"]): r["wall_s"] for r in before
                       if r["trial_id"] in done}

        fs, _, where = tune_storage(res)  # tuner.pkl's object, as the manifest names it
        pkl = Path(where, STATE_DIR, f"g{handler_of(fs).view()['tuner.pkl']['gen']:08d}",
                   "tuner.pkl")
        good = pkl.read_bytes()
        # the stopper Tune restores is the one the results callback reseeds: one pickle
        rc = ray.cloudpickle.loads(good)["_run_config"]
        assert rc.stop is next(c for c in rc.callbacks if isinstance(c, ResultsCallback)).health
        assert isinstance(rc.stop, HealthStopper)
        pkl.write_bytes(pickle.dumps(_Evil()))
        os.chmod(pkl, 0o666)
        out = subprocess.run([sys.executable, "-m", "sweeps.run", str(f), "--resume"], env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and "refusing to resume" in out.stderr, out.stderr[-2000:]
        assert len(out.stderr.strip().splitlines()) == 1
        assert not Path(tempfile.gettempdir(), "upcycle-pwned").exists()
        pkl.write_bytes(good)
        os.chmod(pkl, 0o644)

        out = subprocess.run([sys.executable, "-m", "sweeps.run", str(f), "--resume", "--json"],
                             env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        summary = yaml.safe_load((res / "summary.json").read_text())
        assert summary["complete"] is True and summary["ok"] == 3
        # the trials finished before the signal were not rerun: their rows are as they were
        # (SIGTERM takes Ctrl+C's path, sweeps.run._signals: this is also the Ctrl+C resume
        # test_sweep_e2e ran, two driver starts, until 2026-11-29)
        after = {(r["trial_id"], r["step"]): r["wall_s"]
                 for r in pq.read_table(res / "results.parquet").to_pylist()}
        assert done_before and all(after[k] == w for k, w in done_before.items()), done_before
        assert "_WandbLoggingActor" not in out.stderr  # no Ray noise about the W&B actor
        # offline W&B runs hold the whole trial config (a run cut by the SIGTERM may hold less)
        # (nested by YAML path since #41: the "model" key's JSON value holds "preset")
        assert any(b'"preset"' in p.read_bytes() for p in res.rglob("*.wandb"))
        leaks = [p for root in (ray_tmp, tmp_path) for p in Path(root).rglob("*")
                 if p.is_file() and not p.is_symlink() and SENTINEL.encode() in p.read_bytes()]
        assert leaks == []
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


KILL_AFTER_ROWS = (3, 11)
"""The kills: after 3 rows (the first trial mid-curve) and, in the resumed run, after 11 (the
third trial); of the sweep's 15."""


def _rows_seen(res: Path) -> int:
    """Rows the sweep has recorded so far: the sink's row log, or the Parquet if it has more."""
    seen = sum(len(p.read_text().splitlines())
               for p in (res / "rows").glob("wal-*.jsonl")) if (res / "rows").exists() else 0
    if (res / RESULTS_FILE_NAME).exists():
        try:
            seen = max(seen, pq.read_table(res / RESULTS_FILE_NAME).num_rows)
        except Exception:
            pass
    return seen


@pytest.mark.slow
@pytest.mark.distributed
def test_kill_9_of_the_driver_loses_no_row(tmp_path):
    """The driver and its Ray processes die at once (kill -9 of the process group) after
    some rows, and the resumed driver does too after more; a last --resume then finishes, and
    every row Tune ever recorded is in the Parquet. One chain (run, kill, resume, kill, resume)
    instead of a fresh sweep per kill instant: the second kill also hits a resumed driver."""
    ray_tmp = Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))
    spec = dict(SPEC, results=str(tmp_path / "results"), logging={"wandb": {"enabled": False}})
    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump(spec))
    env = dict(os.environ, UPCYCLE_CACHE=str(tmp_path / "cache"), RAY_TMPDIR=str(ray_tmp))
    env.pop("RAY_ADDRESS", None)
    res = tmp_path / "results" / "rel"
    try:
        args: list[str] = []
        for i, kill_after_rows in enumerate(KILL_AFTER_ROWS):
            log = open(tmp_path / f"driver{i}.log", "w")
            proc = subprocess.Popen([sys.executable, "-m", "sweeps.run", str(f), *args],
                                    env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            deadline = time.time() + 300
            while time.time() < deadline and proc.poll() is None \
                    and _rows_seen(res) < kill_after_rows:
                time.sleep(0.2)
            assert proc.poll() is None, f"the sweep ended before the kill after " \
                f"{kill_after_rows} rows: " + (tmp_path / f"driver{i}.log").read_text()[-2000:]
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
            log.close()
            args = ["--resume"]
        out = subprocess.run([sys.executable, "-m", "sweeps.run", str(f), "--resume"], env=env,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
        rows = pq.read_table(res / RESULTS_FILE_NAME).to_pylist()
        have = {(r["trial_id"], r["step"]) for r in rows}
        recorded = set()
        for rj in (res / "tune").glob("*/result.json"):
            for line in rj.read_text().splitlines():
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                recorded.add((d["trial_id"], d["step"]))
        assert recorded and recorded <= have
        assert len({r["trial_id"] for r in rows}) == 3
        assert {r["status"] for r in rows} == {"ok"}
        for t in {r["trial_id"] for r in rows}:
            assert sorted(r["step"] for r in rows if r["trial_id"] == t) == [0, 2, 4, 6, 8]
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_wandb_run_config_holds_the_whole_trial_config(tmp_path):
    from sweeps.plan.build import build_plan
    from sweeps.run.driver import wandb_callback
    from sweeps.spec.sweep import parse_spec

    spec = parse_spec(dict(SPEC, results=str(tmp_path)))
    from sweeps.store.wandb_keys import wandb_result

    cb = wandb_callback(spec, build_plan(spec), tmp_path)
    # a result as a trial reports it: the logger sends its config columns to the run config
    # (nested by YAML path) and keeps the metrics as curves
    cols = ("model.preset", "moe.router.aux_coef", "optim.lr", "knob.optim.lr", "seed",
            "sweep", "trial_id")
    metrics = ("val_loss", "router.max_load", "router.max_load.worst", "step", "tokens")
    assert set(cols) - {"knob.optim.lr"} <= cb.static
    out = wandb_result({**{k: 1 for k in cols}, **{k: 2.0 for k in metrics}}, cb.static)
    config = out.pop("config")
    assert config["model"]["preset"] == config["knob"]["optim"]["lr"] == config["trial_id"] == 1
    assert config["moe"]["router"]["aux_coef"] == config["optim"]["lr"] == config["seed"] == 1
    assert not set(out) & set(cols) and {"val_loss", "step", "tokens"} <= set(out)
    assert {"health/all/max_load", "health/worst/max_load"} <= set(out)  # health by layer


@pytest.mark.slow
@pytest.mark.distributed
def test_a_diverged_parent_is_a_diverged_row_not_a_crash(tmp_path):
    base = dict(SPEC["base"], optim={"lr": 3e-3, "grad_clip": 0.0},
                schedule={"kind": "constant", "warmup_steps": 0},
                parent={"tokens": 2048, "lr": 1e6, "seed": 0},  # NaN at step 4
                upcycle={"method": "dense_to_moe"})
    spec = dict(SPEC, base=base, results=str(tmp_path / "results"),
                search={"upcycle.lr_policy.policy": {"grid": ["reset", "constant"]}},
                logging={"wandb": {"enabled": False}})
    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump(spec))
    env = dict(os.environ, UPCYCLE_CACHE=str(tmp_path / "cache"))
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-m", "sweeps.run", str(f), "--json"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["diverged"] == 2 and summary["complete"] is True
    rows = pq.read_table(tmp_path / "results" / "rel" / RESULTS_FILE_NAME).to_pylist()
    assert {r["status"] for r in rows} == {"diverged"}
    assert all("diverged at step 4" in r["reason"] and "parent" in r["reason"] for r in rows)

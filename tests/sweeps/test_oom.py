"""Memory pressure is a recorded outcome, not a crash (#39 item 5): a trial, or an actor the
sweep needs, killed by Ray's memory monitor is a row with status ``oom`` and the node's memory
figures; the sweep goes on (or stops in one line), every row is kept, and --resume continues."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest
import yaml
from ray.exceptions import OutOfMemoryError, RayActorError

from sweeps.run.memory import KilledForMemory, _as_actor_death, stop_outcome
from sweeps.store.oom import LOWER, MEMORY_COLUMNS, from_message, is_oom, oom_outcome
from sweeps.store.sink import ResultsSink
from sweeps.store.trial_outcomes import error_outcome, reconcile
from sweeps.testing.faults import OOM_AFTER_ENV
from tests.sweeps.tiny import tiny_base

# Ray 2.60's message, as its memory monitor wrote it on this machine (cut)
RAY_MESSAGE = (
    "1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: "
    "192.0.2.2, ID: 1ad7f7) was 7.33GB used / 23.54GB limit (0.311547)\nOOM kill reason: Memory "
    "usage 7667613696B exceeded threshold of 7224024576B (28.6% of 25276502016B limit)\n"
    "Selected to kill: (Actor(458ae7): job ID=01000000, task name=_QueueActor.__init__, "
    "required resources={}, pid=456, actual memory used=0.12GB, worker ID=1)\n"
    "Selected to kill: (Actor(478b03): job ID=01000000, task name=ImplicitFunc.train, required "
    "resources={CPU_group_0_0644: 1, CPU: 1}, pid=29909, actual memory used=0.24GB, worker "
    "ID=7ee4ef)\n]\nTop 10 memory users: PID\tMEM(GB)\tCOMMAND"
    "\n25422\t1.00\tpython bench.py\n")


def test_ray_kill_message_gives_the_node_figures():
    mem = from_message(RAY_MESSAGE)
    assert (mem.total_gb, mem.used_gb, mem.trial_rss_gb) == (23.54, 7.33, 0.24)
    assert mem.threshold == pytest.approx(0.286)
    assert mem.available_gb == pytest.approx(16.21)
    reason, cols = oom_outcome(RAY_MESSAGE)
    assert set(cols) == set(MEMORY_COLUMNS) and cols["memory.available_gb"] == 16.21
    assert "node 7.33 of 23.54 GB used" in reason and "threshold 0.29" in reason
    assert "killed worker at 0.24 GB, also killed: _QueueActor" in reason  # the trial's GB
    assert LOWER in reason and "\n" not in reason
    assert is_oom(RAY_MESSAGE) and is_oom(OutOfMemoryError("x")) and not is_oom("ValueError")
    wrapped = RuntimeError("Caught unexpected exception")  # how Tune re-raises it
    wrapped.__cause__ = OutOfMemoryError(RAY_MESSAGE)
    line, why, cols = stop_outcome(wrapped)
    assert line.startswith("the sweep stopped: a worker of the sweep") and "7.33 of 23.54" in line
    assert cols["memory.used_gb"] == 7.33


def test_tune_gets_an_actor_death_it_can_handle():
    seen = []
    handler = _as_actor_death(lambda self, task, exc: seen.append(exc))
    handler(None, None, OutOfMemoryError(RAY_MESSAGE))
    handler(None, None, ValueError("other"))
    assert isinstance(seen[0], RayActorError) and str(seen[0]) == RAY_MESSAGE
    assert isinstance(seen[1], ValueError)
    back = pickle.loads(pickle.dumps(seen[0]))  # Tune pickles a trial's error
    assert isinstance(back, KilledForMemory) and str(back) == RAY_MESSAGE


def test_oom_rows_keep_their_figures_and_resume_to_ok(tmp_path):
    err = tmp_path / "error.txt"
    err.write_text("Failure # 1 (occurred at x)\nRuntimeError: boom\n"
                   f"Failure # 2 (occurred at y)\n{RAY_MESSAGE}")

    class T:
        trial_id, status, error_file = "a", "ERROR", str(err)

    status, reason, cols = error_outcome(T())
    assert status == "oom" and cols["memory.trial_rss_gb"] == 0.24
    sink = ResultsSink(tmp_path / "r", flush_s=0)
    for step in (0, 2):
        sink.add({"trial_id": "a", "step": step, "status": "running", "val_loss": 1.0})
    reconcile(sink, [T()])
    sink.close()
    sink = ResultsSink(tmp_path / "r", flush_s=0)  # replayed from the log / parts
    sink.load()
    rows = sink.rows_of("a")
    assert {r["status"] for r in rows.values()} == {"oom"}
    assert all(r["memory.used_gb"] == 7.33 and r["reason"] == reason for r in rows.values())
    reconcile(sink, [T()])  # marked again: no change
    sink.flush(wait=True)  # sealed into a part
    sink.mark("a", "ok")  # --resume finished it: read back and reopened
    assert {r["status"] for r in sink.rows_of("a").values()} == {"ok"}
    sink.close()


def test_tune_dying_for_memory_stops_in_one_line_keeping_every_row(tmp_path):
    from sweeps.run.driver import _final_results, _fit

    sink = ResultsSink(tmp_path, flush_s=0)
    for t in ("a", "b"):
        sink.add({"trial_id": t, "step": 0, "status": "running", "val_loss": 1.0})
    sink.mark("b", "ok")

    class Tuner:  # Tune's actor manager meeting Ray's OutOfMemoryError (ray#29736)
        def __init__(self, error):
            self.error = error

        def fit(self):
            try:
                raise self.error
            except OutOfMemoryError as e:
                raise RuntimeError(f"Caught unexpected exception: {e}") from e

    class Callback:
        pass

    cb = Callback()
    cb.sink = sink
    grid, line, cut = _fit(Tuner(OutOfMemoryError(RAY_MESSAGE)), 1, 2, cb)
    assert grid is None and line.startswith("the sweep stopped: ") and "\n" not in line
    assert LOWER in line and "7.33 of 23.54 GB" in line
    finals = {r["trial_id"]: r for r in _final_results(tmp_path, None, cut)}
    assert finals["a"]["status"] == "oom" and finals["a"]["memory.threshold"] == 0.286
    assert finals["b"]["status"] == "ok"
    with pytest.raises(ValueError, match="not memory"):  # anything else is not swallowed
        _fit(Tuner(ValueError("not memory")), 1, 2, cb)


def test_wandb_logging_lost_is_one_line_not_a_crash(capsys):
    from sweeps.run.wandb_logging import LOST, ProvenanceWandbLogger

    class DeadQueue:
        actor = None

        def put(self, item):
            raise OutOfMemoryError(RAY_MESSAGE)

    cb = ProvenanceWandbLogger(project="p", mode="disabled")
    trial = object()
    cb._trial_logging_actors[trial] = None
    cb._trial_queues[trial] = DeadQueue()
    for _ in range(3):
        cb.log_trial_result(1, trial, {"val_loss": 1.0})
    cb.log_trial_end(trial)
    cb.on_experiment_end([trial])
    err = capsys.readouterr().err
    assert err.count(LOST) == 1 and "killed for memory" in err and "Traceback" not in err
    assert cb._trial_queues == {}


def _run(f: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sweeps.run", str(f), "--json", *extra],
                          env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_trial_killed_for_memory_is_an_oom_row_and_resumes(tmp_path):
    """Two tiny trials, one at a time, W&B offline, Ray's kill threshold 3.5 GiB above the
    node's use now: the first trial eats memory after its 2nd report (steps 0, 2) until Ray's
    memory monitor kills it (and, as in #39's report, its W&B queue and logging actors). Its
    rows say oom with the node's figures, the second trial runs to the end (unless the shared
    machine's own load crossed the threshold too: then it is oom as well) and is logged to W&B,
    the driver exits 4 with one line per kill and no traceback; --resume finishes the rest."""
    vm = psutil.virtual_memory()
    threshold = min(0.95, (vm.total - vm.available + (7 << 29)) / vm.total)
    ray_tmp = Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))
    spec = {"sweep": "oom", "base": tiny_base(), "max_concurrent": 1,
            "search": {"optim.lr": {"grid": [1e-3, 3e-3]}}, "checkpoint": {"every_evals": 1},
            "failure": {"max_failures": 0}, "logging": {"wandb": {"mode": "offline"}},
            "results": str(tmp_path / "results")}
    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump(spec))
    env = dict(os.environ, UPCYCLE_CACHE=str(tmp_path / "cache"), RAY_TMPDIR=str(ray_tmp),
               WANDB_DIR=str(tmp_path / "wandb"),
               RAY_memory_usage_threshold=f"{threshold:.4f}", RAY_memory_monitor_refresh_ms="100",
               **{OOM_AFTER_ENV: "2"})
    env.pop("RAY_ADDRESS", None)
    res = tmp_path / "results" / "oom"
    try:
        t0 = time.time()
        out = _run(f, env)
        first_s = time.time() - t0
        assert out.returncode == 4, out.stdout[-2000:] + out.stderr[-3000:]
        assert "Traceback" not in out.stderr, out.stderr[-3000:]
        killed = [x for x in out.stderr.splitlines() if "killed by Ray's memory monitor" in x]
        summary = json.loads(out.stdout.strip().splitlines()[-1])
        assert summary["oom"] >= 1 and summary["oom"] + summary["ok"] == 2, summary
        assert summary["memory_stop"] is None  # the driver survived: the sweep went on
        assert len(killed) == summary["oom"] + 1 and LOWER in killed[0]  # each kill, the end
        assert killed[-1].startswith(f"{summary['oom']} trial(s) killed")
        rows = pq.read_table(res / "results.parquet").to_pylist()
        oom = [r for r in rows if r["status"] == "oom"]
        cut = {r["trial_id"] for r in oom}
        assert {r["status"] for r in rows if r["trial_id"] not in cut} <= {"ok"}
        hog = (tmp_path / "results").rglob(".oom-once")
        assert next(hog, None) is not None and any(  # the hog's trial: its rows before the kill
            sorted(r["step"] for r in oom if r["trial_id"] == t)[:2] == [0, 2] for t in cut)
        ran_on = {r["trial_id"] for r in rows} - cut  # W&B logged on for the trial after it
        assert all(any(t in w.name for w in res.rglob("*.wandb")) for t in ran_on)
        row = oom[0]
        assert row["memory.total_gb"] > 1 and 0 < row["memory.used_gb"] <= row["memory.total_gb"]
        assert row["memory.threshold"] == pytest.approx(threshold, abs=0.01)
        assert row["memory.available_gb"] > 0 and "killed by Ray's memory monitor" in row["reason"]
        t1 = time.time()
        for k in ("RAY_memory_usage_threshold", "RAY_memory_monitor_refresh_ms"):
            env.pop(k)  # the pressure is gone (Ray's own threshold; the hog ate once)
        out = _run(f, env, "--resume")
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
        rows = pq.read_table(res / "results.parquet").to_pylist()
        assert {r["status"] for r in rows} == {"ok"}
        for t in {r["trial_id"] for r in rows}:
            assert sorted(r["step"] for r in rows if r["trial_id"] == t) == [0, 2, 4, 6, 8]
        print(f"oom figures: {killed[0]}\n row: { {k: row[k] for k in MEMORY_COLUMNS} }\n "
              f"first run {first_s:.1f} s, resume {time.time() - t1:.1f} s")
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)

"""The results sink: every row durable before the callback returns, results.parquet rebuilt from
whatever survives (the row log, Tune's own records), writes off the caller's thread."""

from __future__ import annotations

import json
import pickle

import pyarrow.parquet as pq

from sweeps.store.results import RESULTS_FILE, read_rows
from sweeps.store.sink import ResultsSink
from sweeps.store.trial_outcomes import error_reason, reconcile


def _row(t, step, **kw):
    return {"sweep": "s", "trial_id": t, "step": step, "val_loss": 3.0 - 0.1 * step,
            "status": "running", "knob.x": json.dumps({"a": 1}), **kw}


def test_rows_survive_a_kill_before_any_parquet_write(tmp_path):
    a = ResultsSink(tmp_path, flush_s=1e9)  # never flushes on its own
    for t in "ab":
        for s in range(3):
            a.add(_row(t, s))
    a.mark("a", "ok")
    assert not (tmp_path / RESULTS_FILE).exists()
    # the driver is killed here: a new one rebuilds from the log alone
    b = ResultsSink(tmp_path)
    rep = b.load()
    assert rep.from_log == 6 and rep.from_parquet == 0
    assert sorted(b.rows) == [(t, s) for t in "ab" for s in range(3)]
    assert {r["status"] for (t, _), r in b.rows.items() if t == "a"} == {"ok"}
    assert {r["status"] for (t, _), r in b.rows.items() if t == "b"} == {"running"}


def test_flush_writes_in_the_background_and_compacts_the_log(tmp_path):
    calls = []
    sink = ResultsSink(tmp_path, flush_s=1e9)
    for s in range(4):
        sink.add(_row("a", s))
    sink.flush(wait=True)
    assert [r["step"] for r in read_rows(tmp_path)] == [0, 1, 2, 3]
    assert list((tmp_path / "rows").glob("wal-*.jsonl")) == []  # covered by the file
    import sweeps.store.sink as sk

    real = sk.rows_table
    sk.rows_table = lambda rows, types=None: calls.append(rows[0]["trial_id"]) or real(rows, types)
    try:
        sink.add(_row("b", 0))
        sink.flush(wait=True)
    finally:
        sk.rows_table = real
    assert calls == ["b"]  # only the trial that changed was rebuilt
    assert len(read_rows(tmp_path)) == 5
    sink.add(_row("b", 1))  # logged, not yet in the file
    assert len(read_rows(tmp_path)) == 5
    c = ResultsSink(tmp_path)
    c.load()
    assert len(c.rows) == 6


def test_garbage_or_missing_parquet_is_rebuilt_from_tune_records(tmp_path):
    sink = ResultsSink(tmp_path, flush_s=1e9)
    for s in range(3):
        sink.add(_row("a", s))
    sink.close()
    (tmp_path / RESULTS_FILE).write_bytes(b"PAR1 garbage")
    trial = tmp_path / "tune" / "run_a_00000"
    trial.mkdir(parents=True)
    lines = [dict(_row("a", s), trial_id="a", time_total_s=1.0, config={"x": 1})
             for s in range(5)]
    (trial / "result.json").write_text("\n".join(json.dumps(x) for x in lines) + "\n{trunc")
    b = ResultsSink(tmp_path)
    rep = b.load(tmp_path / "tune")
    assert rep.problems and "unreadable" in rep.problems[0]
    assert sorted(b.rows) == [("a", s) for s in range(5)] and rep.from_tune == 5
    assert "time_total_s" not in b.rows[("a", 4)]  # only our columns
    b.close()
    assert pq.read_table(tmp_path / RESULTS_FILE).num_rows == 5


def test_reconcile_takes_outcomes_from_tune_and_errors_as_text(tmp_path):
    sink = ResultsSink(tmp_path)
    sink.add(_row("a", 0))
    sink.add(_row("b", 0))
    sink.add(_row("c", 0, status="diverged", reason="nan"))
    err = tmp_path / "error.txt"
    err.write_text("Traceback ...\n  File x\nRuntimeError: CUDA out of memory\n")

    class T:
        def __init__(self, tid, status, error_file=None):
            self.trial_id, self.status, self.error_file = tid, status, error_file

    reconcile(sink, [T("a", "TERMINATED"), T("b", "ERROR", str(err)), T("c", "TERMINATED")])
    rows = sink.rows
    assert rows[("a", 0)]["status"] == "ok"
    assert rows[("b", 0)]["status"] == "failed"
    assert rows[("b", 0)]["reason"] == "RuntimeError: CUDA out of memory"
    assert rows[("c", 0)]["status"] == "diverged"
    sink.add(_row("c", 2))  # an earlier eval of a trial that diverged later
    sink.add(_row("c", 4, status="diverged", reason="nan at step 4"))
    sink.mark("c", "ok")  # Tune saw the trial end normally
    assert {(r["status"], r["reason"]) for (t, _), r in sink.rows.items() if t == "c"} == {
        ("diverged", "nan at step 4")}
    assert error_reason(T("d", "ERROR", str(tmp_path / "missing"))) == "trial error"


def test_sink_pickles_without_its_rows_or_threads(tmp_path):
    sink = ResultsSink(tmp_path)
    sink.add(_row("a", 0))
    sink.flush()
    back = pickle.loads(pickle.dumps(sink))
    assert back.rows == {} and back.path == sink.path
    back.load()
    assert ("a", 0) in back.rows
    sink.close()


def test_a_replay_rewrites_the_curve_and_nothing_stale_outlives_it(tmp_path):
    """A trial restarted from its step-2 checkpoint replays steps 3, 4 and is stopped there
    (pruned, or its replay diverged): the first attempt's step 5 must not stay in its curve,
    live, rebuilt from the log, or rebuilt from Tune's result.json, which holds both attempts."""
    first = [_row("a", s) for s in range(6)]
    second = [_row("a", s, val_loss=9.0 + s) for s in (3, 4)]
    sink = ResultsSink(tmp_path, flush_s=1e9)
    for r in first + second:
        sink.add(r)
    want = [(s, 3.0 - 0.1 * s) for s in range(3)] + [(3, 12.0), (4, 13.0)]
    assert sorted((s, r["val_loss"]) for (_, s), r in sink.rows.items()) == want
    sink.add(_row("a", 4, val_loss=13.0, prune_rule="asha"))  # same step: replaces, no rewind
    assert sorted(s for _, s in sink.rows) == [0, 1, 2, 3, 4]
    sink.close()
    assert sorted((r["step"], r["val_loss"]) for r in read_rows(tmp_path)) == want
    # the driver died before any Parquet write: the log replays in order, rewinds included
    (tmp_path / RESULTS_FILE).unlink()
    sink2 = ResultsSink(tmp_path, flush_s=1e9)
    for r in first + second:
        sink2.add(r)
    b = ResultsSink(tmp_path)
    b.load()
    assert sorted((s, r["val_loss"]) for (_, s), r in b.rows.items()) == want
    # nothing but Tune's records: both attempts in one result.json, in order
    for p in (tmp_path / "rows").glob("*.jsonl"):
        p.unlink()
    trial = tmp_path / "tune" / "run_a_00000"
    trial.mkdir(parents=True)
    (trial / "result.json").write_text("\n".join(json.dumps(dict(r, trial_id="a"))
                                                 for r in first + second))
    c = ResultsSink(tmp_path)
    c.load(tmp_path / "tune")
    assert sorted((s, r["val_loss"]) for (_, s), r in c.rows.items()) == want


def test_finished_trials_leave_memory_and_come_back_on_a_late_row(tmp_path):
    """A marked trial's rows go to an immutable part and out of memory; the count per status
    comes from the index; a row for a sealed trial (a restart) reads it back first; parts of a
    size are merged; results.parquet, the final rows and a resume see every row once."""
    from sweeps.store.results import final_rows

    sink = ResultsSink(tmp_path, flush_s=1e9)
    for t in "abcdefgh":
        for s in range(3):
            sink.add(_row(t, s))
        sink.mark(t, "ok")
        sink.flush(wait=True, rewrite=False)  # one part per trial: merged four at a time
    sink.add(_row("z", 0))
    sink.flush(wait=True)
    assert set(sink.trials) == {"z"}  # only the running trial is held
    assert sink.count("ok") == 8 and sink.trial_ids("running") == {"z"}
    assert len(list((tmp_path / "parts").glob("part-*.parquet"))) <= 3
    assert sorted(sink.rows_of("c")) == [0, 1, 2]
    sink.add(_row("c", 3))  # a restart of a finished trial
    assert sorted(sink.trials["c"]) == [0, 1, 2, 3] and "c" in sink.trial_ids("running")
    sink.mark("c", "ok")
    sink.mark("c", "ok")  # reconcile's second mark of a sealed trial: no read back needed
    sink.close()
    rows = read_rows(tmp_path)
    assert len(rows) == 8 * 3 + 1 + 1
    assert len({(r["trial_id"], r["step"]) for r in rows}) == len(rows)
    want = sorted((r["trial_id"], r["step"], r["status"]) for r in final_rows(rows))
    assert sorted((r["trial_id"], r["step"], r["status"]) for r in sink.final_rows()) == want
    b = ResultsSink(tmp_path)
    b.load()
    assert sorted(b.rows) == sorted((r["trial_id"], r["step"]) for r in rows)
    assert b.count("ok") == 8 and not b.trials.get("a")


def test_rewrites_grow_apart_with_the_trials(tmp_path, monkeypatch):
    """results.parquet (an O(rows) rewrite) is rewritten at most every 0.05 s per trial: a
    fixed period over a sweep whose length grows with its trials cost O(T²) driver CPU."""
    import time
    from types import SimpleNamespace

    import sweeps.store.sink as sk

    clock = [1e9]
    monkeypatch.setattr(sk, "time", SimpleNamespace(time=lambda: clock[0],
                                                    perf_counter=time.perf_counter))
    monkeypatch.setattr(sk, "STITCH_FACTOR", 0.0)  # this machine's rewrite time left out
    stitched = []
    real = sk.write_stream
    monkeypatch.setattr(sk, "write_stream", lambda path, *a, **kw: (
        stitched.append(path) if path.name == RESULTS_FILE else None) or real(path, *a, **kw))
    sink = ResultsSink(tmp_path, flush_s=1e9)
    for t in range(200):
        sink.add(_row(f"t{t}", 0))
    assert sink._stitch_period() == 0.05 * 200
    sink.flush(wait=True)  # forced: rewritten now
    assert len(stitched) == 1
    clock[0] += 7  # past the fixed 2 s, not past 10 s
    sink.flush()
    sink.join()
    assert len(stitched) == 1
    clock[0] += 4
    sink.flush()
    sink.join()
    assert len(stitched) == 2
    sink.close()

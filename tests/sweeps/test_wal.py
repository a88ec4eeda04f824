"""The row log's group commit (``sweeps.store.wal``): an ``add`` reaches the kernel and returns
without an fsync; the open segment is fsynced in the background and before a trial's outcome
is acknowledged (``mark``), once for every row written since."""

from __future__ import annotations

import os
import time

import sweeps.store.wal as wal
import sweeps.store.worker as worker
from sweeps.store.sink import ResultsSink


def _count_fsyncs(monkeypatch):
    calls = []
    real = os.fsync
    monkeypatch.setattr(wal.os, "fsync", lambda fd: calls.append(fd) or real(fd))
    monkeypatch.setattr(wal, "fsync_dir", lambda d: calls.append(str(d)))
    return calls


def test_one_fsync_covers_every_line_written_before_it(tmp_path, monkeypatch):
    calls = _count_fsyncs(monkeypatch)
    log = wal.LocalLog(tmp_path / "wal-000001.jsonl")
    for i in range(5):
        log.write(f"{i}\n")
    assert calls == []  # in the kernel, readable, not waited for
    assert (tmp_path / "wal-000001.jsonl").read_text().count("\n") == 5
    log.sync()
    assert len(calls) == 2 and calls[1] == str(tmp_path)  # the file, then its folder (once)
    log.sync()  # nothing new: no fsync
    log.write("5\n")
    log.close()  # what is left, then closed
    assert len(calls) == 3 and log.closed
    log.sync()  # closed: never an fsync of a reused descriptor
    assert len(calls) == 3


def test_add_does_not_wait_for_the_disk_and_mark_does(tmp_path, monkeypatch):
    calls = _count_fsyncs(monkeypatch)
    monkeypatch.setattr(wal, "SYNC_S", 3600.0)  # no background fsync during the test
    sink = ResultsSink(tmp_path, flush_s=1e9)
    for s in range(20):
        sink.add({"trial_id": "a", "step": s, "val_loss": 1.0, "status": "running"})
    assert [c for c in calls if isinstance(c, int)] == []
    sink.mark("a", "ok")  # the trial's completion: every row before it on disk
    assert len([c for c in calls if isinstance(c, int)]) == 1
    sink.close()
    rows = ResultsSink(tmp_path)
    assert rows.load().from_parquet == 20


def test_the_open_segment_is_fsynced_in_the_background(tmp_path, monkeypatch):
    calls = _count_fsyncs(monkeypatch)
    monkeypatch.setattr(wal, "SYNC_S", 0.02)
    sink = ResultsSink(tmp_path, flush_s=1e9)
    sink.add({"trial_id": "a", "step": 0, "val_loss": 1.0, "status": "running"})
    deadline = time.time() + 10
    while not any(isinstance(c, int) for c in calls) and time.time() < deadline:
        time.sleep(0.01)
    assert any(isinstance(c, int) for c in calls)
    sink.close()


def test_the_writer_is_one_thread_woken_per_flush(tmp_path, monkeypatch):
    """One writer thread per sink: a flush wakes it, never starts a thread (Thread.start waits
    until the new thread has run: the add that flushed waited for the scheduler)."""
    import threading

    started = []
    real = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start",
                        lambda self: started.append(self.name) or real(self))
    sink = ResultsSink(tmp_path, flush_s=1e9)
    for s in range(5):
        sink.add({"trial_id": "a", "step": s, "val_loss": 1.0, "status": "running"})
        sink.flush(wait=s % 2 == 0)
    assert started.count("results-writer") == 1
    writer = sink._worker._thread
    sink.close()
    assert not writer.is_alive()
    back = ResultsSink(tmp_path)
    back.load()
    assert len(back.rows) == 5


def test_a_worker_runs_once_for_the_kicks_that_came_while_it_ran():
    import threading

    started, gate, runs = threading.Event(), threading.Event(), []
    w = worker.Worker(lambda: (started.set(), gate.wait(5), runs.append(1)), "t")
    w.kick()
    started.wait(5)
    tickets = [w.kick() for _ in range(3)]  # while the first run waits on the gate
    gate.set()
    w.wait(tickets[-1])
    assert len(runs) == 2  # the first kick's run, then one for the three that came meanwhile
    w.stop()
    assert len(runs) == 2


def test_a_worker_goes_on_after_a_run_that_raised(capsys):
    runs = []

    def work():
        runs.append(1)
        if len(runs) == 1:
            raise OSError("disk full")

    w = worker.Worker(work, "t")
    w.wait(w.kick())
    w.wait(w.kick())
    w.stop()
    assert len(runs) == 2 and "disk full" in capsys.readouterr().err

"""A trial's set-up board reaches the driver from another node (``sweeps.run.setup_progress``):
each write also goes to Ray's GCS internal KV under ``<sweep>/<trial_id>``, and the driver's
read merges the KV's boards with its own node's files; a GCS that fails or is absent leaves the
files alone, and never fails a trial. The real GCS: the last test."""

from __future__ import annotations

import json

import pytest

from sweeps.run import setup_progress
from sweeps.run.setup_progress import (
    KV_NAMESPACE,
    SetupBoard,
    kv_boards,
    kv_clear,
    lines_for,
    read_boards,
)


class FakeGcs:
    """The three ``ray._raylet.GcsClient`` calls the boards make, called as Ray's are."""

    def __init__(self, fail: bool = False):
        self.kv: dict[tuple[bytes, bytes], bytes] = {}
        self.fail = fail

    def internal_kv_put(self, key, value, overwrite, namespace, timeout=None):
        assert isinstance(key, bytes) and isinstance(value, bytes) and overwrite and timeout
        if self.fail:
            raise TimeoutError("GCS did not answer")
        self.kv[(namespace, key)] = value
        return 0

    def internal_kv_keys(self, prefix, namespace, timeout=None):
        if self.fail:
            raise TimeoutError("GCS did not answer")
        return [k for ns, k in self.kv if ns == namespace and k.startswith(prefix)]

    def internal_kv_multi_get(self, keys, namespace, timeout=None):
        return {k: self.kv.get((namespace, k)) for k in keys}


class Clock:
    t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_board_written_on_another_node_reaches_the_drivers_line(tmp_path, monkeypatch):
    gcs = FakeGcs()
    monkeypatch.setattr(setup_progress, "gcs", lambda: gcs)
    there, here = tmp_path / "node2" / ".setup" / "sw", tmp_path / "head" / ".setup" / "sw"
    clock = Clock()
    done = SetupBoard(there / "t1.json", param_bytes=1000, stages=3, clock=clock)
    done.on_stage("data: synthetic tokens")
    clock.t += 40
    done.on_eval({"step": 0}, None)  # a 40 s set-up, on the other node
    late = SetupBoard(there / "t2.json", param_bytes=2000, stages=3, clock=clock)
    late.on_stage("engine: DeepSpeed ZeRO-0")
    SetupBoard(tmp_path / "x" / ".setup" / "other" / "t9.json", 1, 1).on_stage("another sweep")
    assert set(gcs.kv) == {(KV_NAMESPACE.encode(), k) for k in (b"sw/t1", b"sw/t2",
                                                                  b"other/t9")}
    assert json.loads(gcs.kv[(KV_NAMESPACE.encode(), b"sw/t2")]) == late.state
    clock.t += 20
    assert not here.exists()  # nothing on the driver's node
    assert lines_for(here, ["t2"], now=clock.t) == {"t2": (
        "trial t2: set-up 1/3 engine: DeepSpeed ZeRO-0 (20 s in this stage, 20 s in set-up; "
        "ETA ~60 s (from 1 earlier set-up, scaled by size))")}
    assert set(read_boards(here)) == {"t1", "t2"}  # this sweep's only


def test_a_failing_or_absent_gcs_leaves_the_files(tmp_path, monkeypatch):
    folder = tmp_path / ".setup" / "sw"
    for client in (FakeGcs(fail=True), None):
        monkeypatch.setattr(setup_progress, "gcs", lambda c=client: c)
        b = SetupBoard(folder / "t1.json", 10, 2)
        b.on_stage("data: synthetic tokens")  # the write does not raise
        assert read_boards(folder)["t1"]["stages"][0][0] == "data: synthetic tokens"
    gcs = FakeGcs()
    gcs.kv[(KV_NAMESPACE.encode(), b"sw/t3")] = b"{half-writ"  # a damaged entry: skipped
    monkeypatch.setattr(setup_progress, "gcs", lambda: gcs)
    assert set(read_boards(folder)) == {"t1"}


@pytest.mark.slow
@pytest.mark.distributed
def test_through_the_real_gcs_from_a_ray_task(tmp_path):
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False, configure_logging=False,
             log_to_driver=False)
    try:
        @ray.remote(num_cpus=0)
        def write(path: str) -> None:
            from pathlib import Path

            SetupBoard(Path(path), 100, 6).on_stage("data: synthetic tokens")

        ray.get(write.remote(str(tmp_path / "node2" / ".setup" / "sw" / "t1.json")))
        ray.get(write.remote(str(tmp_path / "node2" / ".setup" / "swx" / "t2.json")))
        line = lines_for(tmp_path / "head" / ".setup" / "sw", ["t1"])["t1"]
        kv_clear("sw")  # the driver's, once the sweep's trials are over: that sweep's only
        left = (kv_boards("sw"), set(kv_boards("swx")))
    finally:
        ray.shutdown()
    assert line.startswith("trial t1: set-up 1/6 data: synthetic tokens (")
    assert left == ({}, {"t2"})

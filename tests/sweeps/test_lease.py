"""The object-storage run lock fails closed (issue 43, class 2), against a real S3-protocol
server (moto's, on 127.0.0.1) with real processes: a second run is refused while the first
holds the lease; an unreadable record is held, not free; a holder taken over after its lease
lapsed stops at its next renewal and its exit leaves the new holder's record alone; two runs
racing for a free lock get it once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from sweeps.run import guard
from sweeps.store.lease import Conflict, FolderInUseError, ObjectRunLock, S3Store
from tests import s3_server

s3 = s3_server.s3
s3_env = s3_server.s3_env

HOLDER = textwrap.dedent("""
    import signal, sys, time
    from sweeps.store.lease import ObjectRunLock
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))  # the sweep's graceful stop
    ObjectRunLock.TTL, ObjectRunLock.BEAT = float(sys.argv[2]), float(sys.argv[3])
    lock = ObjectRunLock(sys.argv[1])
    try:
        lock.acquire()
        print("held", flush=True)
        time.sleep(float(sys.argv[4]))
    finally:
        lock.release()
""")


def _holder(s3, url, ttl, beat, hold) -> subprocess.Popen:
    env = dict(os.environ, **s3.env, PYTHONPATH=os.getcwd())
    p = subprocess.Popen([sys.executable, "-c", HOLDER, url, str(ttl), str(beat), str(hold)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held", p.stderr.read()
    return p


def _record(url) -> dict:
    return S3Store(url).get()[0]


@pytest.mark.distributed
def test_a_second_process_is_refused_while_the_first_holds_it(s3_env):
    url = f"s3://{s3_env.bucket()}/results/t"
    first = _holder(s3_env, url, 600, 0.3, 30)
    try:
        time.sleep(1.0)  # a few renewals, each read back
        with pytest.raises(FolderInUseError, match=rf"in use by another run \(pid {first.pid}"):
            guard.run_lock(url).acquire()
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(30) == 143
    assert _record(url)["released"] is True
    lock = guard.run_lock(url)
    assert lock.acquire() is None  # released cleanly: no takeover message
    lock.release()


@pytest.mark.distributed
def test_a_taken_over_holder_stops_and_never_releases_the_new_lock(s3_env):
    url = f"s3://{s3_env.bucket()}/results/t"
    # the first renews every 3 s; the second judges a record 0.5 s old lapsed (as a holder
    # stalled past its TTL would be judged) and takes it over
    first = _holder(s3_env, url, 600, 3.0, 60)
    lost = []
    second = ObjectRunLock(url, on_lost=lambda: lost.append(1))
    second.TTL, second.BEAT = 0.5, 600.0  # renews by hand below
    try:
        deadline = time.time() + 20
        while True:
            try:
                msg = second.acquire()
                break
            except FolderInUseError:
                assert time.time() < deadline
                time.sleep(0.2)
        assert msg and f"from pid {first.pid}" in msg and "lapsed" in msg
        assert first.wait(30) == 143  # saw the new owner at its renewal and stopped
        err = first.stderr.read()
        assert "lost the run lock" in err and "another run holds it now" in err, err
        rec = _record(url)
        assert rec["token"] == second.me["token"] and not rec.get("released")
        assert second.renew() and not lost  # still ours
    finally:
        second.release()
    assert _record(url)["released"] is True


@pytest.mark.distributed
def test_an_unreadable_record_is_held(s3_env):
    url = f"s3://{s3_env.bucket()}/results/t"
    fs = s3_env.filesystem()
    path = url[len("s3://"):] + "/" + guard.LOCK_FILE
    for garbage in (b"{not json", b"[]", b"x" * 10000):
        with fs.open_output_stream(path) as f:
            f.write(garbage)
        with pytest.raises(FolderInUseError, match=r"cannot be read .* treated as held") as e:
            guard.run_lock(url).acquire()
        assert "\n" not in str(e.value)
    for stale in ({"updated": "nan"}, {"updated": time.time() + 3600}, {"pid": 1}):
        with fs.open_output_stream(path) as f:
            f.write(json.dumps(stale).encode())
        with pytest.raises(FolderInUseError, match=r"in use by another run"):
            guard.run_lock(url).acquire()


@pytest.mark.distributed
def test_racing_for_a_free_lock_one_wins(s3_env):
    url = f"s3://{s3_env.bucket()}/results/t"
    got, refused = [], []
    locks = [ObjectRunLock(url, on_lost=lambda: None) for _ in range(4)]
    start = threading.Barrier(len(locks))

    def take(lock):
        start.wait()
        try:
            lock.acquire()
            got.append(lock)
        except FolderInUseError:
            refused.append(lock)

    threads = [threading.Thread(target=take, args=(lk,)) for lk in locks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(got) == 1 and len(refused) == 3
    got[0].release()


def test_a_holder_whose_record_another_wrote_loses_it(s3_env):
    url = f"s3://{s3_env.bucket()}/results/t"
    lost = []
    lock = ObjectRunLock(url, on_lost=lambda: lost.append(1))
    lock.acquire()
    store = S3Store(url)
    rec, version = store.get()
    store.replace(json.dumps({**rec, "token": "someone-else"}).encode(), version)
    assert lock.renew() is False and lost == [1] and lock.me is None
    lock.release()  # not ours: left as the other wrote it
    assert _record(url)["token"] == "someone-else" and not _record(url).get("released")
    with pytest.raises(Conflict):
        store.replace(b"{}", version)  # a stale version never lands


@pytest.mark.distributed
def test_a_holder_killed_on_this_machine_is_taken_over_at_once(s3_env):
    """kill -9 of a run: its lease (TTL 600 s) does not keep ``--resume`` out, because the
    record names this machine (host, boot id) and a process that is gone (PID plus start time).
    A record of another host, or of a live process, is still held."""
    url = f"s3://{s3_env.bucket()}/results/t"
    first = _holder(s3_env, url, 600, 0.3, 60)
    first.kill()
    first.wait()
    lock = ObjectRunLock(url)
    try:
        msg = lock.acquire()
        assert msg and f"from pid {first.pid}" in msg and "gone from this machine" in msg
    finally:
        lock.release()
    store = S3Store(url)
    for other in ({"host": "elsewhere"}, {"pid": os.getpid()}):  # another host; alive
        rec, version = store.get()
        store.replace(json.dumps({**rec, "pid": first.pid, **other, "released": False,
                                  "updated": time.time(), "token": "x"}).encode(), version)
        with pytest.raises(FolderInUseError, match="in use by another run"):
            ObjectRunLock(url).acquire()

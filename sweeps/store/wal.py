"""The results sink's row log segments (``rows/wal-NNNNNN.jsonl``): a local file with group
commit (docs/guarantees.md), or write-once objects on object storage. No fsync waits on Tune's
event loop: under a background Parquet rewrite an fsync waits for the journal to commit that
rewrite's dirty pages too.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from moe_core.fsio import fsync_dir

SYNC_S = 0.5
"""Seconds between the background fsyncs of the open segment (the most a machine crash loses
of a running trial's rows; a finished trial's rows are fsynced before its outcome is)."""


class LocalLog:
    """One local segment, appended to; fsynced in the background and by :meth:`sync`."""

    def __init__(self, path: Path):
        self.path = path
        self._f = open(path, "a")  # noqa: SIM115 - closed by close()
        self._lock = threading.Lock()  # fsync and close: never an fsync of a closed fd
        self._written = self._synced = 0
        self.closed = self._named = False

    def write(self, line: str) -> None:
        self._f.write(line)
        self._f.flush()  # in the kernel now: survives the driver process
        self._written += 1

    def sync(self) -> None:
        """fsync every line written before this call (a no-op if none is new)."""
        with self._lock:
            target = self._written
            if self.closed or target <= self._synced:
                return
            os.fsync(self._f.fileno())
            if not self._named:  # the new segment's directory entry, once
                fsync_dir(self.path.parent)
                self._named = True
            self._synced = max(self._synced, target)

    def close(self) -> None:
        """fsync what is left, then close."""
        self.sync()
        with self._lock:
            if not self.closed:
                self.closed = True
                self._f.close()


class ObjectLog:
    """The row log on object storage: each record one write-once object, durable when
    ``write`` returns (object storage has no append)."""

    closed = False

    def __init__(self, log_dir: Any, segment: int):
        self.log_dir, self.segment, self.seq = log_dir, segment, 0

    def write(self, line: str) -> None:
        self.seq += 1
        (self.log_dir / f"wal-{self.segment:06d}-{self.seq:08d}.jsonl").write_text(line)

    def sync(self) -> None:  # each write is durable already
        return None

    close = sync


class Syncer:
    """The background thread that fsyncs a sink's open segment every ``SYNC_S`` seconds."""

    def __init__(self, current: Any):
        self._current, self._stop = current, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="row-log-sync")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SYNC_S):
            log = self._current()
            if log is not None:
                log.sync()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

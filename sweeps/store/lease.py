"""The run lock of a results folder on object storage (``<results>/.run.lock``): a lease that
fails closed, written only with conditional puts (boto3 on S3: pyarrow's S3 filesystem has none;
google-cloud-storage on GCS, untested) and read back after each write. docs/reliability.md has
the protocol.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import parse_qs, urlparse

from moe_core.errors import UpcycleError, shown
from sweeps.store.trust import process_start

LOCK_FILE = ".run.lock"
"""The run lock of a results folder (``sweeps.run.guard``): a flocked file, or this lease object."""


class FolderInUseError(UpcycleError):
    """Another run holds the results folder."""


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read(64).strip() or None
    except OSError:
        return None


def holder_info() -> dict[str, Any]:
    """The record a run lock holds: host, pid and start time; the machine's boot id and the
    process's start time (``sweeps.store.trust.process_start``) tell a dead holder on this
    machine from a live one (:func:`dead_here`)."""
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "boot": _boot_id(),
            "proc_start": process_start(os.getpid())}


def dead_here(h: dict[str, Any]) -> bool:
    """Whether the holder ``h`` ran on this machine (same host name and boot) and is gone: no
    process with its pid, or one that started at another time (the pid was reused)."""
    pid, start = h.get("pid"), h.get("proc_start")
    if h.get("host") != socket.gethostname() or not h.get("boot") or h["boot"] != _boot_id() \
            or not isinstance(pid, int) or not isinstance(start, int):
        return False
    now = process_start(pid)
    return now is None or (now >= 0 and abs(now - start) > 2)


def describe_holder(h: dict[str, Any]) -> str:
    return f"pid {h.get('pid', '?')} on host {h.get('host', '?')} since {h.get('started', '?')}"

MAX_RECORD = 4096
"""Bytes of a lock record read at most (a bigger one is unreadable, hence held)."""


class Conflict(Exception):
    """A conditional write found another version than the one it named."""


class Unreadable(Exception):
    """The record exists (or may) but cannot be read or parsed: the lock is held."""


class LeaseStore(Protocol):
    """One object written only conditionally. ``version`` is S3's ETag or GCS's generation."""

    def get(self) -> tuple[dict[str, Any] | None, str | None]: ...  # (None, None): absent
    def create(self, body: bytes) -> None: ...  # Conflict when it exists
    def replace(self, body: bytes, version: str) -> None: ...  # Conflict unless at version


def _parse(body: bytes) -> dict[str, Any]:
    if len(body) > MAX_RECORD:
        raise Unreadable(f"the record is {len(body)} bytes")
    try:
        rec = json.loads(body.decode() or "null")
    except ValueError as e:
        raise Unreadable(f"the record is not JSON ({e})") from None
    if not isinstance(rec, dict):
        raise Unreadable("the record is not a JSON object")
    return rec


class S3Store:
    """The lease object on S3 (or an S3-protocol server) through boto3's conditional puts.
    Endpoint and region: the URL's ``endpoint_override`` / ``region`` / ``scheme`` query (as
    pyarrow reads them), else boto3's usual chain (``AWS_ENDPOINT_URL``, ``AWS_REGION``...)."""

    def __init__(self, url: str):
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise UpcycleError("results on s3:// need boto3 for the run lock's conditional "
                               "writes: pip install 'boto3>=1.36'") from None
        u = urlparse(url)
        q = {k: v[-1] for k, v in parse_qs(u.query).items()}
        endpoint = q.get("endpoint_override")
        if endpoint and "://" not in endpoint:
            endpoint = f"{q.get('scheme', 'https')}://{endpoint}"
        self.bucket = u.netloc
        self.key = "/".join(p for p in (u.path.strip("/"), LOCK_FILE) if p)
        self.client = boto3.client(
            "s3", endpoint_url=endpoint, region_name=q.get("region"),
            config=Config(connect_timeout=10, read_timeout=30, retries={"max_attempts": 3}))

    def _code(self, e: Exception) -> str:
        return str(getattr(e, "response", {}).get("Error", {}).get("Code", ""))

    def get(self) -> tuple[dict[str, Any] | None, str | None]:
        try:
            r = self.client.get_object(Bucket=self.bucket, Key=self.key)
            body = r["Body"].read(MAX_RECORD + 1)
        except Exception as e:  # noqa: BLE001 - botocore's errors: absent, or unreadable
            if self._code(e) in ("NoSuchKey", "404"):
                return None, None
            raise Unreadable(f"{type(e).__name__}: {shown(str(e), 160)}") from None
        return _parse(body), r["ETag"]

    def _put(self, body: bytes, **cond: str) -> None:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self.key, Body=body, **cond)
        except Exception as e:  # noqa: BLE001
            if self._code(e) in ("PreconditionFailed", "412", "ConditionalRequestConflict",
                                 "409"):
                raise Conflict(self._code(e)) from None
            raise OSError(f"{type(e).__name__}: {shown(str(e), 160)}") from None

    def create(self, body: bytes) -> None:
        self._put(body, IfNoneMatch="*")

    def replace(self, body: bytes, version: str) -> None:
        self._put(body, IfMatch=version)


class GCSStore:
    """The lease object on GCS through generation preconditions (google-cloud-storage; not
    installed by default, and not exercised by the tests: no GCS emulator here)."""

    def __init__(self, url: str):
        try:
            from google.api_core import exceptions
            from google.cloud import storage
        except ImportError:
            raise UpcycleError("results on gs:// need google-cloud-storage for the run lock's "
                               "conditional writes: pip install google-cloud-storage") from None
        u = urlparse(url)
        self.exc = exceptions
        self.blob = storage.Client().bucket(u.netloc).blob(
            "/".join(p for p in (u.path.strip("/"), LOCK_FILE) if p))

    def get(self) -> tuple[dict[str, Any] | None, str | None]:
        try:
            body = self.blob.download_as_bytes(timeout=30)
        except self.exc.NotFound:
            return None, None
        except Exception as e:  # noqa: BLE001
            raise Unreadable(f"{type(e).__name__}: {shown(str(e), 160)}") from None
        return _parse(body), str(self.blob.generation)

    def _put(self, body: bytes, generation: int) -> None:
        try:
            self.blob.upload_from_string(body, if_generation_match=generation, timeout=30)
        except self.exc.PreconditionFailed:
            raise Conflict("generation") from None

    def create(self, body: bytes) -> None:
        self._put(body, 0)

    def replace(self, body: bytes, version: str) -> None:
        self._put(body, int(version))


STORES: dict[str, Callable[[str], LeaseStore]] = {"s3": S3Store, "gs": GCSStore}


def _age(rec: dict[str, Any]) -> float:
    """Seconds since the record was renewed; 0 (fresh: held) when ``updated`` is not a
    finite number or lies in the future (another host's clock)."""
    try:
        updated = float(rec.get("updated"))
    except (TypeError, ValueError):
        return 0.0
    age = time.time() - updated
    return age if age == age and age > 0 else 0.0


def _stop_this_run() -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # the sweep's graceful stop (sweeps.signals)


class ObjectRunLock:
    """The lease (see the module docstring) on ``<url>/.run.lock``."""

    TTL, BEAT = 600.0, 60.0

    def __init__(self, url: str, store: LeaseStore | None = None,
                 on_lost: Callable[[], None] = _stop_this_run):
        self.url = url
        self.store = store or STORES[url.split("://", 1)[0]](url)  # boto3 etc.: only now
        self.on_lost = on_lost
        self.me: dict[str, Any] | None = None
        self.version: str | None = None
        self.lost: str | None = None
        self._stop = threading.Event()
        self._mu = threading.Lock()
        self._last_ok = time.time()

    def _body(self, **extra: Any) -> bytes:
        return json.dumps({**(self.me or {}), "updated": time.time(), **extra}).encode()

    def _read(self, doing: str) -> tuple[dict[str, Any] | None, str | None]:
        try:
            return self.store.get()
        except Unreadable as e:
            raise FolderInUseError(
                f"{self.url}: its run lock {LOCK_FILE} cannot be read ({e}) while {doing}, so it "
                "is treated as held; if no run uses this folder, delete that object") from None

    def _read_back(self, doing: str) -> None:
        """After a write: our token must be there; remember the version it is at."""
        rec, version = self._read(doing)
        if rec is None or rec.get("token") != (self.me or {}).get("token"):
            raise Conflict(describe_holder(rec) if rec else "the record is gone")
        self.version = version

    def acquire(self) -> str | None:
        old, version = self._read("taking it")
        if old is not None and not old.get("released") and _age(old) < self.TTL \
                and not dead_here(old):  # a holder killed on this machine: no need to wait
            raise FolderInUseError(
                f"{self.url} is in use by another run ({describe_holder(old)}; its lease was "
                f"renewed {_age(old):.0f} s ago); wait for it to end, or give this run another "
                "results location")
        self.me = {**holder_info(), "token": uuid.uuid4().hex}
        try:
            if old is None:
                self.store.create(self._body())
            else:
                self.store.replace(self._body(), version or "")
            self._read_back("taking it")
            self._last_ok = time.time()
        except Conflict:
            self.me = None
            raise FolderInUseError(f"{self.url}: another run took its lock at the same moment; "
                                   "wait for it to end, or give this run another results "
                                   "location") from None
        threading.Thread(target=self._renew, daemon=True, name="run-lock-lease").start()
        if old is not None and not old.get("released"):
            why = ("which is gone from this machine" if _age(old) < self.TTL else
                   f"whose lease lapsed {_age(old):.0f} s ago")
            return f"took over the lock of {self.url} from {describe_holder(old)}, {why}"
        return None

    def renew(self) -> bool:
        """One renewal; False when the lock was lost (then this run is stopped)."""
        with self._mu:
            if self.me is None:
                return False
            try:
                # a Conflict: another run's write, or ours not read back: the read decides
                with contextlib.suppress(Conflict):
                    self.store.replace(self._body(), self.version or "")
                self._read_back("renewing it")
                self._last_ok = time.time()
                return True
            except Conflict as e:
                why = f"another run holds it now: {e}"
            except (OSError, FolderInUseError) as e:  # retried next beat while the lease lasts
                if time.time() - self._last_ok < self.TTL - self.BEAT:
                    return True
                why = f"renewals failed for {time.time() - self._last_ok:.0f} s ({e})"
            self.lost, self.me = why, None  # never written again: not ours
        print(f"error: lost the run lock of {self.url} ({shown(self.lost, 200)}); stopping this "
              "run", file=sys.stderr)
        self.on_lost()
        return False

    def _renew(self) -> None:
        while not self._stop.wait(self.BEAT):
            if not self.renew():
                return

    def release(self) -> None:
        self._stop.set()
        with self._mu:
            if self.me is None:  # never held, or lost: not ours to write
                return
            # taken over, or unreachable: it lapses after TTL
            with contextlib.suppress(Conflict, OSError):
                self.store.replace(self._body(released=True), self.version or "")
            self.me = None

"""A real S3-protocol server for tests: moto's standalone server (``moto_server``, from the
``moto[server]`` dev extra) on 127.0.0.1 at a free port, in its own process, stopped by its PID.

``s3_server()`` is a context manager yielding an :class:`S3Server`; the ``s3`` pytest fixture
(module scope; import it into a test module or a conftest) wraps it. ``S3Server.env`` is what a
sweep's process needs to reach it through the provider's usual chain: the endpoint in
``AWS_ENDPOINT_URL`` and fake static credentials (``FAKE_SECRET``, which tests grep for in every
written file: it must appear in none).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sweeps.cluster.local import free_port

FAKE_SECRET = "FAKEsecretDoNotLeak0123456789abcdefXYZ"
"""The AWS_SECRET_ACCESS_KEY the tests hand to clients (moto accepts any)."""


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    """``http://127.0.0.1:PORT``."""
    pid: int
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables that point pyarrow/boto clients at this server."""

    def sweep_env(self, work, **extra: str) -> dict[str, str]:
        """The environment of a ``python -m sweeps.run`` child writing to this server: its
        endpoint and fake credentials, W&B off, the parent cache, staging, Ray's temp folder and
        the HMAC key file under ``work``, no inherited Ray address or HMAC key; plus ``extra``."""
        env = dict(os.environ, **self.env, WANDB_MODE="disabled",
                   UPCYCLE_CACHE=str(work / "cache"), UPCYCLE_STAGING=str(work / "staging"),
                   RAY_TMPDIR=str(work / "ray"),
                   UPCYCLE_SWEEPS_HMAC_KEY_FILE=str(work / "cfg" / "hmac.key"), **extra)
        env.pop("RAY_ADDRESS", None)
        env.pop("UPCYCLE_SWEEPS_HMAC_KEY", None)
        return env

    def reader_env(self, work) -> dict[str, str]:
        """What a reader of a sweep's results (analysis, ``read_rows``) needs in its environment:
        the endpoint, the fake credentials and the HMAC key file the sweep signed with."""
        return {**self.env, "UPCYCLE_SWEEPS_HMAC_KEY_FILE": str(work / "cfg" / "hmac.key")}

    def bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh unique one by default) and return its name."""
        name = name or f"b-{uuid.uuid4().hex[:12]}"
        self.filesystem().create_dir(name)
        return name

    def filesystem(self):
        """A pyarrow S3FileSystem on this server (static fake credentials)."""
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(
            access_key=self.env["AWS_ACCESS_KEY_ID"], secret_key=FAKE_SECRET,
            endpoint_override=self.endpoint, scheme="http", region="us-east-1",
            allow_bucket_creation=True, allow_bucket_deletion=True)

    def bytes_stored(self, bucket: str) -> int:
        """Total size of every object in ``bucket``."""
        import pyarrow.fs as pafs

        infos = self.filesystem().get_file_info(pafs.FileSelector(bucket, recursive=True))
        return sum(i.size or 0 for i in infos if i.type == pafs.FileType.File)


def _moto_server_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("moto_server")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("moto_server")
    if found:
        return [found]
    return [sys.executable, "-m", "moto.server"]


@contextlib.contextmanager
def s3_server(timeout_s: float = 60.0, auth_after: int | None = None) -> Iterator[S3Server]:
    """Start ``moto_server`` on 127.0.0.1 at a free port; stop that process (and only it) at
    exit. ``auth_after=N``: the server checks credentials and IAM policies after its first N
    requests (moto's ``INITIAL_NO_AUTH_ACTION_COUNT``), for access-denied cases."""
    pytest.importorskip("moto", reason="moto[server] (the dev extra) is not installed")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([*_moto_server_cmd(), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True,
                            env=dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT=str(auth_after))
                            if auth_after is not None else None)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(endpoint + "/moto-api/", timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start on {endpoint}") from None
                time.sleep(0.2)
        env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": FAKE_SECRET, "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
        yield S3Server(endpoint, proc.pid, env)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # its own session: only what it started
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    """A running moto S3 server for the module's tests."""
    with s3_server() as server:
        yield server


@pytest.fixture
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """``s3`` with its endpoint and fake credentials in this process's environment."""
    for k, v in s3.env.items():
        monkeypatch.setenv(k, v)
    return s3

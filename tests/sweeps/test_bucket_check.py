"""The bucket is checked before anything launches (``moe_core.location.probe``, run by the dry
run and the run): a HEAD on the bucket and a probe write and delete, one attempt with a short
timeout. Every bad case is one line that keeps the provider's message and names the fix, in
under 2 s: an endpoint that stalls (a 127.0.0.1 socket that accepts and never answers), one that
refuses (a closed port), a missing bucket, credentials the server does not know, a prefix the
credentials may read but not write (moto with its IAM checks on), and a wrong scheme. The run
itself stops there with exit 2 before Ray starts."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from moe_core.errors import ConfigError
from moe_core.location import Location, probe
from tests.s3_server import S3Server, s3_server
from tests.sweeps.tiny import tiny_base

LIMIT_S = 2.0


@pytest.fixture(scope="module")
def iam_s3() -> Iterator[tuple[S3Server, str, dict[str, str]]]:
    """A moto server that checks credentials and IAM policies after its first requests: a
    bucket, a user allowed everything and one allowed only to list and read it; yields the
    server, the bucket and each user's key pair."""
    boto3 = pytest.importorskip("boto3")
    from botocore.exceptions import ClientError

    with s3_server(auth_after=20) as s3:
        bucket = s3.bucket()
        iam = boto3.client("iam", endpoint_url=s3.endpoint, region_name="us-east-1",
                           aws_access_key_id="testing", aws_secret_access_key="x")
        keys = {}
        for user, actions in (("writer", ["s3:*"]), ("reader", ["s3:List*", "s3:Get*",
                                                                "s3:HeadBucket"])):
            iam.create_user(UserName=user)
            doc = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions,
                                                           "Resource": "*"}]}
            iam.put_user_policy(UserName=user, PolicyName="p", PolicyDocument=json.dumps(doc))
            k = iam.create_access_key(UserName=user)["AccessKey"]  # 4, 7
            keys[user] = f"{k['AccessKeyId']}:{k['SecretAccessKey']}"
        for _ in range(20):  # use up the requests moto lets through unchecked
            try:
                iam.list_users()
            except ClientError:
                break
        else:
            raise AssertionError("moto never started checking credentials")
        yield s3, bucket, keys


@pytest.fixture
def stalled() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a server that accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.1)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join(timeout=5)
    srv.close()
    for c in held:
        c.close()


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed when the block ends


def _use(monkeypatch, s3: S3Server, endpoint: str | None = None, key: str | None = None):
    for k, v in s3.env.items():
        monkeypatch.setenv(k, v)
    if endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    if key:
        kid, secret = key.split(":")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", kid)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)


def _refused(url: str) -> tuple[str, float]:
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e:
        probe(url)
    took = time.monotonic() - t0
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"results={url}") or "s4://" in line, line
    print(f"\n{took:.2f} s: {line}")  # the figures the report quotes (pytest -s)
    assert took < LIMIT_S, (took, line)
    return line, took


def test_every_bad_bucket_is_one_line_with_the_providers_message_in_under_2_s(
        iam_s3, stalled, monkeypatch):
    s3, bucket, keys = iam_s3
    _use(monkeypatch, s3, key=keys["writer"])
    assert probe(f"s3://{bucket}/sweeps") < LIMIT_S  # the good case: HEAD, write, delete
    assert Location.of(f"s3://{bucket}").files() == []  # the probe object was deleted

    line, _ = _refused("s3://no-such-bucket-x/sweeps")
    assert "does not exist" in line and "aws s3 mb s3://no-such-bucket-x" in line
    _use(monkeypatch, s3, key="AKIAUNKNOWN000000000:nope")
    line, _ = _refused(f"s3://{bucket}/sweeps")
    assert "ACCESS_DENIED during HeadBucket" in line and "instance profile" in line
    _use(monkeypatch, s3, key=keys["reader"])
    line, _ = _refused(f"s3://{bucket}/sweeps")
    assert "probe write" in line and "ACCESS_DENIED" in line and "write" in line
    _use(monkeypatch, s3, endpoint=stalled, key=keys["writer"])
    line, took = _refused(f"s3://{bucket}/sweeps")
    assert "Timeout was reached" in line and "UPCYCLE_S3_PROBE_TIMEOUT_S" in line
    assert took >= 0.5  # it did wait for the (stalled) server, once
    _use(monkeypatch, s3, endpoint=_closed_port(), key=keys["writer"])
    line, _ = _refused(f"s3://{bucket}/sweeps")
    assert "Could not connect" in line and "nothing answers" in line
    line, _ = _refused("s4://bucket/sweeps")
    assert "unknown storage scheme s4://" in line


def test_timeouts_and_retries_are_explicit(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", _closed_port())
    monkeypatch.setenv("UPCYCLE_S3_CONNECT_TIMEOUT_S", "3")
    monkeypatch.setenv("UPCYCLE_S3_REQUEST_TIMEOUT_S", "7")
    kw = Location.of("s3://bucket/x?region=us-east-1").fs.__reduce__()[1][0]
    assert (kw["connect_timeout"], kw["request_timeout"]) == (3.0, 7.0)
    monkeypatch.setenv("UPCYCLE_S3_MAX_ATTEMPTS", "zero")
    with pytest.raises(ConfigError, match="UPCYCLE_S3_MAX_ATTEMPTS='zero' must be a number"):
        Location.of("s3://bucket/x?region=us-east-1")


@pytest.mark.slow
def test_the_run_stops_before_ray_on_a_stalled_endpoint(tmp_path, stalled):
    spec = {"sweep": "probe", "base": tiny_base(), "results": "s3://bucket/sweeps",
            "logging": {"wandb": {"enabled": False}}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path.cwd()), "AWS_ENDPOINT_URL": stalled,
           "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true", "RAY_TMPDIR": str(tmp_path / "ray"),
           "HOME": str(tmp_path), "WANDB_MODE": "disabled"}
    for extra in ((), ("--dry-run",)):
        out = subprocess.run([sys.executable, "-m", "sweeps.run", str(tmp_path / "spec.yaml"),
                              *extra], env=env, cwd=tmp_path, capture_output=True, text=True,
                             timeout=120)
        err = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(err) == 1, out.stderr
        assert err[0].startswith("error: results: s3://bucket/sweeps: HEAD of bucket bucket")
        assert "Timeout was reached" in err[0]
        assert not (tmp_path / "ray").exists()  # Ray never started


def test_analysis_fit_reads_a_sweep_in_the_bucket(iam_s3, monkeypatch, capsys):
    """``analysis.fit s3://…`` (the other readers are run on a real sweep's bucket in
    test_storage_e2e): six final rows on L = 1.7 + 400·D^−0.5, written to the bucket, fitted
    back."""
    from analysis.cli import fit_main
    from sweeps.store.results import write_rows

    s3, bucket, keys = iam_s3
    _use(monkeypatch, s3, key=keys["writer"])
    rows = [{"trial_id": f"t{i}", "step": 10, "status": "ok", "sweep": "f", "tokens": d,
             "val_loss": 1.7 + 400.0 / d ** 0.5} for i, d in enumerate(
                 [1e6, 2e6, 4e6, 8e6, 16e6, 32e6])]
    write_rows(f"s3://{bucket}/r/f/results.parquet", rows)
    capsys.readouterr()
    assert fit_main([f"s3://{bucket}/r/f", "--law", "chinchilla_d", "--columns",
                     "D=tokens,L=val_loss", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["n"] == 6
    assert got["params"] == pytest.approx({"A": 400.0, "alpha": 0.5, "E": 1.7}, rel=1e-4)

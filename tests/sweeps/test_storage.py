"""The storage layer (sweeps.store.storage, sweeps.store.signing) on a local disk and on a real
S3-protocol server (moto's, started by tests/s3_server.py): fast unit tests; the sweep itself is in
test_storage_e2e.py."""

from __future__ import annotations

import os
import pickle
import stat

import pyarrow.fs as pafs
import pytest

from moe_core.errors import ConfigError, UpcycleError
from sweeps.run.parents import fetch, publish
from sweeps.spec.sweep import parse_spec
from sweeps.store import signing
from sweeps.store.results import read_rows, read_table, write_rows, write_summary
from sweeps.store.sink import ResultsSink
from sweeps.store.storage import Location, check_uri, join_uri, publishing, staging_dir
from sweeps.store.trust import UntrustedStateError
from tests import s3_server
from tests.s3_server import FAKE_SECRET
from tests.sweeps.tiny import tiny_base

s3, s3_env = s3_server.s3, s3_server.s3_env  # the moto server fixtures


@pytest.fixture(autouse=True)
def _key(tmp_path, monkeypatch):
    monkeypatch.setenv(signing.KEY_FILE_ENV, str(tmp_path / "cfg" / "hmac.key"))
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    monkeypatch.setenv("UPCYCLE_STAGING", str(tmp_path / "staging"))


# ---- naming and validation ---------------------------------------------------------------------


def test_check_uri_names_the_key_and_the_fix():
    check_uri("results", "results")
    check_uri("s3://b/x", "results")
    with pytest.raises(ConfigError, match=r"results='ftp://b/x': unknown storage scheme ftp://"):
        check_uri("ftp://b/x", "results")
    with pytest.raises(ConfigError, match=r"storage.parent_cache='s3://' names no bucket"):
        check_uri("s3://", "storage.parent_cache")
    with pytest.raises(ConfigError, match="results: the URL carries credentials") as e:
        check_uri("s3://AKIA:hunter2@b/x", "results")
    assert "hunter2" not in str(e.value)
    with pytest.raises(ConfigError, match="carries credentials"):
        check_uri("s3://b/x?secret_key=hunter2", "results")


def test_spec_keeps_a_url_as_a_url():
    spec = parse_spec({"sweep": "s", "base": tiny_base(), "results": "s3://bkt/runs/"})
    assert spec.results_uri == "s3://bkt/runs/s"
    with pytest.raises(ConfigError, match="object storage, not a local folder"):
        spec.results_dir  # noqa: B018 - the property raises
    local = parse_spec({"sweep": "s", "base": tiny_base(), "results": "out"})
    assert local.results_uri == os.path.join("out", "s")
    with pytest.raises(ConfigError, match="results='gopher://x/y'"):
        parse_spec({"sweep": "s", "base": tiny_base(), "results": "gopher://x/y"})
    with pytest.raises(ConfigError, match="storage.parent_cache='hdfs://n/p'"):
        parse_spec({"sweep": "s", "base": tiny_base(), "storage": {"parent_cache": "hdfs://n/p"}})


def test_join_uri_and_staging_never_name_a_folder_after_the_url(tmp_path):
    assert join_uri("s3://b/x/", "y", "/z") == "s3://b/x/y/z"
    assert join_uri("rel", "a") == os.path.join("rel", "a")
    loc = Location(pafs.S3FileSystem(anonymous=True, region="us-east-1"), "b/x", "s3://b/x")
    d = staging_dir(loc)
    assert d.parent == tmp_path / "staging" and "s3" not in d.name and "b" != d.name
    assert len(d.name) == 20


# ---- the local fast path ------------------------------------------------------------------------


def test_local_location_reads_writes_lists_moves(tmp_path):
    loc = Location.of(tmp_path / "r")
    assert loc.is_local and loc.local_path == tmp_path / "r" and not loc.exists()
    (loc / "a" / "b.txt").local_path.parent.mkdir(parents=True)
    (loc / "a" / "b.txt").write_text("hello")
    assert (loc / "a/b.txt").read_text() == "hello" and loc.is_dir()
    assert loc.files() == ["a/b.txt"] and loc.size() == 5
    assert not list((tmp_path / "r" / "a").glob(".*.tmp"))  # atomic: no temp file left
    (loc / "a").move_to(loc / "c")
    assert loc.files() == ["c/b.txt"]
    (loc / "c").delete()
    assert loc.files() == []


def test_publishing_is_the_folder_itself_locally(tmp_path):
    with publishing(str(tmp_path / "exp" / "t1"), "config.json") as d:
        assert d == tmp_path / "exp" / "t1"


# ---- object storage -----------------------------------------------------------------------------


def test_s3_location_round_trip(s3_env):
    b = s3_env.bucket()
    loc = Location.of(f"s3://{b}/sweep/")
    assert not loc.is_local and loc.uri == f"s3://{b}/sweep" and loc.path == f"{b}/sweep"
    assert not loc.exists() and loc.files() == []
    (loc / "x" / "y.json").write_text('{"a": 1}')
    assert loc.is_dir() and (loc / "x/y.json").is_file()
    assert (loc / "x/y.json").read_text() == '{"a": 1}' and loc.files() == ["x/y.json"]
    (loc / "x").move_to(loc / "z")
    assert loc.files() == ["z/y.json"]
    loc.delete()
    assert not loc.exists()
    with pytest.raises(ValueError, match="is object storage"):
        loc.local_path  # noqa: B018


def test_upload_writes_the_manifest_last_and_download_fetches_whole(s3_env, tmp_path):
    b = s3_env.bucket()
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for name in ("meta.json", "a.bin", "sub/z.bin"):
        (src / name).write_bytes(name.encode() * 3)
    order: list[str] = []

    class Recording(Location):
        __slots__ = ()

        def write_bytes(self, data):  # the order objects are PUT in
            order.append(self.path.rsplit("/", 1)[-1])
            return super().write_bytes(data)

    loc = Location.of(f"s3://{b}/p")
    rec = Recording(loc.fs, loc.path, loc.uri)
    assert rec.upload_dir(src, last=("meta.json",)) == sum(
        len(n.encode() * 3) for n in ("meta.json", "a.bin", "sub/z.bin"))
    assert order[-1] == "meta.json" and sorted(order) == ["a.bin", "meta.json", "z.bin"]
    got = loc.download_dir(tmp_path / "got")
    assert sorted(p.relative_to(got).as_posix() for p in got.rglob("*") if p.is_file()) == \
        ["a.bin", "meta.json", "sub/z.bin"]
    assert (got / "sub/z.bin").read_bytes() == b"sub/z.bin" * 3


def test_results_and_summary_on_s3(s3_env):
    b = s3_env.bucket()
    url = f"s3://{b}/r/sw"
    write_rows(join_uri(url, "results.parquet"),
               [{"trial_id": "t1", "step": 0, "val_loss": 2.0},
                {"trial_id": "t1", "step": 2, "val_loss": 1.5}])
    assert [r["val_loss"] for r in read_rows(url)] == [2.0, 1.5]  # the folder or the file
    assert read_table(join_uri(url, "nothing")) is None
    write_summary(url, {"sweep": "sw", "ok": 1})
    assert '"ok": 1' in Location.of(url).join("summary.json").read_text()


_READ_ROWS = ("import sys; from sweeps.store.results import read_rows; "
              "print(sorted(r['step'] for r in read_rows(sys.argv[1])))")


@pytest.mark.slow
def test_reading_a_bucket_exits_cleanly(s3_env):
    """A process that read a bucket's results exits 0. Read by pyarrow's threaded dataset scan,
    the object (verified bytes Python owns) could be let go on one of Arrow's threads after
    the interpreter began to exit: "terminate called without an active exception", rc 134, in
    about 1 reader of 8 (17 of 120 before the fix, 0 of 160 after; the chance that 12 pass
    with the old reader is about 0.2)."""
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    b = s3_env.bucket()
    url = f"s3://{b}/r/sw"
    write_rows(join_uri(url, "results.parquet"),
               [{"trial_id": "t1", "step": s, "val_loss": 2.0 - s / 10} for s in range(3)])
    env = dict(os.environ, PYTHONPATH=os.getcwd(), OMP_NUM_THREADS="1")

    def read(_: int) -> tuple[int, str]:
        out = subprocess.run([sys.executable, "-c", _READ_ROWS, url], env=env,
                             capture_output=True, text=True, timeout=120)
        return out.returncode, out.stdout.strip() or out.stderr[-300:]

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(read, range(12)))
    assert results == [(0, "[0, 1, 2]")] * 12


def test_a_wandb_workspace_of_results_on_s3(s3_env, capsys, monkeypatch):
    """``upcycle-sweeps wandb-workspace s3://...`` reads the results from the bucket and writes
    its definition there (the panels themselves: tests/analysis/test_wandb_workspace.py)."""
    from analysis.wandb_workspace import DEFINITION_FILE, main

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    url = f"s3://{s3_env.bucket()}/r/sw"
    write_rows(join_uri(url, "results.parquet"),
               [{"sweep": "sw", "trial_id": "t1", "status": "ok", "knob.optim.lr": 1e-3,
                 "step": s, "val_loss": v, "router.max_load.layer0": 0.5,
                 "router.max_load.worst": 0.5} for s, v in ((0, 2.0), (2, 1.5))])
    assert main([url]) == 0
    assert f"written to {url}/{DEFINITION_FILE} (not saved" in capsys.readouterr().out
    text = Location.of(url).join(DEFINITION_FILE).read_text()
    for name in ("config:knob.value.optim.lr", "summary:val_loss", "health/layer0/max_load",
                 "health/worst/max_load"):
        assert f'"{name}"' in text, name


def test_sink_on_s3_logs_each_row_as_an_object_and_rebuilds(s3_env):
    b = s3_env.bucket()
    url = f"s3://{b}/r/sw"
    sink = ResultsSink(url, flush_s=3600)
    assert sink.remote
    sink.add({"trial_id": "t1", "step": 0, "val_loss": 2.0, "status": "running"})
    sink.add({"trial_id": "t1", "step": 2, "val_loss": 1.5, "status": "running"})
    sink.mark("t1", "ok")
    log = Location.of(url).signed() / "rows"  # each row object signed (issue 43)
    assert log.files() == ["wal-000001-00000001.jsonl", "wal-000001-00000002.jsonl",
                           "wal-000001-00000003.jsonl"]
    assert len((Location.of(url) / "rows").files()) == 6  # with their sidecars
    again = ResultsSink(url)  # the driver killed before any rewrite: the log is the record
    rep = again.load()
    assert rep.from_log == 2 and {r["status"] for r in again.rows.values()} == {"ok"}
    sink.close()  # the rewrite covers the log: its objects go
    assert log.files() == [] and len(read_rows(url)) == 2
    third = ResultsSink(pickle.loads(pickle.dumps(url)))
    assert third.load().from_parquet == 2


# ---- signing ------------------------------------------------------------------------------------


def test_key_file_is_created_private_and_a_shared_one_refused(tmp_path, monkeypatch):
    key = signing.load_key()
    path = tmp_path / "cfg" / "hmac.key"
    assert len(key) == 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert signing.load_key() == key  # the same key next time
    path.chmod(0o640)
    with pytest.raises(UpcycleError, match="refusing the HMAC key .* mode 0600"):
        signing.load_key()
    monkeypatch.setenv(signing.KEY_ENV, "ab" * 32)
    assert signing.load_key() == bytes([0xAB]) * 32
    monkeypatch.setenv(signing.KEY_ENV, "not hex")
    with pytest.raises(UpcycleError, match="must be hex"):
        signing.load_key()


def test_digest_matches_hand_computation():
    import hashlib
    import hmac

    want = hmac.new(b"k", b"upcycle-sweeps/hmac/v1\0b/x.pkl\0data", hashlib.sha256).hexdigest()
    assert signing.digest(b"k", "b/x.pkl", b"data") == want


def test_signed_filesystem_refuses_tampered_unsigned_and_moved_files(s3_env, tmp_path):
    b = s3_env.bucket()
    raw = Location.of(f"s3://{b}/tune")
    signed = raw.signed()
    assert signed.signed() is signed and Location.of(tmp_path).signed().is_local
    payload = pickle.dumps({"state": 1})
    (signed / "t1" / "state.pkl").write_bytes(payload)
    assert raw.files() == ["t1/state.pkl", "t1/state.pkl" + signing.SUFFIX]
    assert signed.files() == ["t1/state.pkl"]  # sidecars hidden from Tune's listings
    assert (signed / "t1/state.pkl").read_bytes() == payload
    assert signing.verify_tree(raw.fs, raw.path) == 1
    # pyarrow's own copy (what Ray's storage uses) goes through the checks too
    pafs.copy_files(signed.path, str(tmp_path / "dl"), source_filesystem=signed.fs)
    assert (tmp_path / "dl" / "t1" / "state.pkl").read_bytes() == payload

    (raw / "t1" / "state.pkl").write_bytes(pickle.dumps({"state": 2}))  # tampered
    with pytest.raises(UntrustedStateError, match="refusing to load .*state.pkl: its HMAC"):
        (signed / "t1/state.pkl").read_bytes()
    with pytest.raises(UntrustedStateError, match="digest does not match"):
        signing.verify_tree(raw.fs, raw.path)
    (raw / "t1" / "evil.pkl").write_bytes(b"x")  # no digest at all
    with pytest.raises(UntrustedStateError, match="evil.pkl: it has no HMAC digest"):
        (signed / "t1/evil.pkl").read_bytes()
    # a signed object and its sidecar copied to another key: the digest binds the path
    (signed / "good.pkl").write_bytes(payload)
    raw.fs.copy_file(f"{raw.path}/good.pkl", f"{raw.path}/t1/other.pkl")
    raw.fs.copy_file(f"{raw.path}/good.pkl{signing.SUFFIX}",
                     f"{raw.path}/t1/other.pkl{signing.SUFFIX}")
    with pytest.raises(UntrustedStateError, match="other.pkl: its HMAC"):
        (signed / "t1/other.pkl").read_bytes()


def test_signed_filesystem_pickles_without_key_or_credentials(s3_env):
    b = s3_env.bucket()
    signed = Location.of(f"s3://{b}/x").signed()
    blob = pickle.dumps(signed)
    key = signing.load_key()
    assert FAKE_SECRET.encode() not in blob
    assert key not in blob and key.hex().encode() not in blob
    back = pickle.loads(blob)
    (back / "f.pkl").write_bytes(b"123")
    assert (signed / "f.pkl").read_bytes() == b"123"


def test_parent_folders_publish_and_fetch_verified(s3_env, tmp_path):
    b = s3_env.bucket()
    remote = Location.of(f"s3://{b}/parents/abc").signed()
    src = tmp_path / "src" / "abc"
    src.mkdir(parents=True)
    (src / "model.pt").write_bytes(b"weights")
    assert not fetch(remote, tmp_path / "dst" / "abc", "meta.json")  # nothing published yet
    publish(remote, src, "meta.json")  # no manifest: not published
    assert not remote.exists()
    (src / "meta.json").write_text("{}")
    publish(remote, src, "meta.json")
    assert fetch(remote, tmp_path / "dst" / "abc", "meta.json")
    assert (tmp_path / "dst" / "abc" / "model.pt").read_bytes() == b"weights"
    raw = Location.of(f"s3://{b}/parents/abc")
    (raw / "model.pt").write_bytes(b"evil")
    with pytest.raises(UntrustedStateError, match="model.pt"):
        fetch(remote, tmp_path / "dst2" / "abc", "meta.json")
    assert not (tmp_path / "dst2" / "abc").exists()


def test_publishing_uploads_then_removes_the_staging_copy(s3_env, tmp_path):
    b = s3_env.bucket()
    with publishing(f"s3://{b}/export/t1", "config.json") as d:
        assert d.parent == tmp_path / "staging"
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"w")
        (d / "config.json").write_text("{}")
    assert not d.exists()
    assert Location.of(f"s3://{b}/export/t1").files() == ["config.json", "model.safetensors"]


_COPY_MANY = """
import os, sys, tempfile, pathlib
import pyarrow as pa, pyarrow.fs as pafs
pa.set_io_thread_count(2)
from sweeps.store.storage import Location
d = pathlib.Path(tempfile.mkdtemp())
for i in range(12):
    (d / f"f{i}.bin").write_bytes(os.urandom(2000))
loc = Location.of(sys.argv[1]).signed()
pafs.copy_files(str(d), loc.path + "/ck", destination_filesystem=loc.fs)
print(len(loc.join("ck").files()))
"""


def test_copy_files_into_the_signed_filesystem_does_not_deadlock(s3_env, tmp_path):
    """Ray uploads with pyarrow's copy_files, which closes each file on Arrow's IO pool: with
    S3 background writes, each close waits for an upload queued on that same pool, and with
    more files than IO threads nothing ever runs again (this hung a whole sweep)."""
    import subprocess
    import sys

    b = s3_env.bucket()
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    out = subprocess.run([sys.executable, "-c", _COPY_MANY, f"s3://{b}/x"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["12"], out.stderr[-2000:]


def test_aws_keys_leave_the_environment_for_a_private_file(s3_env, monkeypatch):
    """Ray's runtime-env agent logs its environment: the driver moves the keys into a private
    credentials file first, and S3 still works through the SDK's profile provider."""
    from sweeps.store.trust import hide_cloud_keys

    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")  # restored after
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    path = hide_cloud_keys()
    assert "AWS_SECRET_ACCESS_KEY" not in os.environ and "AWS_ACCESS_KEY_ID" not in os.environ
    assert os.environ["AWS_SHARED_CREDENTIALS_FILE"] == str(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert f"aws_secret_access_key = {FAKE_SECRET}" in path.read_text()
    b = s3_env.bucket()
    loc = Location.of(f"s3://{b}/x")
    (loc / "a.txt").write_text("ok")
    assert (loc / "a.txt").read_text() == "ok"
    assert hide_cloud_keys() is None  # nothing left to move


def test_driver_locations_on_s3(s3_env):
    """The driver's results folder on S3: a fresh run moves an earlier one aside (copy, then
    delete); --resume checks every Tune file's digest first; algorithm: law keeps its design's
    state there and a new searcher reads it back."""
    import dataclasses

    from sweeps.run.driver import archive_previous, results_location

    b = s3_env.bucket()
    spec = parse_spec({"sweep": "s", "base": tiny_base(), "results": f"s3://{b}/r"})
    loc = results_location(spec, resume=False)
    assert isinstance(loc, Location) and loc.uri == f"s3://{b}/r/s"
    assert archive_previous(loc) is None  # nothing there yet
    (loc / "results.parquet").write_bytes(b"old")
    (loc.signed() / "tune" / "tuner.pkl").write_bytes(b"state")
    prev = archive_previous(loc)
    assert prev is not None and not (loc / "results.parquet").exists()
    assert sorted(prev.files()) == ["results.parquet", "tune/tuner.pkl",
                                    "tune/tuner.pkl" + signing.SUFFIX]
    (loc.signed() / "tune" / "tuner.pkl").write_bytes(b"state")
    (loc.signed() / "tune" / "experiment_state-2026.json").write_text(
        '{"trial_data": [], "runner_data": {}}')  # read as Tune will (sweeps.resume)
    assert results_location(spec, resume=True) == loc  # every digest checks out
    (loc / "tune" / "tuner.pkl").write_bytes(b"tampered")
    with pytest.raises(UntrustedStateError, match="tuner.pkl: its HMAC"):
        results_location(spec, resume=True)
    from sweeps.law.config import parse_law_block
    from sweeps.law.design import Candidate
    from sweeps.law.searcher import STATE_FILE, LawSearcher, read_law_state

    law = parse_law_block({"law": "eq8", "target": "alpha3", "max_trials": 4,
                           "seed_trials": 2, "bootstrap": 8, "fix": {"E": 1.0}})
    cands = [Candidate({"D1": d1, "D2": d2}, {"parent.tokens": d1, "tokens": d2}, 6 * d2)
             for d1 in (1e3, 2e3) for d2 in (1e3, 2e3)]
    law_loc = results_location(dataclasses.replace(spec, algorithm="law"), resume=False)
    s1 = LawSearcher(law, cands, state_dir=law_loc)
    first = s1.suggest("t1")
    assert (law_loc / STATE_FILE).exists() and read_law_state(law_loc)["trials"] == s1.trials
    s2 = LawSearcher(law, cands, state_dir=law_loc)  # a resumed driver reads it back
    assert s2.suggest("t1") == first and s2.trials == s1.trials


def test_one_run_per_results_location_on_s3(s3_env, monkeypatch):
    """The lease lock on object storage: a second run is refused naming the holder; a released
    lock is taken without a word; a lease that was not renewed is taken over with a message."""
    from sweeps.run import guard
    from sweeps.store import lease

    url = f"s3://{s3_env.bucket()}/r/s"
    first = guard.run_lock(url)
    assert first.acquire() is None
    with pytest.raises(guard.FolderInUseError, match=r"in use by another run \(pid \d+ on host"):
        guard.run_lock(url).acquire()
    first.release()
    second = guard.run_lock(url)
    assert second.acquire() is None  # released: no message
    monkeypatch.setattr(lease.ObjectRunLock, "TTL", 0.0)  # its lease has lapsed
    third = guard.run_lock(url)
    msg = third.acquire()
    assert msg and "took over the lock" in msg and "lease lapsed" in msg
    third.release()
    second.release()

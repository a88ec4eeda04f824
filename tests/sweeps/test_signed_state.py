"""Signed state that survives a kill at any instant and signatures with teeth (issue 43, classes
3 and 4). In process, on a local filesystem under the signing layer (``sweeps.store.signing``
signs any pyarrow filesystem the same way; S3 is the same code over ``S3FileSystem``): a fault
injected at each whole-object write of a sequence of state writes leaves every file readable,
old or new; keys under 32 bytes are refused; a forged, unsigned, re-signed-elsewhere or
injected object is refused in one line naming it; on the S3 server an injected row never
reaches the results."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from moe_core.errors import UpcycleError
from sweeps.store import signing
from sweeps.store.trust import UntrustedStateError
from tests import s3_server

s3 = s3_server.s3
s3_env = s3_server.s3_env


@pytest.fixture(autouse=True)
def _key(tmp_path, monkeypatch):
    monkeypatch.setenv(signing.KEY_FILE_ENV, str(tmp_path / "cfg" / "hmac.key"))
    monkeypatch.delenv(signing.KEY_ENV, raising=False)


# ---- keys ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 16, 31])
def test_short_keys_are_refused_in_one_line(tmp_path, monkeypatch, n):
    monkeypatch.setenv(signing.KEY_ENV, "ab" * n)
    with pytest.raises(UpcycleError, match=rf"{n}-byte HMAC key; use at least 32") as e:
        signing.load_key()
    assert "\n" not in str(e.value)
    monkeypatch.delenv(signing.KEY_ENV)
    path = tmp_path / "cfg" / "hmac.key"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("ab" * n)
    path.chmod(0o600)
    with pytest.raises(UpcycleError, match=rf"key file .*{n}-byte HMAC key"):
        signing.load_key()


def test_a_32_byte_key_and_a_garbage_key_file(tmp_path, monkeypatch):
    monkeypatch.setenv(signing.KEY_ENV, "cd" * 32)
    assert signing.load_key() == b"\xcd" * 32
    monkeypatch.delenv(signing.KEY_ENV)
    assert len(signing.load_key()) == 32  # created: 32 random bytes, outside any bucket
    (tmp_path / "cfg" / "hmac.key").write_text("not hex at all")
    with pytest.raises(UpcycleError, match=r"key file .* must be hex"):
        signing.load_key()


# ---- a kill at any instant ----------------------------------------------------------------------


class _Killed(Exception):
    pass


class _FaultyPuts(pafs.FileSystemHandler):
    """A local filesystem whose every write is one whole object landing at close (as a PUT: all
    or nothing), and whose ``kill_at``-th write and everything after it never lands (the
    process died there)."""

    def __init__(self, root: str, kill_at: int):
        self.fs, self.root, self.kill_at, self.puts = pafs.LocalFileSystem(), root, kill_at, 0

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    def get_type_name(self):
        return "faulty-puts"

    def normalize_path(self, path):
        return path

    def get_file_info(self, paths):
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.fs.get_file_info(selector)

    def create_dir(self, path, recursive):
        self.fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise OSError("no")

    def delete_file(self, path):
        self.fs.delete_file(path)

    def move(self, src, dest):
        self.fs.move(src, dest)

    def copy_file(self, src, dest):
        self.fs.copy_file(src, dest)

    def open_input_stream(self, path):
        return self.fs.open_input_stream(path)

    def open_input_file(self, path):
        return self.fs.open_input_file(path)

    def open_output_stream(self, path, metadata):
        handler = self

        class Put:
            def __init__(self):
                self.parts, self.closed = [], False

            def write(self, b):
                self.parts.append(bytes(b))
                return len(b)

            def close(self):
                if self.closed:
                    return
                self.closed = True
                handler.puts += 1
                if handler.puts >= handler.kill_at:
                    raise _Killed(path)
                with handler.fs.open_output_stream(path) as f:
                    f.write(b"".join(self.parts))

            def flush(self):
                pass

            def writable(self):
                return True

            def readable(self):
                return False

            def seekable(self):
                return False

        return pa.PythonFile(Put(), mode="w")

    def open_append_stream(self, path, metadata):
        raise OSError("no")


def _write(fs, path, data):
    with fs.open_output_stream(path) as f:
        f.write(data)


def _read(fs, path):
    with fs.open_input_stream(path) as f:
        return f.read()


FILES = ("tune/tuner.pkl", "tune/experiment_state-x.json", "rows/wal-000001.jsonl")


def _generation(g: int) -> dict[str, bytes]:
    return {f: f"{f} generation {g} ".encode() * (g + 1) for f in FILES}


def test_a_kill_at_every_write_leaves_signed_state_old_or_new(tmp_path):
    """Three generations of three state files, a kill at each of the writes they take: every
    file still verifies, and holds one of its generations (never a digest mismatch)."""
    killed_at = []
    for kill_at in range(1, 100):
        root = tmp_path / f"k{kill_at}"
        for f in FILES:
            (root / f).parent.mkdir(parents=True, exist_ok=True)
        faulty = pafs.PyFileSystem(_FaultyPuts(str(root), kill_at))
        signed = signing.signed_filesystem(faulty)
        gens = [_generation(g) for g in range(3)]
        try:
            for gen in gens:
                for f, data in gen.items():
                    _write(signed, f"{root}/{f}", data)
        except _Killed:
            killed_at.append(kill_at)
        else:
            break  # the whole sequence ran: every instant was tried
        fresh = signing.signed_filesystem(pafs.LocalFileSystem())  # the resumed process
        there = [f for f in FILES if (root / f).exists()]
        assert len(there) == 3 or kill_at <= 3 * len(FILES)  # absent only before its 1st write
        for f in there:
            assert _read(fresh, f"{root}/{f}") in [g[f] for g in gens], (kill_at, f)
        assert signing.verify_tree(pafs.LocalFileSystem(), str(root)) == len(there)
    assert len(killed_at) == 27  # 3 generations x 3 files x 3 whole-object writes each


# ---- forged and injected objects ----------------------------------------------------------------


def test_forged_tuner_pkl_is_refused_in_one_line_naming_it(tmp_path):
    raw = pafs.LocalFileSystem()
    signed = signing.signed_filesystem(raw)
    (tmp_path / "tune").mkdir()
    good, other = f"{tmp_path}/tune/tuner.pkl", f"{tmp_path}/tune/trial/result.json"
    (tmp_path / "tune" / "trial").mkdir()
    _write(signed, good, b"the real state")
    _write(signed, other, b"a real row")
    evil = b"cos\nsystem\n(S'touch /tmp/pwned'\ntR."
    forgeries = {
        "unsigned": lambda: (tmp_path / "tune" / "tuner.pkl.upcycle-hmac").unlink(),
        "replaced": lambda: None,
        "another object's sidecar": lambda: (tmp_path / "tune" / "tuner.pkl.upcycle-hmac")
        .write_bytes((tmp_path / "tune" / "trial" / "result.json.upcycle-hmac").read_bytes()),
        "signed with a guessed short key": lambda: (
            tmp_path / "tune" / "tuner.pkl.upcycle-hmac").write_text(
            signing.digest(b"\x00", good, evil)),
        "signed with an empty key": lambda: (
            tmp_path / "tune" / "tuner.pkl.upcycle-hmac").write_text(
            signing.digest(b"", good, evil)),
    }
    saved = (tmp_path / "tune" / "tuner.pkl.upcycle-hmac").read_bytes()
    for why, forge in forgeries.items():
        (tmp_path / "tune" / "tuner.pkl").write_bytes(evil)
        forge()
        with pytest.raises(UntrustedStateError, match=r"refusing to load .*tune/tuner\.pkl") as e:
            _read(signed, good)
        assert "\n" not in str(e.value), why
        with pytest.raises(UntrustedStateError, match=r"tuner\.pkl"):
            signing.verify_tree(raw, str(tmp_path / "tune"))
        (tmp_path / "tune" / "tuner.pkl.upcycle-hmac").write_bytes(saved)
    (tmp_path / "tune" / "tuner.pkl").write_bytes(b"the real state")
    assert _read(signed, good) == b"the real state"


def test_a_row_injected_into_the_bucket_is_refused_and_never_best(s3_env):
    from sweeps.store.results import read_rows, rows_table
    from sweeps.store.sink import ResultsSink
    from sweeps.store.storage import Location

    url = f"s3://{s3_env.bucket()}/res/inj"
    sink = ResultsSink(url, flush_s=0)
    sink.add({"trial_id": "t1", "step": 4, "val_loss": 2.0, "status": "ok"})
    sink.close()
    assert [r["val_loss"] for r in read_rows(url)] == [2.0]
    raw = Location.of(url)
    injected = raw / "rows" / "wal-000009-00000001.jsonl"
    injected.write_text(json.dumps({"row": {"trial_id": "evil", "step": 4, "val_loss": 0.01,
                                            "status": "ok"}}))
    again = ResultsSink(url, flush_s=0)
    with pytest.raises(UntrustedStateError, match=r"wal-000009-00000001\.jsonl") as e:
        again.load()
    assert "\n" not in str(e.value)
    injected.delete()
    import pyarrow.parquet as pq

    buf = pa.BufferOutputStream()
    pq.write_table(rows_table([{"trial_id": "evil", "step": 4, "val_loss": 0.01,
                                "status": "ok"}]), buf)
    (raw / "results.parquet").write_bytes(buf.getvalue().to_pybytes())  # replaced, unsigned
    with pytest.raises(UntrustedStateError, match=r"results\.parquet"):
        read_rows(url)  # what sweeps.compare and the analysis read
    with pytest.raises(UntrustedStateError, match=r"results\.parquet"):
        ResultsSink(url, flush_s=0).load()


def test_a_forged_spec_record_on_the_bucket_is_refused(s3_env):
    from sweeps.run import guard
    from sweeps.spec.sweep import parse_spec
    from sweeps.store.storage import Location
    from tests.sweeps.tiny import tiny_base

    url = f"s3://{s3_env.bucket()}/res/spec"
    spec = parse_spec({"sweep": "s", "base": tiny_base(),
                       "search": {"optim.lr": {"grid": [1e-3, 2e-3]}}})
    guard.record_spec(spec, url)
    guard.check_resume_spec(spec, url, force=False)  # signed, unchanged: fine
    forged = json.loads((Location.of(url) / "spec.json").read_text())
    forged["search"]["optim.lr"]["values"] = [5.0]  # matches a spec someone wants to slip in
    (Location.of(url) / "spec.json").write_text(json.dumps(forged))
    with pytest.raises(UntrustedStateError, match=r"refusing to load .*spec\.json") as e:
        guard.check_resume_spec(spec, url, force=False)
    assert "\n" not in str(e.value)
    said: list[str] = []
    guard.check_resume_spec(spec, url, force=True, say=said.append)  # re-recorded, signed
    assert "recording this spec" in said[0]
    guard.check_resume_spec(spec, url, force=False)

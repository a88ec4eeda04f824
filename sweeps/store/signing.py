"""Keyed digests of every file a sweep trusts on object storage: ``--resume`` unpickles Tune's
state and loads checkpoints, and object storage has no owners or modes (``sweeps.store.trust``),
so each object gets a sidecar ``<object>.upcycle-hmac`` listing HMAC-SHA256(key, path +
content), and a read is refused unless its digest is listed. The key never enters the bucket,
Ray or a pickle (docs/storage.md, docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from moe_core.errors import UpcycleError
from sweeps.store.trust import UntrustedStateError

KEY_ENV = "UPCYCLE_SWEEPS_HMAC_KEY"
KEY_FILE_ENV = "UPCYCLE_SWEEPS_HMAC_KEY_FILE"
SUFFIX = ".upcycle-hmac"
_DOMAIN = b"upcycle-sweeps/hmac/v1\0"
SPOOL_BYTES = 64 << 20
"""A signed object is held in memory up to this size, then in a temp file, until it is put."""


def key_file() -> Path:
    return Path(os.environ.get(KEY_FILE_ENV) or
                Path.home() / ".config" / "upcycle-sweeps" / "hmac.key")


MIN_KEY_BYTES = 32
"""HMAC-SHA256 keys shorter than this are refused (a 1-byte key is found in 256 tries)."""


def _key_bytes(text: str, where: str) -> bytes:
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise UpcycleError(f"{where} must be hex (e.g. `openssl rand -hex 32`)") from None
    if len(key) < MIN_KEY_BYTES:
        raise UpcycleError(f"{where} holds a {len(key)}-byte HMAC key; use at least "
                           f"{MIN_KEY_BYTES} random bytes (`openssl rand -hex 32`)")
    return key


def load_key(create: bool = True) -> bytes:
    """The HMAC key: ``$UPCYCLE_SWEEPS_HMAC_KEY`` (hex), else the key file (created 0600 with
    32 random bytes when absent and ``create``); at least :data:`MIN_KEY_BYTES` bytes."""
    env = os.environ.get(KEY_ENV)
    if env is not None:
        return _key_bytes(env, KEY_ENV)
    path = key_file()
    if not path.exists():
        if not create:
            raise UpcycleError(f"no HMAC key at {path} (nor {KEY_ENV}): copy the key the sweep "
                               "was written with there (mode 0600)")
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with contextlib.suppress(FileExistsError):  # another process made it first
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
    st = path.stat()
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UpcycleError(f"refusing the HMAC key {path}: it must be yours and mode 0600 "
                           f"(chmod 600 {path})")
    return _key_bytes(path.read_text()[:4096], f"the HMAC key file {path}")


def digest(key: bytes, path: str, data: bytes) -> str:
    """HMAC-SHA256 over the object's path and content (a file copied to another path does not
    verify there)."""
    return hmac.new(key, _DOMAIN + path.encode() + b"\0" + data, hashlib.sha256).hexdigest()


def _refuse(path: str, why: str) -> UntrustedStateError:
    return UntrustedStateError(
        f"refusing to load {path}: {why}, so it may not have been written by this sweep and "
        "loading it could run code from the bucket; start the sweep afresh without --resume, "
        f"or restore the HMAC key it was written with ({KEY_FILE_ENV} / {KEY_ENV})")


MAX_DIGESTS = 4
"""Digests a sidecar may list: the one just written first, then those it may still have to
vouch for (see :class:`_SigningWriter`)."""


def _digests(fs: pafs.FileSystem, path: str) -> list[str]:
    """The digests ``path``'s sidecar lists (empty when it has none or is unreadable)."""
    try:
        with fs.open_input_stream(path + SUFFIX) as f:
            text = f.read(MAX_DIGESTS * 80).decode("ascii", "replace")
    except (FileNotFoundError, OSError):
        return []
    return [d for d in text.split() if len(d) == 64][:MAX_DIGESTS]


def check(fs: pafs.FileSystem, path: str, data: bytes, key: bytes | None = None) -> None:
    """Raise UntrustedStateError unless ``path``'s sidecar lists the digest of ``data``."""
    want = _digests(fs, path)
    if not want:
        raise _refuse(path, "it has no HMAC digest")
    got = digest(key or load_key(), path, data)
    if not any(hmac.compare_digest(w, got) for w in want):
        raise _refuse(path, "its HMAC-SHA256 digest does not match")


class SpooledWriter:
    """A write-only file object whose bytes are spooled (memory, then a temp file) and handed
    over whole at close (:meth:`_landed`, with the spool at its start); ``_seen`` sees each
    chunk as it is written. pyarrow's ``PythonFile(mode="w")`` calls only ``write``, ``tell``,
    ``close`` and ``closed`` (pyarrow 26: ``flush``, ``writable``, ``seekable`` are answered
    by ``PythonFile`` itself)."""

    def __init__(self, max_size: int):
        self.buf = tempfile.SpooledTemporaryFile(max_size=max_size)
        self.closed = False

    def _seen(self, b: bytes) -> None:
        pass

    def _landed(self) -> None:
        raise TypeError(f"{type(self).__name__} must say where its bytes go")

    def write(self, data: Any) -> int:
        b = bytes(data)
        self._seen(b)
        self.buf.write(b)
        return len(b)

    def tell(self) -> int:
        return self.buf.tell()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.buf.seek(0)
            self._landed()
        finally:
            self.buf.close()


class _SigningWriter(SpooledWriter):
    """A write-only file object, crash-consistent: spooled while its digest is computed, then at
    close three whole-object PUTs: the sidecar listing the new digest *and* those it listed
    before, the object, the sidecar with the new digest alone. A PUT lands whole or not at all,
    so a kill at any instant leaves an object (old or new) that its sidecar vouches for."""

    def __init__(self, fs: pafs.FileSystem, path: str, metadata: Any):
        super().__init__(SPOOL_BYTES)
        self.fs, self.path, self.metadata = fs, path, metadata
        self.key = load_key()
        self.mac = hmac.new(self.key, _DOMAIN + path.encode() + b"\0", hashlib.sha256)

    def _seen(self, b: bytes) -> None:
        self.mac.update(b)

    def _put_sidecar(self, digests: list[str]) -> None:
        with self.fs.open_output_stream(self.path + SUFFIX) as f:
            f.write("\n".join(digests[:MAX_DIGESTS]).encode())

    def _landed(self) -> None:
        new = self.mac.hexdigest()
        self._put_sidecar([new, *(d for d in _digests(self.fs, self.path) if d != new)])
        with self.fs.open_output_stream(self.path, metadata=self.metadata) as out:
            while chunk := self.buf.read(8 << 20):
                out.write(chunk)
        self._put_sidecar([new])  # the manifest, last


class ForwardingHandler(pafs.FileSystemHandler):
    """A pyarrow filesystem handler that passes every call to ``inner``; subclasses override
    what they change and name themselves ``<TYPE_PREFIX>+<inner's type>``."""

    TYPE_PREFIX = "upcycle"

    def __init__(self, inner: pafs.FileSystem):
        self.inner = inner

    def __reduce__(self):
        return type(self), (self.inner,)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.__reduce__() == self.__reduce__()

    def get_type_name(self) -> str:
        return f"{self.TYPE_PREFIX}+{self.inner.type_name}"

    def normalize_path(self, path: str) -> str:
        return self.inner.normalize_path(path)

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self.inner.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return self.inner.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self.inner.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.inner.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        self.inner.delete_dir_contents("/", accept_root_dir=True)

    def delete_file(self, path: str) -> None:
        self.inner.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self.copy_file(src, dest)
        self.delete_file(src)


class SigningHandler(ForwardingHandler):
    """A pyarrow filesystem handler over ``inner`` that signs what it writes and verifies
    what it reads (see the module docstring). Pickles as ``inner`` alone (never the key)."""

    TYPE_PREFIX = "upcycle-signed"

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return [i for i in self.inner.get_file_info(selector) if not i.path.endswith(SUFFIX)]

    def delete_file(self, path: str) -> None:
        self.inner.delete_file(path)
        with contextlib.suppress(FileNotFoundError, OSError):
            self.inner.delete_file(path + SUFFIX)

    def _read_verified(self, path: str) -> bytes:
        with self.inner.open_input_stream(path) as f:
            data = f.read()
        check(self.inner, path, data)
        return data

    def copy_file(self, src: str, dest: str) -> None:
        with self.open_output_stream(dest, None) as f:
            f.write(self._read_verified(src))

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return pa.BufferReader(self._read_verified(path))

    open_input_file = open_input_stream

    def open_output_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        return pa.PythonFile(_SigningWriter(self.inner, path, metadata), mode="w")

    def open_append_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        raise NotImplementedError("append is not supported on object storage")


def _synchronous(fs: pafs.FileSystem) -> pafs.FileSystem:
    """``fs`` with its writes done in the calling thread. pyarrow's ``copy_files`` (Ray's upload)
    closes a Python file on Arrow's IO thread pool; an S3 stream with background writes, closed
    there, waits for its upload queued on that same pool: with as many files as IO threads, every
    thread waits and nothing runs (reproduced in tests/sweeps/test_storage.py). Rebuilt from its own
    pickle arguments (no credentials there: those come from the environment on each node)."""
    if isinstance(fs, pafs.S3FileSystem):
        rebuild, (kw,) = fs.__reduce__()
        if kw.get("background_writes"):
            return rebuild({**kw, "background_writes": False})
    return fs


def signed_filesystem(fs: pafs.FileSystem) -> pafs.FileSystem:
    """``fs`` wrapped so that everything written is signed and everything read verified."""
    load_key()  # create (or check) the key now, on the driver, before anything is written
    return pafs.PyFileSystem(SigningHandler(_synchronous(fs)))


def verify_tree(fs: pafs.FileSystem, root: str) -> int:
    """Check every file under ``root`` (in the unwrapped ``fs``) against its sidecar; raise
    UntrustedStateError at the first that fails. Returns the number of files checked."""
    key = load_key(create=False)
    n = 0
    sel = pafs.FileSelector(root, recursive=True, allow_not_found=True)
    for info in fs.get_file_info(sel):
        if info.type != pafs.FileType.File or info.path.endswith(SUFFIX):
            continue
        with fs.open_input_stream(info.path) as f:
            check(fs, info.path, f.read(), key)
        n += 1
    return n

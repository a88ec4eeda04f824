"""Where a sweep's files live: a local folder or object storage (``s3://``, ``gs://``), one API.

A :class:`Location` is a pyarrow filesystem and a path in it (``pyarrow.fs.FileSystem.from_uri``
for URLs, the local filesystem otherwise). Local paths keep the POSIX guarantees of
``moe_core.fsio`` (unique temp file, fsync, atomic rename); on object storage there is no
fsync or rename, so every write is one whole object (a PUT: readers see the old object or the
new one, never half of one), folders are published as write-once objects with a small
manifest written last (``upload_dir``), and a reader trusts a folder only once its manifest is
there. See docs/storage.md for which guarantee holds where.

Credentials are never handled here: pyarrow takes them from the environment or the provider's
usual chain (``AWS_*`` variables, ``~/.aws``, instance roles; ``GOOGLE_APPLICATION_CREDENTIALS``
or the metadata server), and a filesystem built that way pickles without them.

Code that must write to a local path (training a parent, a stable run, an export) works in a
node-local *staging* folder (:func:`staging_dir`, keyed by a hash of the URL, never a folder
named after it) and publishes the result with :func:`upload_dir`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import re
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from moe_core.errors import ConfigError, shown
from moe_core.fsio import atomic_write
from sweeps.store.signing import signed_filesystem

SCHEMES = ("s3", "gs", "gcs", "file")
"""URL schemes a results/parents/export location may use (pyarrow.fs's)."""
STAGING_ENV = "UPCYCLE_STAGING"
"""Node-local folder for files on their way to or from object storage (default
``~/.cache/upcycle-sweeps/staging``)."""


def is_url(target: str | os.PathLike) -> bool:
    return isinstance(target, str) and "://" in target


def check_uri(target: str, key: str) -> None:
    """A one-line ConfigError naming ``key`` when ``target`` is a URL of an unknown scheme."""
    if not is_url(target):
        return
    scheme = target.split("://", 1)[0].lower()
    if scheme not in SCHEMES:
        raise ConfigError(f"{key}={shown(target)}: unknown storage scheme {scheme}://; use a "
                          f"local path or one of {', '.join(s + '://' for s in SCHEMES)}")
    rest = target.split("://", 1)[1]
    bucket = rest.partition("?")[0].split("/", 1)[0]
    if scheme != "file" and not bucket:
        raise ConfigError(f"{key}={shown(target)} names no bucket; write {scheme}://BUCKET/PATH")
    query = rest.partition("?")[2].lower()
    if "@" in rest.split("/", 1)[0] or any(k in query for k in ("secret", "access_key",
                                                                 "session_token")):
        raise ConfigError(f"{key}: the URL carries credentials, which would be written into "
                          "summary.json and Tune's state; drop them and set them in the "
                          "environment (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                          "GOOGLE_APPLICATION_CREDENTIALS; docs/storage.md)")
    if scheme != "file" and not re.fullmatch(r"[a-z0-9]([a-z0-9._-]{0,220}[a-z0-9])?", bucket):
        raise ConfigError(f"{key}={shown(target)}: {shown(bucket)} is not a bucket name "
                          "(lower-case letters, digits, dots, hyphens or underscores); write "
                          f"{scheme}://BUCKET/PATH")


def local_form(target: str, key: str = "results") -> str:
    """``file:///PATH`` (which docs/storage.md accepts) as the local path it names, so that it
    is a local folder everywhere (its lock, its symbolic-link checks); anything else as is."""
    if not (is_url(target) and target.split("://", 1)[0].lower() == "file"):
        return target
    host, _, path = target.split("://", 1)[1].partition("/")
    if host not in ("", "localhost") or target.partition("?")[2] or not path.strip("/"):
        raise ConfigError(f"{key}={shown(target)}: a file:// URL names a local folder, "
                          "file:///PATH (no host, no query, not the root)")
    return "/" + path


def join_uri(base: str, *parts: str) -> str:
    """``base`` / parts, for a local path or a URL (a URL keeps its scheme and query-less)."""
    if is_url(base):
        return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])
    return str(Path(base).joinpath(*parts))


@dataclass(frozen=True, slots=True)
class Location:
    """A file or folder: ``fs`` (a pyarrow filesystem) and ``path`` in it; ``uri`` is how it
    was named (what messages and ``summary.json`` show)."""

    fs: pafs.FileSystem
    path: str
    uri: str

    @classmethod
    def of(cls, target: str | os.PathLike | Location) -> Location:
        """A Location for a local path, a URL (``s3://bucket/x``) or a Location."""
        if isinstance(target, Location):
            return target
        if is_url(target):
            check_uri(str(target), "storage location")
            fs, path = pafs.FileSystem.from_uri(str(target))
            if isinstance(fs, pafs.LocalFileSystem):
                return cls(fs, str(Path(path).resolve()), str(Path(path).resolve()))
            return cls(fs, path.rstrip("/"), str(target).rstrip("/"))
        p = str(Path(target).resolve())
        return cls(pafs.LocalFileSystem(), p, p)

    # ---- naming -----------------------------------------------------------------------------

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    @property
    def local_path(self) -> Path:
        """The local path (a local Location only)."""
        if not self.is_local:
            raise ValueError(f"{self.uri} is object storage, not a local path")
        return Path(self.path)

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)

    def join(self, *parts: str) -> Location:
        if self.is_local:
            p = str(Path(self.path).joinpath(*parts))
            return type(self)(self.fs, p, p)
        rel = "/".join(p.strip("/") for p in parts)
        return type(self)(self.fs, f"{self.path}/{rel}", f"{self.uri}/{rel}")

    def signed(self) -> Location:
        """This location through the HMAC-signing filesystem (``sweeps.store.signing``): every file
        written is signed, every file read verified. Local locations stay as they are
        (``sweeps.store.trust`` checks owners and modes there)."""
        if self.is_local or self.fs.type_name.startswith("py::upcycle-signed"):
            return self
        return Location(signed_filesystem(self.fs), self.path, self.uri)

    def __truediv__(self, part: str) -> Location:
        return self.join(part)

    def __str__(self) -> str:
        return self.uri

    # ---- queries ----------------------------------------------------------------------------

    def _type(self) -> pafs.FileType:
        return self.fs.get_file_info(self.path).type

    def exists(self) -> bool:
        if self.is_local:
            return Path(self.path).exists()
        return self._type() != pafs.FileType.NotFound

    def is_file(self) -> bool:
        if self.is_local:
            return Path(self.path).is_file()
        return self._type() == pafs.FileType.File

    def is_dir(self) -> bool:
        if self.is_local:
            return Path(self.path).is_dir()
        return self._type() == pafs.FileType.Directory

    def files(self, recursive: bool = True) -> list[str]:
        """Paths (relative to this folder, ``/``-separated, sorted) of the files under it;
        empty when it does not exist."""
        sel = pafs.FileSelector(self.path, recursive=recursive, allow_not_found=True)
        infos = self.fs.get_file_info(sel)
        n = len(self.path.rstrip("/")) + 1
        return sorted(i.path[n:] for i in infos if i.type == pafs.FileType.File)

    def size(self) -> int:
        """Bytes of this file, or of every file under this folder."""
        if self.is_file():
            return self.fs.get_file_info(self.path).size or 0
        sel = pafs.FileSelector(self.path, recursive=True, allow_not_found=True)
        return sum(i.size or 0 for i in self.fs.get_file_info(sel)
                   if i.type == pafs.FileType.File)

    # ---- reading and writing ----------------------------------------------------------------

    def read_bytes(self) -> bytes:
        if self.is_local:
            return Path(self.path).read_bytes()
        with self.fs.open_input_stream(self.path) as f:
            return f.read()

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def write_bytes(self, data: bytes) -> Location:
        """Write the whole file: locally atomically (temp file, fsync, rename); on object
        storage as one object (a PUT is atomic: readers see the old object or this one)."""
        if self.is_local:
            atomic_write(self.path, lambda tmp: tmp.write_bytes(data))
        else:
            with self.fs.open_output_stream(self.path) as f:
                f.write(data)
        return self

    def write_text(self, text: str) -> Location:
        return self.write_bytes(text.encode())

    def mkdir(self) -> None:
        """Create the folder (object storage has none: a no-op there)."""
        if self.is_local:
            Path(self.path).mkdir(parents=True, exist_ok=True)

    def delete(self) -> None:
        """Delete this file or folder (and everything under it); absent is fine."""
        t = self._type()
        if t == pafs.FileType.Directory:
            self.fs.delete_dir(self.path)
        elif t == pafs.FileType.File:
            self.fs.delete_file(self.path)

    def move_to(self, dst: Location) -> None:
        """Move this file or folder to ``dst`` (locally a rename; on object storage a copy of
        each object, then the delete: not atomic)."""
        if self.is_local:
            os.replace(self.path, dst.path)
            return
        if self.is_file():
            self.fs.copy_file(self.path, dst.path)
        else:
            for rel in self.files():
                self.fs.copy_file(f"{self.path}/{rel}", f"{dst.path}/{rel}")
        self.delete()

    # ---- folders ----------------------------------------------------------------------------

    def upload_dir(self, local: str | Path, last: Iterable[str] = ()) -> int:
        """Copy the local folder ``local`` here, file by file, the files named in ``last``
        (relative paths: the manifest) after every other one; returns the bytes copied. A
        reader that waits for the manifest never sees a half-published folder."""
        local = Path(local)
        files = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
        last = [f for f in last if f in files]
        total = 0
        for rel in [f for f in files if f not in last] + last:
            dst = self.join(rel)
            if self.is_local:
                Path(dst.path).parent.mkdir(parents=True, exist_ok=True)
            data = (local / rel).read_bytes()
            dst.write_bytes(data)
            total += len(data)
        return total

    def download_dir(self, local: str | Path) -> Path:
        """Copy every file under this folder into the local folder ``local``."""
        local = Path(local)
        for rel in self.files():
            dst = local / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(dst, lambda tmp, rel=rel: tmp.write_bytes(self.join(rel).read_bytes()))
        return local


def staging_dir(loc: Location) -> Path:
    """The node-local folder where files of ``loc`` are written before they are published
    there (and read after they are fetched): ``loc`` itself when it is local; else
    ``$UPCYCLE_STAGING/<sha256 of the URL>`` (never a folder named after the URL)."""
    if loc.is_local:
        return loc.local_path
    root = Path(os.environ.get(STAGING_ENV) or Path.home() / ".cache/upcycle-sweeps/staging")
    return root / hashlib.sha256(loc.uri.encode()).hexdigest()[:20]


@contextlib.contextmanager
def publishing(target: str | os.PathLike, manifest: str) -> Iterator[Path]:
    """A local folder to write ``target``'s files in: ``target`` itself when local; else a
    staging folder, uploaded to ``target`` (``manifest`` last) when the block ends without an
    error, then removed."""
    loc = Location.of(target)
    if loc.is_local:
        yield loc.local_path
        return
    local = staging_dir(loc)
    shutil.rmtree(local, ignore_errors=True)
    try:
        yield local
        loc.upload_dir(local, last=(manifest,))
    finally:
        shutil.rmtree(local, ignore_errors=True)

"""Where the project's files live: a local folder or object storage (``s3://``, ``gs://``), one
API, for every command (``sweeps.run``/``--resume``, ``analysis.best``, ``analysis.compare``,
``analysis.*``, ``python -m moe_core.hf export``).

A :class:`Location` is a pyarrow filesystem and a path in it (``pyarrow.fs.FileSystem.from_uri``
for URLs, the local filesystem otherwise). Local paths keep the POSIX guarantees of
``moe_core.fsio`` (unique temp file, fsync, atomic rename); on object storage there is no
fsync or rename, so every write is one whole object (a PUT: readers see the old object or the
new one, never half of one), folders are published as write-once objects with a small
manifest written last (``upload_dir``), and a reader trusts a folder only once its manifest is
there. See docs/storage.md for which guarantee holds where.

Credentials are never handled here: pyarrow takes them from the environment or the provider's
usual chain (``AWS_*`` variables, ``~/.aws``, instance roles; ``GOOGLE_APPLICATION_CREDENTIALS``
or the metadata server), and a filesystem built that way pickles without them. Timeouts and
retries are set explicitly (:func:`tuned`, from ``UPCYCLE_S3_*`` variables), and
:func:`probe` checks a location can be listed, written and deleted, in one line, before any
work starts.

Code that must write to a local path (training a parent, a stable run, an export) works in a
node-local *staging* folder (:func:`staging_dir`, keyed by a hash of the URL, never a folder
named after it) and publishes the result with :func:`upload_dir`.

pyarrow only: no torch, no Ray (``sweeps.store.storage`` adds the HMAC-signed view).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import re
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from moe_core.errors import ConfigError, shown
from moe_core.fsio import atomic_write

SCHEMES = ("s3", "gs", "gcs", "file")
"""URL schemes a results/parents/export location may use (pyarrow.fs's)."""
STAGING_ENV = "UPCYCLE_STAGING"
"""Node-local folder for files on their way to or from object storage (default
``~/.cache/upcycle-sweeps/staging``)."""


S3_CONNECT_TIMEOUT_ENV = "UPCYCLE_S3_CONNECT_TIMEOUT_S"
S3_REQUEST_TIMEOUT_ENV = "UPCYCLE_S3_REQUEST_TIMEOUT_S"
S3_ATTEMPTS_ENV = "UPCYCLE_S3_MAX_ATTEMPTS"
PROBE_TIMEOUT_ENV = "UPCYCLE_S3_PROBE_TIMEOUT_S"
S3_DEFAULTS = {S3_CONNECT_TIMEOUT_ENV: 5.0, S3_REQUEST_TIMEOUT_ENV: 60.0, S3_ATTEMPTS_ENV: 5,
               PROBE_TIMEOUT_ENV: 1.0}
"""How object storage is reached (each overridable by its environment variable, on every node):
seconds to connect, seconds a request may go without data (the AWS SDK's request timeout),
attempts per request (``pyarrow.fs.AwsStandardS3RetryStrategy``: exponential back-off), and the
one timeout of :func:`probe`'s single attempt (the check before a launch)."""


def setting(name: str) -> float:
    """The value of an ``UPCYCLE_S3_*`` setting: its environment variable, else the default;
    a non-number or a number <= 0 is a one-line ConfigError."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return float(S3_DEFAULTS[name])
    try:
        v = float(raw)
    except ValueError:
        v = -1.0
    if not v > 0:
        raise ConfigError(f"{name}={shown(raw)} must be a number > 0 (default "
                          f"{S3_DEFAULTS[name]:g}; docs/storage.md)")
    return v


def tuned(fs: pafs.FileSystem, *, timeout_s: float | None = None,
          attempts: int | None = None) -> pafs.FileSystem:
    """``fs`` with explicit timeouts and retries: an S3 filesystem rebuilt from its own options
    with ``connect_timeout``, ``request_timeout`` (``timeout_s`` for both when given) and an
    ``AwsStandardS3RetryStrategy``; a GCS one with a ``retry_time_limit``. Others as they are.
    pyarrow pickles the timeouts but not the retry strategy: a node that unpickles one gets
    pyarrow's default (3 attempts); one that builds its own (``Location.of``) gets ours."""
    n = int(attempts or setting(S3_ATTEMPTS_ENV))
    if isinstance(fs, pafs.S3FileSystem):
        _, (kw,) = fs.__reduce__()
        kw.update(connect_timeout=timeout_s or setting(S3_CONNECT_TIMEOUT_ENV),
                  request_timeout=timeout_s or setting(S3_REQUEST_TIMEOUT_ENV),
                  retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=n))
        return pafs.S3FileSystem._reconstruct(kw)
    if isinstance(fs, pafs.GcsFileSystem):
        import datetime  # noqa: PLC0415

        _, (kw,) = fs.__reduce__()
        kw["retry_time_limit"] = datetime.timedelta(
            seconds=timeout_s or n * setting(S3_REQUEST_TIMEOUT_ENV))
        return pafs.GcsFileSystem._reconstruct(kw)
    return fs


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
        if isinstance(target, cls):
            return target
        if isinstance(target, Location):  # the base type, into this (sub)class
            return cls(target.fs, target.path, target.uri)
        if is_url(target):
            check_uri(str(target), "storage location")
            fs, path = pafs.FileSystem.from_uri(str(target))
            fs = tuned(fs)
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
    return staging_for(loc.uri)


def staging_for(uri: str) -> Path:
    """:func:`staging_dir` of the object-storage URL ``uri``, without reaching the bucket."""
    root = Path(os.environ.get(STAGING_ENV) or Path.home() / ".cache/upcycle-sweeps/staging")
    return root / hashlib.sha256(uri.rstrip("/").encode()).hexdigest()[:20]


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


def _fix(message: str, loc: Location) -> str:
    """The way out for a provider's error ``message`` on ``loc``."""
    m = message.lower()
    scheme, bucket = loc.uri.split("://", 1)[0], loc.path.split("/", 1)[0]
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or "unset"
    if any(k in m for k in ("could not connect", "couldn't connect", "connection refused",
                            "resolve host", "curlcode: 6,", "curlcode: 7,")):
        return (f"nothing answers at the endpoint: check the network and AWS_ENDPOINT_URL "
                f"(now {endpoint})")
    if any(k in m for k in ("timeout", "timed out", "too slow", "unavailable")):
        return (f"the endpoint did not answer within {setting(PROBE_TIMEOUT_ENV):g} s: check "
                f"the network and AWS_ENDPOINT_URL (now {endpoint}), or raise "
                f"{PROBE_TIMEOUT_ENV}")
    if any(k in m for k in ("access_denied", "accessdenied", "forbidden", "403", "invalidaccess",
                            "signaturedoesnotmatch", "credentials", "permission")):
        return ("give the credentials the nodes use (the instance profile or service account "
                "of sweeps/cluster/*.yaml, AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS) list, "
                f"read, write and delete on {loc.uri} (docs/storage.md)")
    if "does not exist" in m or "nosuchbucket" in m or "not found" in m:
        make = (f"gcloud storage buckets create gs://{bucket}" if scheme in ("gs", "gcs")
                else f"aws s3 mb s3://{bucket}")
        return f"create the bucket ({make}) or fix its name"
    return "check the location, the credentials and the network (docs/storage.md)"


def _failed(key: str, loc: Location, doing: str, e: BaseException) -> ConfigError:
    msg = " ".join(str(e).split()) or type(e).__name__
    return ConfigError(f"{key}={loc.uri}: {doing} failed: {msg[:400]}; {_fix(msg, loc)}")


def probe(target: str | os.PathLike | Location, key: str = "results") -> float:
    """Check, before anything launches, that ``target`` can be used with the credential chain
    the nodes use: a local folder is left to the caller; on object storage a HEAD on the bucket
    and a write and delete of a small object under the prefix, one attempt each with the
    :data:`PROBE_TIMEOUT_ENV` timeout. Raises a one-line ConfigError naming ``key`` that keeps
    the provider's message and names the fix; returns the seconds the check took."""
    t0 = time.monotonic()
    if is_url(target):
        check_uri(str(target), key)
    loc = Location.of(target)
    if loc.is_local:
        return time.monotonic() - t0
    fs = tuned(loc.fs, timeout_s=setting(PROBE_TIMEOUT_ENV), attempts=1)
    bucket = loc.path.split("/", 1)[0]
    try:
        kind = fs.get_file_info(bucket).type
    except (OSError, ValueError) as e:
        raise _failed(key, loc, f"HEAD of bucket {bucket}", e) from None
    if kind == pafs.FileType.NotFound:
        raise _failed(key, loc, f"HEAD of bucket {bucket}",
                      OSError(f"bucket {bucket!r} does not exist")) from None
    obj = f"{loc.path}/.upcycle-probe-{uuid.uuid4().hex[:12]}"
    try:
        with fs.open_output_stream(obj) as f:
            f.write(b"upcycle-sweeps write probe; deleted at once\n")
    except (OSError, ValueError) as e:
        raise _failed(key, loc, f"probe write of {obj}", e) from None
    try:
        fs.delete_file(obj)
    except (OSError, ValueError) as e:
        raise _failed(key, loc, f"probe delete of {obj}", e) from None
    return time.monotonic() - t0

"""Durable file writes: a unique temporary name, fsync, then an atomic rename.

Two processes writing the same path never share a temporary file, a reader never sees a half
written file, and a written file survives a power loss once the call returns (the directory
entry is fsynced too). No torch here: ``sweeps.store.results`` and ``analysis`` use it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from moe_core.errors import ConfigError, OutputError

MARKER = ".written-by-upcycle-sweeps"
"""The file ``moe_core.outdir`` leaves in every folder the project wrote (defined here, the
lowest layer, so that durable writes can tell the project's folders from a user's)."""


def fsync_dir(path: str | Path) -> None:
    """Make a rename or a new entry in ``path`` durable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def fsync_file(path: str | Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def umask() -> int:
    """The process's umask, read from /proc where it can be (``os.umask`` can only be read by
    setting it, which races with other threads creating files)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    m = os.umask(0o022)
    os.umask(m)
    return m


def shared_mode(directory: bool = False) -> int:
    """The mode a plain ``open``/``mkdir`` would give under the user's umask (``mkstemp`` and
    ``mkdtemp`` give 0600/0700, which teammates on shared storage cannot read)."""
    return (0o777 if directory else 0o666) & ~umask()


def atomic_write(path: str | Path, write: Callable[[Path], None], private: bool = False) -> Path:
    """Call ``write(tmp)`` on a unique temporary path beside ``path``, fsync it and rename it to
    ``path``. The file follows the user's umask unless ``private`` (secrets: 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        if not private:
            os.chmod(tmp, shared_mode())
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda p: p.write_text(text))


def publish_dir(tmp: str | Path, path: str | Path, only_ours: bool = False) -> Path:
    """Rename the finished directory ``tmp`` to ``path``, replacing a directory already there
    (moved aside under a unique name first, so a concurrent writer never collides).
    ``only_ours``: a folder there that this project did not write (no marker,
    ``moe_core.outdir.MARKER``) and that is not empty, for example files a user saved into an
    OUT folder while the command ran, is put back and never deleted; ``tmp`` is removed and
    an ``OutputError`` says so in one line. The folder and its files follow the user's umask
    (weights, checkpoints, exports and the parent cache are shared outputs; secrets are written
    with ``atomic_write(private=True)`` instead)."""
    tmp, path = Path(tmp), Path(path)
    os.chmod(tmp, shared_mode(directory=True))  # a mkdtemp folder is 0700: follow the umask
    mode = shared_mode()
    for f in tmp.iterdir():
        if f.is_file() and not f.is_symlink():
            os.chmod(f, mode)  # safetensors' save_file writes 0600: weights follow the umask
            fsync_file(f)
    fsync_dir(tmp)
    for _ in range(100):
        try:
            os.replace(tmp, path)  # atomic when path is absent (or an empty directory)
            break
        except OSError as e:
            if not tmp.exists():
                raise e
            if not path.exists():  # another writer moved it aside meanwhile: try again
                continue
            trash = path.with_name(f".old-{path.name}-{uuid.uuid4().hex[:12]}")
            try:
                os.replace(path, trash)
            except FileNotFoundError:  # another writer moved it first
                continue
            if only_ours:
                _keep_foreign(trash, path, tmp)
            shutil.rmtree(trash, ignore_errors=True)
    else:
        raise OSError(f"could not publish {tmp} as {path}: it keeps being replaced")
    fsync_dir(path.parent)
    return path


def _keep_foreign(moved: Path, path: Path, tmp: Path) -> None:
    """``publish_dir(only_ours=True)``: put a folder this project did not write back where
    it was and refuse (its files are never deleted)."""
    marker = moved / MARKER
    if (marker.is_file() and not marker.is_symlink()) or not any(moved.iterdir()):
        return
    shutil.rmtree(tmp, ignore_errors=True)
    names = sorted(p.name for p in moved.iterdir())
    try:
        os.replace(moved, path)
        where = str(path)
    except OSError:  # something took its place meanwhile: the files stay where they are
        where = str(moved)
    raise OutputError(f"{path} gained files this command did not write while it ran "
                      f"({', '.join(names[:3])}{', …' if len(names) > 3 else ''}); they are "
                      f"kept in {where} and nothing was written: give a new folder")


MAX_JSON_DEPTH = 64
"""Nesting depth a JSON input may have (a config.json nests 3 deep; YAML's cap is 50)."""


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n:,} bytes"


def read_bounded(path: str | Path, limit: int, what: str = "file",
                 give: str = "a regular file") -> bytes:
    """The bytes of ``path``, which must be a regular file of at most ``limit`` bytes.

    Opened without blocking and checked with ``fstat`` before a byte is read, so a named pipe,
    a device or a folder is refused at once (never a hang) and a huge file unread; a symbolic
    link loop, a missing file or a denied permission is one line naming the path."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        why = {errno.ELOOP: "is a symbolic link loop", errno.ENOENT: "does not exist",
               errno.EACCES: "is not readable (permission denied)",
               errno.ENAMETOOLONG: "has a name too long"}.get(e.errno or 0, e.strerror or str(e))
        raise ConfigError(f"{what} {path} {why}; give a readable file") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a named pipe" \
                if stat.S_ISFIFO(st.st_mode) else "not a regular file"
            raise ConfigError(f"{what} {path} is {kind}; give {give}")
        if st.st_size > limit:
            raise ConfigError(f"{what} {path} is larger than {_size(limit)} "
                              f"({st.st_size:,} bytes); check the path")
        with os.fdopen(fd, "rb", closefd=True) as f:
            fd = -1
            raw = f.read(limit + 1)
    finally:
        if fd >= 0:
            os.close(fd)
    if len(raw) > limit:
        raise ConfigError(f"{what} {path} is larger than {_size(limit)}; check the path")
    return raw


def json_depth(value: object) -> int:
    """Nesting depth of a decoded JSON value, walked without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def loads_json(raw: bytes | str, what: str, max_depth: int = MAX_JSON_DEPTH) -> object:
    """``json.loads`` with its failures as one line naming ``what``: invalid JSON, invalid
    UTF-8, or nesting deeper than ``max_depth`` (never a ``RecursionError``)."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise ConfigError(f"{what} is nested deeper than {max_depth} levels; it is not a "
                          "file this project wrote") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise ConfigError(f"{what} is not valid JSON ({e})") from None
    if json_depth(value) > max_depth:
        raise ConfigError(f"{what} is nested deeper than {max_depth} levels; it is not a "
                          "file this project wrote")
    return value


def load_json(path: str | Path, limit: int = 1 << 20, what: str = "file",
              max_depth: int = MAX_JSON_DEPTH) -> object:
    """A JSON file read through :func:`read_bounded` and :func:`loads_json`."""
    return loads_json(read_bounded(path, limit, what, "a JSON file"), f"{what} {path}",
                      max_depth)


@contextlib.contextmanager
def removed_on_error(tmp: str | Path, enabled: bool = True) -> Iterator[Path]:
    """Remove the staging folder ``tmp`` when the block fails (a full disk, a kill by
    exception, Ctrl-C): a failed write leaves no ``.tmp-*`` folder behind."""
    try:
        yield Path(tmp)
    except BaseException:
        if enabled:
            shutil.rmtree(tmp, ignore_errors=True)
        raise

"""Durable file writes: a unique temporary name, fsync, then an atomic rename.

Two processes writing the same path never share a temporary file, a reader never sees a half
written file, and a written file survives a power loss once the call returns (the directory
entry is fsynced too). No torch here: ``sweeps.store.results`` and ``analysis`` use it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path


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


def publish_dir(tmp: str | Path, path: str | Path) -> Path:
    """Rename the finished directory ``tmp`` to ``path``, replacing a directory already there
    (moved aside under a unique name first, so a concurrent writer never collides)."""
    tmp, path = Path(tmp), Path(path)
    os.chmod(tmp, shared_mode(directory=True))  # a mkdtemp folder is 0700: follow the umask
    for f in tmp.iterdir():
        if f.is_file():
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
            shutil.rmtree(trash, ignore_errors=True)
    else:
        raise OSError(f"could not publish {tmp} as {path}: it keeps being replaced")
    fsync_dir(path.parent)
    return path


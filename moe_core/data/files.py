"""The files a data source reads and their fingerprint, without torch: ``data_fingerprint``
is part of a parent's cache key, which a sweep's dry run computes."""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import sysconfig
from pathlib import Path

from moe_core.data.config import DataConfig
from moe_core.errors import ConfigError


@functools.lru_cache(maxsize=1)
def stdlib_files() -> tuple[Path, ...]:
    """The standard library's .py files, sorted (no tests, no site-packages)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).parts
        if any(part in ("site-packages", "test", "tests", "idle_test", "__pycache__")
               or part.startswith("lib2to3") for part in rel):
            continue
        out.append(p)
    return tuple(out)


def text_files(path: str) -> list[Path]:
    p = Path(path)
    if p.is_file():
        return [p]
    if p.is_dir():
        files = sorted(p.rglob("*.txt"))
        if files:
            return files
    raise ConfigError(f"data.path={path} has no .txt files")


def data_fingerprint(cfg: DataConfig) -> str:
    """A hash of the data ``cfg`` reads as it is on disk now: the token or text files (path,
    size, mtime, first and last MiB), the standard library's files for ``stdlib``; the config
    alone for ``synthetic``. A parent trained on other data gets another cache key."""
    if cfg.source == "synthetic":
        return "synthetic"
    if cfg.source == "tokens":
        p = Path(cfg.path)
        files = [p / "train.bin", p / "val.bin"] if p.is_dir() else [p]
    else:
        files = stdlib_files() if cfg.source == "stdlib" else text_files(cfg.path)
    stats, total = [], 0
    for f in files:
        if not f.exists():
            raise ConfigError(f"data.path: {f} does not exist")
        st = f.stat()
        stats.append((str(f.resolve()), st.st_size, st.st_mtime_ns))
        total += st.st_size
        if cfg.source in ("stdlib", "text") and total >= cfg.max_corpus_bytes:
            break  # read_corpus stops here too
    return _content_print(cfg.source, tuple(stats))


@functools.lru_cache(maxsize=256)
def _content_print(source: str, stats: tuple[tuple[str, int, int], ...]) -> str:
    """Hash of the files' stat line and first and last MiB (cached per stat signature: a file
    that changes size or mtime is read again)."""
    h = hashlib.sha256(source.encode())
    if source == "stdlib":
        h.update(sys.version.encode())
    for path, size, mtime in stats:
        h.update(f"{path}|{size}|{mtime}|".encode())
        with open(path, "rb") as fh:
            h.update(fh.read(1 << 20))
            if size > 2 << 20:
                fh.seek(-(1 << 20), os.SEEK_END)
                h.update(fh.read(1 << 20))
    return h.hexdigest()[:16]

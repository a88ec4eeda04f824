"""Output folders that commands write: never delete or overwrite what they did not write.

A writer (``analysis.report --out``, ``sweeps.compare --out``, a sweep's ``export/<trial>``)
calls :func:`claim_out_dir` before it writes anything: an OUT that is a file, that is one of
its inputs or inside one, or that exists, is not empty and was not written by this project
(no :data:`MARKER` file, which :func:`mark_out_dir` leaves in every folder it wrote) is
refused in one line. :func:`confined` refuses a path under a root that a symbolic link takes
outside it (a planted ``results/<sweep>/export -> /elsewhere``).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterable
from pathlib import Path

from moe_core.errors import ConfigError

MARKER = ".written-by-upcycle-sweeps"
"""A small JSON file (command, host, pid, time) in every folder a writer created."""


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def ours(out: str | Path) -> bool:
    """``out`` is a folder this project wrote (holds :data:`MARKER`, a plain file)."""
    m = Path(out) / MARKER
    return m.is_file() and not m.is_symlink()


def claim_out_dir(out: str | Path, *, what: str = "--out", inputs: Iterable[str | Path] = (),
                  overwrite: bool = False) -> Path:
    """Check that ``out`` may be written; returns it (resolved). Refused in one line: a file,
    a symbolic link, one of ``inputs`` or a folder inside one, or an existing non-empty
    folder this project did not write (``overwrite`` does not change that: only a folder
    marked as ours is ever replaced)."""
    p = Path(out)
    if p.is_symlink():
        raise ConfigError(f"{what} {out} is a symbolic link; give a real folder (writes never "
                          "follow a link)")
    r = p.resolve()
    for src in inputs:
        s = Path(src).resolve()
        if _inside(r, s) or (s.is_dir() and _inside(s, r) and not ours(r)):
            raise ConfigError(f"{what} {out} is or overlaps the input {src}; give another "
                              "folder (nothing was written)")
    if r.exists() and not r.is_dir():
        raise ConfigError(f"{what} {out} is a file, not a folder; give a new folder (the file "
                          "is kept)")
    if r.is_dir() and any(r.iterdir()) and not ours(r):
        raise ConfigError(f"{what} {out} exists and holds files this command did not write; "
                          "give a new or empty folder (nothing was touched)")
    del overwrite  # a folder of ours is rewritten in place; a foreign one never
    return r


def mark_out_dir(out: str | Path, command: str) -> None:
    """Leave :data:`MARKER` in ``out`` (created if need be): written by ``command``."""
    p = Path(out)
    p.mkdir(parents=True, exist_ok=True)
    info = {"command": command, "host": socket.gethostname(), "pid": os.getpid(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (p / MARKER).write_text(json.dumps(info) + "\n")


def confined(path: str | Path, root: str | Path, what: str) -> Path:
    """``path`` (under ``root``) resolved, refused in one line when a symbolic link on the way
    takes it outside ``root`` (writes there would land elsewhere)."""
    r, p = Path(root).resolve(), Path(path)
    rp = p.resolve()
    if not _inside(rp, r):
        raise ConfigError(f"{what}: {p} leads to {rp}, outside {r} (a symbolic link); remove "
                          "the link (nothing was written there)")
    return rp

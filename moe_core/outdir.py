"""Output folders that commands write: never delete or overwrite what they did not write.

A writer (``analysis.report --out``, ``analysis.compare --out``, a sweep's ``export/<trial>``)
calls :func:`claim_out_dir` before it writes anything: an OUT that is a file, that is one of
its inputs or inside one, or that exists, is not empty and was not written by this project
(no :data:`MARKER` file, which :func:`mark_out_dir` leaves in every folder it wrote) is
refused in one line. Commands that replace a folder only when asked (``moe_core.hf upcycle`` /
``export``, ``analysis.best --export``) call :func:`guard_output_dir` instead: a non-empty folder
needs ``--overwrite`` and the marker. :func:`confined` refuses a path under a root that a
symbolic link takes outside it (a planted ``results/<sweep>/export -> /elsewhere``).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterable
from pathlib import Path

from moe_core.errors import ConfigError, OutputError
from moe_core.fsio import MARKER
from moe_core.location import Location, is_url

# MARKER (moe_core.fsio): a small JSON file (command, host, pid, time) in every folder a writer
# created


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


def marker_info(out: str | Path) -> dict | None:
    """What :func:`mark_out_dir` recorded in ``out`` (None when it is not ours)."""
    if not ours(out):
        return None
    try:
        info = json.loads((Path(out) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def guard_output_dir(out: str | Path, *, sources: tuple[str | Path, ...] = (),
                     overwrite: bool = False, flag: str = "--overwrite") -> str | None:
    """Check, before any work, that publishing a folder at ``out`` destroys nothing this project
    did not write. Refused (:class:`OutputError`, one line): ``out`` is a file or a symlink;
    ``out`` is one of ``sources`` (what the command reads), inside one or holding one, unless
    ``overwrite`` and the project wrote ``out``; ``out`` is a non-empty folder, unless
    ``overwrite`` and the project wrote it (:data:`MARKER`). Returns the line to print when
    a folder will be replaced, None otherwise."""
    out = Path(out)
    if out.is_symlink():
        raise OutputError(f"{out} is a symlink; give the real folder (nothing was written)")
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} is a file, not a folder; give a new folder path (nothing was "
                          "written)")
    real = out.resolve()
    mark = marker_info(out) if out.is_dir() else None
    for src in sources:
        s = Path(src).resolve()
        if (_inside(real, s) or _inside(s, real)) and not (overwrite and mark):
            where = "is" if real == s else "is inside" if _inside(real, s) else "holds"
            raise OutputError(f"{out} {where} the source {src}; give a new folder (nothing was "
                              "written)")
    if not out.is_dir() or not any(out.iterdir()):
        return None
    if not overwrite:
        raise OutputError(f"{out} exists and is not empty; give a new folder, or {flag} to "
                          "replace a folder this project wrote (nothing was written)")
    if mark is None:
        raise OutputError(f"{flag}: {out} was not written by this project (no {MARKER}); "
                          "it replaces only its own folders: move it away yourself or give a "
                          "new folder (nothing was written)")
    return (f"replacing {out}, written by {mark.get('command', '?')} on {mark.get('time', '?')} "
            f"({flag})")


def confined(path: str | Path, root: str | Path, what: str) -> Path:
    """``path`` (under ``root``) resolved, refused in one line when a symbolic link on the way
    takes it outside ``root`` (writes there would land elsewhere)."""
    r, p = Path(root).resolve(), Path(path)
    rp = p.resolve()
    if not _inside(rp, r):
        raise ConfigError(f"{what}: {p} leads to {rp}, outside {r} (a symbolic link); remove "
                          "the link (nothing was written there)")
    return rp


def guard_output(out: str | Path, *, sources: tuple[str | Path, ...] = (),
                 overwrite: bool = False, flag: str = "--overwrite") -> str | None:
    """:func:`guard_output_dir` for a local folder; for a URL (``s3://…``, ``gs://…``) the same
    rule on the objects under it: a prefix holding objects is replaced only with ``flag`` and
    only when it holds :data:`MARKER` (an earlier export of ours)."""
    if not is_url(str(out)):
        return guard_output_dir(out, sources=sources, overwrite=overwrite, flag=flag)
    loc = Location.of(str(out))
    files = loc.files()
    if not files:
        return None
    if not overwrite:
        raise OutputError(f"{out} holds {len(files)} object(s); give a new prefix, or {flag} to "
                          "replace a folder this project wrote (nothing was written)")
    if MARKER not in files:
        raise OutputError(f"{flag}: {out} was not written by this project (no {MARKER}); it "
                          "replaces only its own folders: give a new prefix (nothing was "
                          "written)")
    return f"replacing {out} ({flag})"

"""One exception tree for the whole project (OLMo-core style).

The command-line front ends turn any ``UpcycleError`` into one clear line and exit code 2.
"""

from __future__ import annotations

import re
from typing import Any

MAX_SHOWN = 200
"""Characters of a value's ``repr`` an error message shows (``shown``)."""
MAX_MESSAGE = 1000
"""Characters of an error line the command-line front ends print (``one_line``)."""


def shown(value: Any, limit: int = MAX_SHOWN) -> str:
    """``repr(value)``, cut to ``limit`` characters: error messages never carry a huge value."""
    r = repr(value)
    return r if len(r) <= limit else f"{r[:limit]}… ({len(r):,} characters)"


def one_line(message: Any, limit: int = MAX_MESSAGE) -> str:
    """An error message as one line of at most ``limit`` characters (whitespace runs and
    newlines become one space)."""
    s = re.sub(r"\s+", " ", str(message)).strip()
    return s if len(s) <= limit else s[:limit] + "…"


class UpcycleError(Exception):
    """Base of every error this project raises on purpose."""


class ConfigError(UpcycleError, ValueError):
    """A configuration value is invalid. The message names the key and the fix."""


class SearchSpaceError(ConfigError):
    """A sweep's search space is invalid (raised by ``sweeps.spec.sweep`` and its modules)."""


class DivergenceError(UpcycleError, RuntimeError):
    """Training produced a non-finite loss. Carries the step and the reason."""

    def __init__(self, step: int, reason: str):
        super().__init__(f"diverged at step {step}: {reason}")
        self.step = step
        self.reason = reason

    def __reduce__(self):  # picklable across Ray processes (the default passes only args)
        return (type(self), (self.step, self.reason))


class CheckpointError(UpcycleError, RuntimeError):
    """A checkpoint is missing, corrupt (checksum mismatch) or incompatible."""


class OutputError(UpcycleError):
    """An output path would replace or delete what this project did not write. The message names
    the path and the way out (a new path, or ``--overwrite`` for a folder the project wrote)."""


class FitError(UpcycleError, RuntimeError):
    """A scaling-law fit could not be performed (too few points, bad columns, ...)."""


DEBUG_ENV = "UPCYCLE_DEBUG"
"""``UPCYCLE_DEBUG=1`` (or ``--debug`` on the command line) shows the traceback
:func:`cli_boundary` would otherwise turn into one line."""
ERROR_EXIT = 2


def describe(e: BaseException) -> str:
    """One line for an input or environment error: the project's message as it is, an
    ``OSError`` as what failed on which file, a ``KeyError`` as the missing key."""
    if isinstance(e, UpcycleError):
        return one_line(e)
    if isinstance(e, OSError):
        import errno

        what = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exhausted",
                errno.EACCES: "permission denied", errno.EPERM: "permission denied",
                errno.EROFS: "the file system is read-only"}.get(e.errno or 0)
        where = f" at {e.filename}" if e.filename else ""
        return one_line(f"{what or e.strerror or type(e).__name__}{where} "
                        f"({type(e).__name__} errno {e.errno})")
    if isinstance(e, KeyError):
        return one_line(f"missing key {shown(e.args[0]) if e.args else ''} in the input "
                        f"(KeyError)")
    return one_line(f"{e} ({type(e).__name__})")


def cli_boundary(kept: str = "nothing was deleted") -> Any:
    """Decorate a command's ``main(argv=None, ...)``: the project's errors, ``ValueError`` /
    ``KeyError`` (input parsing: JSON, YAML, Parquet, numbers) and ``OSError`` (disk full,
    permission) become one line ``error: ... ; <kept>`` on stderr and exit status 2 instead of
    a traceback. ``--debug`` in argv (or ``UPCYCLE_DEBUG=1``) re-raises. Anything else is a bug
    and keeps its traceback."""
    import functools
    import os
    import sys

    def deco(main: Any) -> Any:
        @functools.wraps(main)
        def wrapped(*args: Any, **kwargs: Any) -> int:
            argv = args[0] if args and isinstance(args[0], (list, tuple)) else \
                kwargs.get("argv", sys.argv[1:])
            debug = "--debug" in (argv or ()) or os.environ.get(DEBUG_ENV) == "1"
            try:
                return main(*args, **kwargs)
            except (UpcycleError, ValueError, KeyError, OSError) as e:
                if debug:
                    raise
                line = describe(e)
                if isinstance(e, OSError) or not isinstance(e, UpcycleError):
                    line += f"; {kept} (--debug shows the traceback)"
                print(f"error: {line}", file=sys.stderr)
                return ERROR_EXIT

        return wrapped

    return deco

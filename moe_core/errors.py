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


CAUGHT: tuple[type[BaseException], ...] = (UpcycleError, ValueError, KeyError, OSError,
                                          ArithmeticError, RecursionError)
"""What :func:`cli_boundary` turns into one line: the project's errors, input parsing (JSON,
YAML, Parquet, numbers: ``ValueError`` / ``KeyError``), the disk and storage (``OSError``), a
number out of range (``OverflowError``) and input nested too deep (``RecursionError``)."""


def _os_line(e: OSError) -> str:
    """What failed on which file; the provider's own message when there is no errno (pyarrow's
    S3/GCS errors are ``OSError`` with the cause in the text only)."""
    import errno

    what = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exhausted",
            errno.EACCES: "permission denied", errno.EPERM: "permission denied",
            errno.EROFS: "the file system is read-only"}.get(e.errno or 0)
    where = f" at {e.filename}" if e.filename else ""
    if e.errno is None:  # no errno: the message is all the cause there is
        return f"{str(e) or type(e).__name__}{where} ({type(e).__name__})"
    return f"{what or e.strerror or str(e)}{where} ({type(e).__name__} errno {e.errno})"


def describe(e: BaseException) -> str:
    """One line for an input or environment error: the project's message as it is, an
    ``OSError`` as what failed on which file, a ``KeyError`` as the missing key. A Ray task's
    error is its cause; an error raised ``from`` another keeps that cause's text."""
    cause = getattr(e, "cause", None)  # ray.exceptions.RayTaskError: not its remote traceback
    if isinstance(cause, BaseException) and cause is not e:
        return describe(cause)
    if isinstance(e, UpcycleError):
        line = str(e)
    elif isinstance(e, OSError):
        line = _os_line(e)
    elif isinstance(e, KeyError):
        line = f"missing key {shown(e.args[0]) if e.args else ''} in the input (KeyError)"
    elif isinstance(e, RecursionError):
        line = "the input is nested too deeply to read (RecursionError)"
    else:
        line = f"{e} ({type(e).__name__})"
    inner = e.__cause__
    if inner is not None and not isinstance(e, RecursionError):
        why = describe(inner)
        if one_line(str(inner), 120) not in one_line(line):
            line += f" (cause: {why})"
    return one_line(line)


def cli_boundary(kept: str = "nothing was deleted",
                 interrupted: tuple[str, Any] | None = None) -> Any:
    """Decorate a command's ``main(argv=None, ...)``: the one error boundary of every command.

    The errors in :data:`CAUGHT` become one line ``error: ... ; <kept>`` on stderr and exit
    status 2 instead of a traceback; the line keeps the cause (an ``OSError``'s provider
    message, a Ray task's own error, the error a message was raised ``from``). ``interrupted``
    is ``(message, exit_code_function)`` for a command that a signal may stop (Ctrl-C): the
    message on stderr and that exit status, with or without ``--debug``. ``--debug`` in argv
    (or ``UPCYCLE_DEBUG=1``) re-raises errors. Anything else is a bug and keeps its
    traceback."""
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
            except KeyboardInterrupt:
                if interrupted is None:
                    raise
                print(interrupted[0], file=sys.stderr)
                return int(interrupted[1]())
            except CAUGHT as e:
                if debug:
                    raise
                line = describe(e)
                if not isinstance(e, UpcycleError) or isinstance(e, OSError):
                    line += f"; {kept} (--debug shows the traceback)"
                print(f"error: {line}", file=sys.stderr)
                return ERROR_EXIT

        return wrapped

    return deco

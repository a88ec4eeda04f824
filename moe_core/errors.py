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
    """A sweep's search space is invalid (raised by ``sweeps.spec``)."""


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

"""Ray's memory monitor killing a trial, or an actor the sweep needs, is a recorded outcome.

Ray fails an actor task whose worker its memory monitor killed with
``ray.exceptions.OutOfMemoryError`` (ray#29736), which Tune's actor manager does not expect: it
raised out of ``Tuner.fit`` and took every other trial with it. :func:`survive_oom` hands Tune the
error as the actor death it is; what still escapes for memory stops the sweep in one line
(:func:`stop_outcome`). What the user sees: docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from ray.exceptions import OutOfMemoryError, RayActorError

from sweeps.store.oom import is_oom, oom_outcome

TUNE_LOGGER = "ray.tune.execution.tune_controller"
"""Where Tune logs each failed trial's traceback."""


class KilledForMemory(RayActorError):
    """An actor task's ``OutOfMemoryError``: its worker was killed by Ray's memory monitor,
    so its actor is dead (the message is Ray's, with the node's figures)."""

    def __init__(self, message: str):
        super().__init__(error_msg=message)

    def __reduce__(self):  # Tune pickles a trial's error into its folder
        return (type(self), (self.error_msg,))


def _as_actor_death(original: Callable[..., Any]) -> Callable[..., Any]:
    def actor_task_failed(self: Any, tracked_actor_task: Any, exception: Exception) -> Any:
        if isinstance(exception, OutOfMemoryError):
            exception = KilledForMemory(str(exception))
        return original(self, tracked_actor_task, exception)

    actor_task_failed.__wrapped__ = original  # type: ignore[attr-defined]
    return actor_task_failed


class _NoMemoryTraceback(logging.Filter):
    """Drops Tune's log of a trial lost for memory (``KilledForMemory``, or the actor death Ray
    reports instead when that news arrives first), traceback and all."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return exc is None or not is_oom(exc)


@contextlib.contextmanager
def survive_oom() -> Iterator[None]:
    """While Tune runs (this driver process): an actor task killed for memory is an actor
    death to Tune, and Tune logs no traceback for it."""
    from ray.air.execution._internal.actor_manager import RayActorManager

    original = RayActorManager._actor_task_failed
    RayActorManager._actor_task_failed = _as_actor_death(original)
    quiet = _NoMemoryTraceback()
    logging.getLogger(TUNE_LOGGER).addFilter(quiet)
    try:
        yield
    finally:
        RayActorManager._actor_task_failed = original
        logging.getLogger(TUNE_LOGGER).removeFilter(quiet)


def error_message(error: BaseException) -> str:
    """The text of ``error`` and of the errors it was raised from (Ray's figures are in the
    innermost)."""
    parts, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        parts.append(str(error))
        error = error.__cause__ or error.__context__
    return "\n".join(parts)


def stop_outcome(error: BaseException) -> tuple[str, str, dict[str, Any]]:
    """A sweep that ``Tuner.fit`` left for memory: the one line to print, and the ``oom``
    reason and ``memory.*`` columns of the trials it cut."""
    reason, cols = oom_outcome(error_message(error),
                               "a worker of the sweep (a trial, or an actor of Tune or W&B)")
    return f"the sweep stopped: {reason}", reason, cols

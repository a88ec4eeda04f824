"""Deterministic configuration errors inside a trial fail it once, in one line, without retries
(docs/preflight-and-cost.md, "Configuration errors inside a trial are not retried"): Tune
retries every exception (Ray 2.60 has no per-exception opt-out), and a ``ConfigError`` would
fail every retry alike. Multi-rank trials: ``sweeps.run.trial._train_worker``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from moe_core.errors import ConfigError, one_line
from sweeps.store.results import json_safe

DETERMINISTIC = (ConfigError,)
"""Exception types a retry cannot fix."""


def failed_row(last: dict[str, Any] | None, fallback: Callable[[], dict[str, Any]],
               error: BaseException) -> dict[str, Any]:
    """The trial's final row: its last reported row (or ``fallback()``'s static columns) marked
    failed with the error's one line."""
    row = dict(last) if last else {"step": 0, "tokens": 0}
    if not last:
        with contextlib.suppress(Exception):  # the row goes out even if the config cannot load
            row.update(fallback())
    row.update(status="failed", reason=f"not retried: {type(error).__name__}: "
               f"{one_line(error, 400)}", val_loss=None, train_loss=None)
    return row


def fail_once(static: Callable[..., dict[str, Any]]) -> Callable[..., Callable[..., None]]:
    """Decorate a Tune function trainable ``fn(config, ctx)`` (``sweeps.run.trial.TrialContext``):
    a ``DETERMINISTIC`` error becomes a final failed row sent through ``ctx.report``;
    ``static(spec, trial_plan, parent, trial_id)`` gives its columns if nothing was reported."""

    def decorate(fn: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(fn)
        def wrapper(config: dict[str, Any], ctx: Any) -> None:
            from ray import tune

            last: dict[str, Any] = {}

            def recording(row: dict[str, Any], checkpoint: Any = None) -> None:
                ctx.report(row, checkpoint=checkpoint)
                last.clear()
                last.update(row)

            try:
                fn(config, dataclasses.replace(ctx, report=recording))
            except DETERMINISTIC as e:
                spec, plan = ctx.spec, ctx.plan
                row = failed_row(last, lambda: static(spec, plan.trial(spec, config), None,
                                                      tune.get_context().get_trial_id()), e)
                ctx.report(json_safe(row), checkpoint=None)

        return wrapper

    return decorate

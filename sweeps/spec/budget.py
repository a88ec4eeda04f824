"""The spec's ``budget:`` block and its flags: limits on GPU-hours, dollars and wall hours that
the driver enforces (``sweeps.run.budget``). Pure: no Ray, no torch (``--dry-run`` reads it)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from moe_core.errors import SearchSpaceError

LIMITS = ("gpu_hours", "usd", "wall_hours")
"""The limits, in the order they are reported."""
WARN_AT = 0.8
"""The fraction of a limit at which the driver warns (once)."""


def _check(key: str, value: Any, flag: str | None = None) -> None:
    name = flag or f"budget.{key}"
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or not value > 0:
        raise SearchSpaceError(f"{name}={value!r} must be a finite number > 0 (or leave it out "
                               "for no limit)")


@dataclass(frozen=True, slots=True)
class BudgetConfig:
    """``budget: {gpu_hours, usd, wall_hours, price}``; each limit None = none. GPU-hours count
    every trial's devices (ranks × GPUs; a CPU trial counts its hours) over the time it ran,
    retries and replayed work included, and the parents' training."""

    gpu_hours: float | None = None
    """Stop when this many GPU-hours (CPU trials: trial-hours) are spent."""
    usd: float | None = None
    """Stop when GPU-hours × ``price`` reach this many dollars (needs ``price`` or ``--price``)."""
    wall_hours: float | None = None
    """Stop when the sweep has run this long (all its runs, ``--resume`` included)."""
    price: float | None = None
    """Dollars per GPU-hour, for ``usd`` (``--price`` overrides it)."""

    def __post_init__(self) -> None:
        for k in (*LIMITS, "price"):
            _check(k, getattr(self, k))

    @property
    def limits(self) -> dict[str, float]:
        """The limits that are set."""
        return {k: getattr(self, k) for k in LIMITS if getattr(self, k) is not None}


FLAGS = {"gpu_hours": "--budget-gpu-hours", "usd": "--budget-usd",
         "wall_hours": "--budget-wall-hours"}


def with_flags(budget: BudgetConfig | None, flags: dict[str, float | None],
               price: float | None = None) -> BudgetConfig | None:
    """The spec's budget with ``--budget-*`` flags (and ``--price``) over it; one line naming
    the flag for a bad value."""
    for k, v in flags.items():
        _check(k, v, FLAGS[k])
    over = {k: v for k, v in flags.items() if v is not None}
    if price is not None:
        over["price"] = price
    out = replace(budget or BudgetConfig(), **over) if over else budget
    if out is not None and out.usd is not None and out.price is None:
        name = "--budget-usd" if flags.get("usd") is not None else "budget.usd"
        raise SearchSpaceError(f"{name}={out.usd:g} needs a price per GPU-hour: pass --price "
                               "or set budget.price in the spec")
    return out

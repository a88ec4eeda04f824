"""A progress line per running trial, at least every ``PROGRESS_EVERY_S`` seconds, on stderr.

Called by the driver's Tune callback at every step of Tune's loop (``on_step_end``, many times
a second); every period it prints, for each RUNNING trial, its latest reported row from the
sweep's sink: step (of its planned steps), losses, tokens/s between its last two reports (its
average since the start while it has one) and how long ago that row came. A trial with no row
yet says so. ``UPCYCLE_SWEEPS_PROGRESS_S`` sets the period (0 turns the lines off).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

PROGRESS_EVERY_S = 30.0
PROGRESS_ENV = "UPCYCLE_SWEEPS_PROGRESS_S"


def period() -> float:
    try:
        return float(os.environ.get(PROGRESS_ENV, PROGRESS_EVERY_S))
    except ValueError:
        return PROGRESS_EVERY_S


def tokens_per_s(rows: Mapping[int, Mapping[str, Any]]) -> float | None:
    """Tokens/s between the trial's last two rows (tokens and wall_s), or its average."""
    pts = sorted((r["tokens"], r["wall_s"]) for r in rows.values()
                 if isinstance(r.get("tokens"), (int, float)) and
                 isinstance(r.get("wall_s"), (int, float)))
    if len(pts) >= 2 and pts[-1][1] > pts[-2][1]:
        return (pts[-1][0] - pts[-2][0]) / (pts[-1][1] - pts[-2][1])
    if pts and pts[-1][1] > 0:
        return pts[-1][0] / pts[-1][1]
    return None


def _num(v: Any) -> str:
    return f"{v:.4f}" if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def line(trial_id: str, rows: Mapping[int, Mapping[str, Any]], total_steps: int | None,
         now: float, seen: float | None) -> str:
    """One trial's progress line (``seen``: when its latest row arrived)."""
    if not rows:
        return f"trial {trial_id}: running, no eval reported yet"
    step = max(rows)
    r = rows[step]
    tps = tokens_per_s(rows)
    ago = f", {now - seen:.0f} s ago" if seen is not None else ""
    return (f"trial {trial_id}: step {step}{f'/{total_steps}' if total_steps else ''}  "
            f"train_loss {_num(r.get('train_loss'))}  val_loss {_num(r.get('val_loss'))}  "
            f"{f'{tps:,.0f}' if tps else '-'} tok/s  (last eval{ago})")


class Ticker:
    """Remembers when each trial last reported and when the last lines went out."""

    def __init__(self, every_s: float | None = None, clock: Callable[[], float] = time.time):
        self.every_s = period() if every_s is None else every_s
        self.clock = clock
        self.last_print = clock()
        self.seen: dict[str, float] = {}

    def reported(self, trial_id: str) -> None:
        self.seen[trial_id] = self.clock()

    def due(self) -> bool:
        return self.every_s > 0 and self.clock() - self.last_print >= self.every_s

    def lines(self, running: Iterable[tuple[str, Mapping[int, Mapping[str, Any]],
                                            int | None]]) -> list[str]:
        """The lines for ``(trial_id, its rows by step, its planned steps)`` of each running
        trial; marks the time."""
        now = self.last_print = self.clock()
        return [line(t, rows, total, now, self.seen.get(t)) for t, rows, total in running]

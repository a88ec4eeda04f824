"""The enforced budget: what a sweep has spent, and the stop at 100 % of a limit.

What is counted, the 80 % warning and the stop: docs/preflight-and-cost.md. :class:`Ledger` is
pure. The results callback is restored from its pickle on ``--resume``, so it charges the active
ledger through :func:`charge` and :func:`tick`: the limits in force are always this run's.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from moe_core.errors import SearchSpaceError
from sweeps.spec.budget import FLAGS, WARN_AT, BudgetConfig

UNITS = {"gpu_hours": "GPU-h", "usd": "$", "wall_hours": "h"}


def trial_devices(ranks: int, gpus: float) -> float:
    """Devices one trial holds: ranks × GPUs, or 1 for a CPU trial (trial-hours)."""
    return ranks * gpus if gpus > 0 else 1.0


@dataclass
class Ledger:
    """What the sweep spent, against ``budget``'s limits."""

    budget: BudgetConfig | None
    devices: float = 1.0
    """Devices of one trial (:func:`trial_devices`)."""
    carried: Mapping[str, float] = field(default_factory=dict)
    """``gpu_hours`` and ``wall_hours`` spent by earlier runs of this sweep."""
    started: float = field(default_factory=time.time)
    device_s: float = 0.0
    warned: bool = False
    stopped: str | None = None
    """The limit that stopped the sweep, once it did."""

    def charge(self, seconds: float, devices: float | None = None) -> None:
        """``seconds`` of work on ``devices`` (default: one trial's)."""
        if seconds and seconds > 0:
            self.device_s += seconds * (self.devices if devices is None else devices)

    def spent(self, now: float | None = None) -> dict[str, float | None]:
        now = time.time() if now is None else now
        gpu_h = float(self.carried.get("gpu_hours", 0.0)) + self.device_s / 3600
        price = self.budget.price if self.budget is not None else None
        return {"gpu_hours": gpu_h, "usd": None if price is None else gpu_h * price,
                "wall_hours": float(self.carried.get("wall_hours", 0.0)) +
                (now - self.started) / 3600}

    def fraction(self, now: float | None = None) -> tuple[float, str | None]:
        """The largest spent/limit and its limit (0, None without limits)."""
        if self.budget is None:
            return 0.0, None
        spent = self.spent(now)
        fr = [(spent[k] / v, k) for k, v in self.budget.limits.items() if spent[k] is not None]
        return max(fr) if fr else (0.0, None)

    def check(self, now: float | None = None) -> str | None:
        """``warn`` the first time a limit reaches 80 %, ``stop`` the first time one reaches
        100 %; else None."""
        f, key = self.fraction(now)
        if key is not None and f >= 1.0 and self.stopped is None:
            self.stopped = key
            return "stop"
        if key is not None and f >= WARN_AT and not self.warned:
            self.warned = True
            return "warn"
        return None

    def status(self, now: float | None = None) -> str:
        if self.stopped is not None:
            return "spent"
        if self.budget is None or not self.budget.limits:
            return "unlimited"
        return "warned" if self.fraction(now)[0] >= WARN_AT else "within"

    def record(self, now: float | None = None) -> dict[str, Any]:
        """``summary.json``'s ``budget``: limits, spent, status (and the limit that stopped)."""
        spent = {k: None if v is None else round(v, 6) for k, v in self.spent(now).items()}
        return {"limits": self.budget.limits if self.budget is not None else {},
                "price": self.budget.price if self.budget is not None else None,
                "spent": spent, "status": self.status(now), "stopped_by": self.stopped,
                "fraction": round(self.fraction(now)[0], 4)}

    def line(self, event: str, now: float | None = None) -> str:
        f, key = self.fraction(now)
        assert self.budget is not None and key is not None
        spent, limit = self.spent(now)[key], self.budget.limits[key]
        what = f"budget.{key}: {spent:.4g} of {limit:g} {UNITS[key]} spent ({f:.0%})"
        if event == "warn":
            return f"{what}; the sweep stops at 100 %"
        return (f"{what}: stopping the sweep; no trial is launched, running trials stop at their "
                f"last checkpoint; raise the limit ({FLAGS[key]}) and rerun with --resume to "
                "continue")


def carried_over(summary_text: str | None) -> dict[str, float]:
    """What earlier runs spent, from their ``summary.json`` (empty if none or unreadable)."""
    try:
        spent = json.loads(summary_text or "{}").get("budget", {}).get("spent", {})
        return {k: float(spent[k]) for k in ("gpu_hours", "wall_hours")
                if isinstance(spent.get(k), (int, float))}
    except (ValueError, AttributeError):
        return {}


def open_ledger(results_dir: Any, resume: bool, limits: BudgetConfig | None) -> Ledger:
    """The sweep's ledger (``results_dir``: a Path or a ``Location``); on ``--resume`` it
    carries what the earlier runs spent (their ``summary.json``) and refuses, before Ray
    starts, a limit already reached."""
    summary = results_dir / "summary.json"
    prior = summary.read_text() if resume and summary.exists() else None
    ledger = Ledger(limits, carried=carried_over(prior))
    refuse_spent(ledger)
    return ledger


def refuse_spent(ledger: Ledger) -> None:
    """A ``--resume`` whose carried spending already reaches a limit: one line, before Ray."""
    f, key = ledger.fraction()
    if key is not None and f >= 1.0:
        spent = ledger.spent()[key]
        raise SearchSpaceError(
            f"budget.{key}={ledger.budget.limits[key]:g} is already spent ({spent:.4g} "
            f"{UNITS[key]} by earlier runs of this sweep); raise it ({FLAGS[key]} or the spec's "
            "budget) to continue with --resume")


_active: list[tuple[Ledger, Callable[[str], None]]] = []


def activate(ledger: Ledger, say: Callable[[str], None]) -> None:
    """Make ``ledger`` the one :func:`charge` and :func:`tick` use (this driver process)."""
    _active[:] = [(ledger, say)]


def stopped_by() -> str | None:
    return _active[0][0].stopped if _active else None


def deactivate() -> None:
    _active.clear()


def charge(result: Mapping[str, Any]) -> None:
    """A trial's report: its ``time_this_iter_s`` on the trial's devices; then :func:`tick`."""
    if not _active:
        return
    t = result.get("time_this_iter_s")
    if isinstance(t, (int, float)):
        _active[0][0].charge(float(t))
    tick()


def tick() -> None:
    """Warn once at 80 %; at 100 % stop the sweep (Tune's graceful interrupt)."""
    if not _active:
        return
    ledger, say = _active[0]
    event = ledger.check()
    if event is not None:
        say(ledger.line(event))
    if event == "stop":  # tune.py's SIGUSR1 handler (set in Tuner.fit): stop, save state, return
        tune_handler = callable(signal.getsignal(signal.SIGUSR1))
        signal.raise_signal(signal.SIGUSR1 if tune_handler else signal.SIGINT)

"""Learning-rate schedules and LR-reset policies as pure functions.

Convention: ``lr_at(step)`` is the LR used for optimizer step ``step`` (0-based).
- warmup: lr = peak·(step + 1)/warmup_steps for step < warmup_steps (step 0 is not zero);
- WSD (000 §3.1, App. A.5): constant peak after warmup; the last ``d = round(decay_frac·T)``
  steps decay linearly, from peak at step T − d − 1 (the last stable step) to exactly
  ``min_ratio·peak`` at step T − 1;
- cosine: after warmup, peak → min_ratio·peak along a half cosine, reaching it at step T − 1;
- constant: peak after warmup.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from moe_core.errors import ConfigError


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleConfig:
    kind: Literal["wsd", "cosine", "constant"] = "wsd"
    """wsd (warmup-stable-decay, 000 §3.1), cosine, or constant."""
    warmup_steps: int = 10
    """Linear warmup length (000 Table 5: 200–800 for the paper's sizes)."""
    total_steps: int | None = None
    """Length of the run in optimizer steps; None = filled in from the token budget."""
    decay_frac: float = 0.1
    """WSD: fraction of the run spent in the linear decay (000 App. A.5: ~10 %)."""
    min_ratio: float = 0.1
    """Final LR as a fraction of the peak (000 App. A.5: 10 %)."""

    def __post_init__(self) -> None:
        if self.kind not in ("wsd", "cosine", "constant"):
            raise ConfigError(
                f"schedule.kind={self.kind!r} is not known; use 'wsd', 'cosine' or 'constant'"
            )
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ConfigError(f"schedule.warmup_steps={self.warmup_steps!r} must be an int >= 0")
        if self.total_steps is not None and self.total_steps < 1:
            raise ConfigError(f"schedule.total_steps={self.total_steps} must be >= 1")
        if not 0.0 <= self.decay_frac <= 1.0:
            raise ConfigError(f"schedule.decay_frac={self.decay_frac} must lie in [0, 1]")
        if not 0.0 <= self.min_ratio <= 1.0:
            raise ConfigError(f"schedule.min_ratio={self.min_ratio} must lie in [0, 1]")

    @property
    def decay_steps(self) -> int:
        return round(self.decay_frac * self._total())

    @property
    def decay_start(self) -> int:
        """First step of the WSD decay (its LR is already below the peak)."""
        return self._total() - self.decay_steps

    def _total(self) -> int:
        if self.total_steps is None:
            raise ConfigError("schedule.total_steps is not set (the trainer sets it from tokens)")
        return self.total_steps


def warmup_factor(step: int, warmup_steps: int) -> float:
    return min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0


def wsd_lr(step: int, *, peak: float, cfg: ScheduleConfig) -> float:
    """Warmup-stable-decay (000 §3.1; linear decay to min_ratio·peak, App. A.5)."""
    total, d = cfg._total(), cfg.decay_steps
    start = total - d
    if d > 0 and step >= start:
        frac = min(1.0, (step - start + 1) / d)
        return peak * (1.0 - (1.0 - cfg.min_ratio) * frac)
    return peak * warmup_factor(step, cfg.warmup_steps)


def cosine_lr(step: int, *, peak: float, cfg: ScheduleConfig) -> float:
    """Cosine from peak to min_ratio·peak after a linear warmup (000 App. A.4)."""
    total, w = cfg._total(), cfg.warmup_steps
    if step < w:
        return peak * warmup_factor(step, w)
    span = max(1, total - 1 - w)
    t = min(1.0, (step - w) / span) if total - 1 > w else 1.0
    lo = cfg.min_ratio * peak
    return lo + (peak - lo) * 0.5 * (1.0 + math.cos(math.pi * t))


def constant_lr(step: int, *, peak: float, cfg: ScheduleConfig) -> float:
    return peak * warmup_factor(step, cfg.warmup_steps)


def lr_at(step: int, *, peak: float, cfg: ScheduleConfig) -> float:
    """LR of optimizer step ``step`` (0-based) under ``cfg``."""
    fn = {"wsd": wsd_lr, "cosine": cosine_lr, "constant": constant_lr}[cfg.kind]
    return fn(step, peak=peak, cfg=cfg)


@dataclass(frozen=True, kw_only=True, slots=True)
class LRPolicyConfig:
    """LR of a run that starts from a parent (000 App. A.6; 004 §3.2.1; 002 §3.2)."""

    policy: Literal["constant", "reset", "ratio"] = "reset"
    """constant: the parent's final LR for the whole run, no warmup; reset: a new schedule
    with its own warmup to ``peak``; ratio: a new schedule to ``ratio`` × the parent's peak."""
    peak: float | None = None
    """reset: the new peak (the dense or the MoE peak of 000 Table 5); None = the run's
    optim.lr."""
    ratio: float = 1.0
    """ratio: new peak = ratio × parent peak."""

    def __post_init__(self) -> None:
        if self.policy not in ("constant", "reset", "ratio"):
            raise ConfigError(
                f"upcycle.lr_policy.policy={self.policy!r} is not known; use 'constant', "
                "'reset' or 'ratio'"
            )
        if self.peak is not None and not self.peak > 0:
            raise ConfigError(f"upcycle.lr_policy.peak={self.peak} must be > 0")
        if not self.ratio > 0:
            raise ConfigError(f"upcycle.lr_policy.ratio={self.ratio} must be > 0")


def resolve_lr_policy(
    policy: LRPolicyConfig,
    *,
    parent_peak: float,
    parent_final_lr: float,
    schedule_cfg: ScheduleConfig,
    default_peak: float | None = None,
) -> tuple[float, ScheduleConfig]:
    """(peak, schedule) of the child run under ``policy``."""
    if policy.policy == "constant":
        return parent_final_lr, replace(schedule_cfg, kind="constant", warmup_steps=0)
    if policy.policy == "ratio":
        return policy.ratio * parent_peak, schedule_cfg
    peak = policy.peak if policy.peak is not None else default_peak
    if peak is None:
        raise ConfigError("upcycle.lr_policy.peak is not set for policy=reset; give a peak")
    return peak, schedule_cfg


# ---- the one schedule resolver -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Phase:
    """Which part of a run's LR schedule a training call covers (000 §3.1 WSD branching).

    ``full``: the whole run (steps 0..cfg.steps). ``stable``: warmup + constant peak up to
    ``end`` (a WSD run without its decay: a stable run to branch from, or a parent that ends at
    the transition point, 003 §3). ``decay``: from the stable checkpoint at step ``start``, the
    last ``steps`` steps of the single WSD run of ``start + steps`` steps."""

    kind: Literal["full", "stable", "decay"] = "full"
    start: int = 0
    steps: int | None = None

    @staticmethod
    def full() -> Phase:
        return Phase("full")

    @staticmethod
    def stable(end_step: int) -> Phase:
        return Phase("stable", 0, end_step)

    @staticmethod
    def decay(start_step: int, decay_steps: int) -> Phase:
        return Phase("decay", start_step, decay_steps)

    def __post_init__(self) -> None:
        if self.kind not in ("full", "stable", "decay"):
            raise ConfigError(f"phase {self.kind!r} is not known; use full, stable or decay")
        if self.kind != "full" and (self.steps is None or self.steps < 1):
            raise ConfigError(f"a {self.kind} phase needs steps >= 1, got {self.steps}")
        if self.start < 0:
            raise ConfigError(f"phase start={self.start} must be >= 0")


class RunLike(Protocol):
    """What the resolver reads of a run's config (``moe_core.train.config.TrainConfig``)."""

    schedule: ScheduleConfig
    steps: int
    optim: Any
    """``.lr``: the run's own peak."""
    upcycle: Any
    """None, or ``.lr_policy``: an ``LRPolicyConfig``."""


class ParentLR(Protocol):
    """The LR facts of a parent run that the LR policies read (000 App. A.6)."""

    peak_lr: float
    final_lr: float


@dataclass(frozen=True, slots=True)
class RunSchedule:
    peak: float
    schedule: ScheduleConfig
    end_step: int
    """The optimizer step the phase ends at."""

    def lr(self, step: int) -> float:
        return lr_at(step, peak=self.peak, cfg=self.schedule)


def run_schedule(cfg: RunLike, parent: ParentLR | None = None,
                 phase: Phase = Phase()) -> RunSchedule:
    """The peak LR, schedule and last step of ``phase`` of run ``cfg``: its own schedule over
    ``cfg.steps``, or, with a parent, the upcycling LR policy against the parent's LR (000 App.
    A.6). Every LR decision of a run, its parent, its WSD stable run and its decay branches is
    made here."""
    sched = replace(cfg.schedule, total_steps=cfg.steps)
    peak = cfg.optim.lr
    if parent is not None and cfg.upcycle is not None:
        peak, sched = resolve_lr_policy(cfg.upcycle.lr_policy, parent_peak=parent.peak_lr,
                                        parent_final_lr=parent.final_lr, schedule_cfg=sched,
                                        default_peak=peak)
    if phase.kind == "full":
        return RunSchedule(peak, sched, sched.total_steps)
    if phase.kind == "stable":  # the decay never starts: constant after warmup
        return RunSchedule(peak, replace(sched, total_steps=phase.steps, decay_frac=0.0),
                           phase.steps)
    if sched.kind == "constant":
        raise ConfigError("a decay phase needs a decaying schedule; this run's LR is constant "
                          "(schedule.kind=constant or upcycle.lr_policy.policy=constant)")
    # 000 §3.1: a branch at step s decaying over n steps is the single WSD run of s + n steps
    # whose decay covers exactly its last n steps.
    total = phase.start + phase.steps
    return RunSchedule(peak, replace(sched, kind="wsd", total_steps=total,
                                     decay_frac=phase.steps / total), total)


def lr_schedule(peak: float, cfg: ScheduleConfig) -> tuple[float, ...]:
    """Per-step LRs of a run of ``cfg.total_steps`` steps (:func:`lr_at`)."""
    return tuple(lr_at(i, peak=peak, cfg=cfg) for i in range(cfg.total_steps))

"""Health rules: the spec's ``prune:`` block, as frozen validated dataclasses and a pure checker.

A rule names a router-health statistic every eval reports (:data:`RULE_METRICS`) and a
threshold; the trial is pruned when the statistic is above it for ``for_evals`` consecutive evals
at or after ``after_tokens`` (002 §4 monitors these by hand; 003 warns of router collapse).
``layers: worst`` reads the least healthy MoE layer instead of the mean. The rules, their columns
and what each catches: docs/early-stopping.md. ``sweeps.run.health.HealthStopper`` applies them
to every reported row (a Tune ``Stopper``). This module has no Ray import.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from moe_core.config import from_mapping
from moe_core.errors import ConfigError, SearchSpaceError
from sweeps.store.results import STEP0_EVAL

RULE_METRICS = {
    "max_load_fraction": "router.max_load",
    "dead_experts": "router.dead_experts",
    "expert_similarity": "router.expert_similarity",
    "transition_jump": "transition_jump",
    "drop_rate": "router.drop_rate",
    "max_vio": "router.max_vio",
}
"""Rule name → the reported column it reads (a contract: the spec's keys)."""
PER_LAYER = frozenset(RULE_METRICS) - {"transition_jump"}
"""Rules whose statistic is also reported per MoE layer, so ``layers: worst`` applies."""
WORST_SUFFIX = ".worst"
FLOORS = {"max_load_fraction": 0.0, "dead_experts": 0.0, "expert_similarity": -1.0,
          "drop_rate": 0.0, "max_vio": 0.0}
"""The least value each statistic can take: a threshold below it fires on every eval
(``max_load_fraction`` is also at least 1/E, checked against the plan by ``sweeps.run.guard``)."""


@dataclass(frozen=True, slots=True)
class PruneRule:
    above: float
    """The trial is pruned when the statistic is strictly above this."""
    for_evals: int = 1
    """...for this many consecutive evals (counted from ``after_tokens``)."""
    after_tokens: float = 0
    """Evals before this many trained tokens are not checked."""
    layers: str = "mean"
    """``mean`` (over the MoE layers) or ``worst`` (the least healthy MoE layer)."""

    def __post_init__(self) -> None:
        if isinstance(self.above, bool) or not isinstance(self.above, (int, float)) or \
                not math.isfinite(self.above):
            raise SearchSpaceError(f"above={self.above!r} must be a finite number")
        if isinstance(self.for_evals, bool) or not isinstance(self.for_evals, int) or \
                self.for_evals < 1:
            raise SearchSpaceError(f"for_evals={self.for_evals!r} must be an integer >= 1")
        if isinstance(self.after_tokens, bool) or \
                not isinstance(self.after_tokens, (int, float)) or not self.after_tokens >= 0:
            raise SearchSpaceError(f"after_tokens={self.after_tokens!r} must be a number >= 0")
        if self.layers not in ("mean", "worst"):
            raise SearchSpaceError(f"layers={self.layers!r} must be 'mean' or 'worst'")


@dataclass(frozen=True, slots=True)
class Verdict:
    """Why a trial was pruned: the rule, the column it read, the values over the threshold
    (oldest first) and the eval at which it fired."""

    rule: str
    metric: str
    values: tuple[float, ...]
    threshold: float
    step: int
    tokens: int

    @property
    def reason(self) -> str:
        vals = ", ".join(f"{v:.4g}" for v in self.values)
        n = len(self.values)
        return (f"pruned by {self.rule}: {self.metric} {vals} > {self.threshold:g}"
                f"{f' for {n} evals' if n > 1 else ''} (step {self.step})")

    def columns(self) -> dict[str, Any]:
        """The results columns of a pruned trial (``sweeps.store.results``)."""
        return {"status": "pruned", "reason": self.reason, "prune_rule": self.rule,
                "prune_metric": self.metric, "prune_value": self.values[-1],
                "prune_threshold": self.threshold, "prune_step": self.step}


@dataclass(frozen=True, slots=True)
class PruneConfig:
    """The spec's ``prune:`` block: rule name → :class:`PruneRule`."""

    rules: tuple[tuple[str, PruneRule], ...] = field(default=())
    """YAML ``prune: {<rule>: {above: x, for_evals: n, after_tokens: t}}``, rules:
    max_load_fraction, dead_experts, expert_similarity, transition_jump, drop_rate, max_vio;
    ``layers: worst`` reads the least healthy MoE layer instead of the mean."""

    def __bool__(self) -> bool:
        return bool(self.rules)

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(rule_metric(name, rule) for name, rule in self.rules)


def rule_metric(name: str, rule: PruneRule) -> str:
    """The column rule ``name`` reads: its mean column, or ``<column>.worst``."""
    return RULE_METRICS[name] + (WORST_SUFFIX if rule.layers == "worst" else "")


def parse_prune(raw: Any) -> PruneConfig:
    """``prune: {max_load_fraction: {above: 0.5, for_evals: 3}, ...}`` → PruneConfig; errors
    name the key and the fix."""
    if raw is None:
        return PruneConfig()
    if not isinstance(raw, Mapping):
        raise SearchSpaceError("prune must map rule names to {above: ..., for_evals: ..., "
                               f"after_tokens: ...}}; rules: {', '.join(RULE_METRICS)}")
    rules = []
    for name, body in raw.items():
        if name not in RULE_METRICS:
            raise SearchSpaceError(f"prune.{name} is not a known rule; use one of "
                                   f"{', '.join(RULE_METRICS)}")
        if isinstance(body, Mapping) and "above" not in body:
            raise SearchSpaceError(f"prune.{name} needs above: <threshold>, e.g. "
                                   f"prune: {{{name}: {{above: 0.5}}}}")
        try:
            rules.append((name, from_mapping(PruneRule, body, f"prune.{name}")))
        except SearchSpaceError as e:
            raise SearchSpaceError(f"prune.{name}.{e}") from None
        except ConfigError as e:
            raise SearchSpaceError(str(e)) from None
        if rules[-1][1].layers == "worst" and name not in PER_LAYER:
            raise SearchSpaceError(f"prune.{name}.layers=worst: {name} is not a per-layer "
                                   "statistic; drop layers or use layers: mean")
        floor = FLOORS.get(name)
        if floor is not None and rules[-1][1].above < floor:
            raise SearchSpaceError(
                f"prune.{name}.above={rules[-1][1].above:g} fires on every eval: "
                f"{RULE_METRICS[name]} is never below {floor:g}; give a threshold above it")
    return PruneConfig(tuple(rules))


def rule_value(name: str, row: Mapping[str, Any], rule: PruneRule | None = None) -> float | None:
    """The statistic ``name`` (as ``rule`` reads it: mean or worst layer) in one reported row
    (None when the row has none). A row without ``transition_jump`` (written before it was
    reported) gives it at step 0 as ``val_loss − parent_val_loss``."""
    v = row.get(rule_metric(name, rule) if rule is not None else RULE_METRICS[name])
    if v is None and name == "transition_jump" and row.get("step") == 0 and \
            row.get("parent_loss_source") != STEP0_EVAL:  # step 0 is the parent's loss there
        lv, pv = row.get("val_loss"), row.get("parent_val_loss")
        if isinstance(lv, (int, float)) and isinstance(pv, (int, float)):
            v = lv - pv
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def check(prune: PruneConfig, state: dict[str, list[tuple[int, float]]],
          row: Mapping[str, Any]) -> Verdict | None:
    """Feed one reported row; ``state`` (rule name → the current run of (step, value) over the
    threshold) is updated in place. Returns the first rule that fires, else None.

    A row at a step the run has already passed is a replay (a trial restarted from its last
    checkpoint re-reports the evals after it): the curve is rewritten from that step on, so
    the runs forget every value at or after it first and a replayed eval never counts twice."""
    step = int(row.get("step") or 0)
    for run in state.values():
        while run and run[-1][0] >= step:
            run.pop()
    tokens = row.get("tokens") or 0
    for name, rule in prune.rules:
        if tokens < rule.after_tokens:
            continue
        v = rule_value(name, row, rule)
        if v is None:
            continue
        run = state.setdefault(name, [])
        if v > rule.above:
            run.append((step, v))
        else:
            run.clear()
        if len(run) >= rule.for_evals:
            return Verdict(name, rule_metric(name, rule),
                           tuple(x for _, x in run[-rule.for_evals:]),
                           float(rule.above), step, int(tokens))
    return None

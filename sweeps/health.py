"""Ray Tune side of MoE-aware early stopping: the health-rule ``Stopper`` and ASHA on a rung
metric of its own (``rung_metric: predicted_final``).

``HealthStopper`` is a ``ray.tune.Stopper`` (``RunConfig(stop=...)``): Tune asks it about every
reported row before the scheduler, so it composes with ``scheduler: asha``. It remembers each
pruned trial's ``Verdict``; ``sweeps.driver.ResultsCallback`` reads it to write the trial's rows
with ``status: pruned`` and the rule and values that fired.
"""

from __future__ import annotations

from typing import Any

from ray.tune import Stopper
from ray.tune.schedulers import ASHAScheduler

from sweeps.prune import PruneConfig, Verdict, check


class HealthStopper(Stopper):
    """Stops a trial as soon as one of the spec's ``prune:`` rules fires on its rows."""

    def __init__(self, prune: PruneConfig):
        self.prune = prune
        self.state: dict[str, dict[str, list[float]]] = {}
        self.fired: dict[str, Verdict] = {}

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        if trial_id in self.fired:
            return True
        if result.get("status") in ("diverged", "failed"):
            return False
        verdict = check(self.prune, self.state.setdefault(trial_id, {}), result)
        if verdict is None:
            return False
        self.fired[trial_id] = verdict
        return True

    def verdict(self, trial_id: str) -> Verdict | None:
        return self.fired.get(trial_id)

    def stop_all(self) -> bool:
        return False


class RungMetricASHA(ASHAScheduler):
    """Ray's ``ASHAScheduler`` comparing trials at its rungs on its own metric (e.g.
    ``predicted_final``) while the Tuner keeps the spec's ``metric`` for the search algorithm
    and the best-trial bookkeeping (Ray otherwise refuses a scheduler with a metric of its
    own next to ``TuneConfig(metric=...)``)."""

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        return True

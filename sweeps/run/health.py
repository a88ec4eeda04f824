"""Ray Tune side of MoE-aware early stopping: the health-rule ``Stopper`` (asked before the
scheduler, so it composes with ASHA; docs/early-stopping.md), and ASHA whose rungs survive
``--resume`` (``ResumableASHA``), on a rung metric of its own where the spec asks
(``rung_metric: predicted_final``). ``sweeps.run.driver.ResultsCallback`` reads each pruned
trial's ``Verdict`` from the stopper to write its rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ray.tune import Stopper
from ray.tune.schedulers import ASHAScheduler

from sweeps.run.prune import PruneConfig, Verdict, check
from sweeps.store.sink import tune_results


class HealthStopper(Stopper):
    """Stops a trial as soon as one of the spec's ``prune:`` rules fires on its rows."""

    def __init__(self, prune: PruneConfig):
        self.prune = prune
        self.state: dict[str, dict[str, list[tuple[int, float]]]] = {}
        self.fired: dict[str, Verdict] = {}

    def restore(self, trial_id: str, rows: Iterable[Mapping[str, Any]]) -> Verdict | None:
        """Replay a trial's recorded rows (a resumed sweep: Tune restores this stopper as it
        was pickled at the sweep's start), so a streak of evals over a threshold survives the
        restart. Returns the verdict if the rows already fire a rule: the driver died between
        the stopper's decision and Tune's, and the trial stops at its first row."""
        self.state.pop(trial_id, None)
        self.fired.pop(trial_id, None)
        for row in sorted(rows, key=lambda r: r.get("step") or 0):
            if self(trial_id, row):
                break
        return self.fired.get(trial_id)

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


class ResumableASHA(ASHAScheduler):
    """Ray's ``ASHAScheduler`` whose rungs survive ``--resume``. Tune restores a scheduler as it
    was pickled at the sweep's start, so every value recorded at a rung is gone, and the trials
    that go on are compared with the ones started after the resume only. Tune hands every
    restored trial, finished or not, to ``on_trial_add``; this one then replays the trial's
    own results (Tune's ``result.json`` in the trial's folder) into its bracket, by Ray's own
    rule (``_Bracket.on_result``), recording them without deciding anything. A trial that goes
    on meets the rungs it already passed as recorded, as it would have without the restart."""

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        super().on_trial_add(tune_controller, trial)
        bracket = self._trial_info[trial.trial_id]
        for it, value in recorded_results(trial, self._time_attr, self._metric):
            bracket.on_result(trial, it, self._metric_op * value)


def recorded_results(trial: Any, time_attr: str, metric: str) -> list[tuple[int, float]]:
    """(``time_attr``, ``metric``) of each result a trial reported before, oldest first, from
    Tune's ``result.json`` in its folder (none for a new trial); non-finite values skipped."""
    try:
        f = Path(trial.path) / "result.json"
    except (AttributeError, RuntimeError, TypeError):  # no folder yet: nothing reported
        return []
    if not f.is_file():
        return []
    out = []
    for res in tune_results(f):
        it, v = res.get(time_attr), res.get(metric)
        if isinstance(it, (int, float)) and isinstance(v, (int, float)) and math.isfinite(v):
            out.append((it, float(v)))
    return sorted(out, key=lambda p: p[0])


class RungMetricASHA(ResumableASHA):
    """Ray's ``ASHAScheduler`` comparing trials at its rungs on its own metric (e.g.
    ``predicted_final``) while the Tuner keeps the spec's ``metric`` for the search algorithm
    and the best-trial bookkeeping (Ray otherwise refuses a scheduler with a metric of its
    own next to ``TuneConfig(metric=...)``)."""

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        return True

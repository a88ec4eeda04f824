"""The Tune callback that records a sweep: every reported row into the sweep's ``ResultsSink``,
each trial's outcome, and the progress lines (``sweeps.run.driver`` hands it to Tune, which
pickles it into ``tuner.pkl``: ``sweeps.run.driver.ResultsCallback`` still names it)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from ray import tune

from moe_core.train.config import TrainConfig
from sweeps.plan.build import SweepPlan
from sweeps.run import _signals as signals
from sweeps.run import budget, console, setup_progress
from sweeps.run.health import HealthStopper
from sweeps.spec.algorithm import plugin
from sweeps.spec.sweep import SweepSpec
from sweeps.store.oom import OOM_STATUS
from sweeps.store.results import config_types, knob_columns
from sweeps.store.sink import ResultsSink, row_from_result
from sweeps.store.storage import Location
from sweeps.store.trial_outcomes import error_outcome, reconcile, recorded_prune

Results = Path | Location
"""A sweep's results folder: a local Path, or a Location on object storage."""


class ResultsCallback(tune.Callback):
    """Hands every reported row to the sweep's ``ResultsSink`` (durable before Tune moves on;
    ``results.parquet`` rewritten in the background), marks trial outcomes, and prints
    progress with the best metric so far and an ETA."""

    def __init__(self, spec: SweepSpec, plan: SweepPlan, results_dir: Results,
                 flush_s: float = 10.0, health: HealthStopper | None = None,
                 setup_dir: Path | None = None):
        self.spec, self.plan = spec, plan
        self.setup_dir = setup_dir  # the trials' set-up boards (sweeps.run.setup_progress)
        self.total, self.at_most = plugin(spec.algorithm).trial_cap(spec, plan)
        self.health = health
        self.results_dir = results_dir
        self.sink = ResultsSink(results_dir, flush_s, types=config_types(TrainConfig))
        self.done: set[str] = set()
        self._loaded = False
        self.started = time.time()
        self.best = math.inf if spec.mode == "min" else -math.inf

    def _ensure_loaded(self) -> None:
        """Rebuild the rows already recorded (a resumed sweep). Done lazily, at first use: on
        ``--resume`` Tune restores this callback from the experiment state pickled at the
        sweep's start, so the constructor cannot be relied on to see the files."""
        if self._loaded:
            return
        rep = self.sink.load(self.results_dir / "tune")
        for p in rep.problems:
            console.progress(p)
        self.done = self.sink.trial_ids("ok") | self.sink.trial_ids("pruned")
        for table in self.sink.tables():  # one part at a time: memory bounded at any size
            if self.spec.metric in table.column_names:
                for m in table[self.spec.metric].to_pylist():
                    self._track_best(m)
        if self.health is not None:  # unfinished and pruned trials' streaks over a threshold
            for t, rows in self.sink.rows_by_trial(
                    self.sink.trial_ids() - self.sink.trial_ids("ok")):
                self.health.restore(t, rows.values())
        self.started = time.time()
        self._loaded = True

    def setup(self, **info: Any) -> None:
        """Tune's start (fresh or resumed), before any trial reports: the rows recorded before a
        resume seed the stopper's streaks. Tune restores the stopper and this callback from one
        pickle (``tuner.pkl``), so ``self.health`` is the very stopper Tune asks (checked on a
        real restore in ``tests/sweeps/test_reliability.py``)."""
        self._ensure_loaded()

    def _track_best(self, m: Any) -> None:
        if isinstance(m, (int, float)) and m == m:
            self.best = min(self.best, m) if self.spec.mode == "min" else max(self.best, m)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self._ensure_loaded()
        budget.charge(result)  # the eval's time on the trial's devices; may stop the sweep
        row = row_from_result(result, trial.trial_id)
        verdict = self.health.verdict(trial.trial_id) if self.health is not None else None
        if verdict is not None:  # Tune asked the stopper first: this row is where it fired
            row.update(verdict.columns())
        self.sink.add(row)
        self._track_best(row.get(self.spec.metric))
        if row.get("status") == "failed":  # sweeps.run.not_retried: a configuration error
            console.progress(f"trial {trial.trial_id} failed: {row.get('reason')}")
        self._ticker().reported(trial.trial_id)

    def _ticker(self) -> console.Ticker:
        """A progress line per running trial every 30 s (made on first use: a callback
        unpickled from an older sweep's state has none)."""
        if getattr(self, "ticker", None) is None:
            self.ticker = console.Ticker()
        return self.ticker

    def on_step_end(self, iteration, trials, **info):
        budget.tick()  # budget.wall_hours
        if not self._ticker().due():
            return
        running = [t for t in trials if getattr(t, "status", "") == "RUNNING"]
        board = getattr(self, "setup_dir", None)  # None in a callback pickled before it
        for msg in self.ticker.lines(
                ((t.trial_id, self.sink.rows_of(t.trial_id),
                  self.plan.trial(self.spec, dict(t.config)).config.steps) for t in running),
                setup=(lambda ids: setup_progress.lines_for(board, ids)) if board else None):
            console.progress(msg)

    def _placeholder(self, trial) -> dict[str, Any]:
        knobs = self.plan.trial(self.spec, dict(trial.config)).knobs
        return {"sweep": self.spec.name, **knob_columns(knobs)}

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._ensure_loaded()
        verdict = self.health.verdict(trial.trial_id) if self.health is not None else None
        pruned = verdict.columns() if verdict is not None else (
            recorded_prune(self.sink.rows_of(trial.trial_id)) or self._scheduler_stop(trial))
        status, reason = ("ok", None) if pruned is None else ("pruned", pruned["reason"])
        self.sink.mark(trial.trial_id, status, reason, placeholder=self._placeholder(trial))
        self.done.add(trial.trial_id)
        self.sink.flush()
        self._progress(trials, trial)

    def _scheduler_stop(self, trial) -> dict[str, Any] | None:
        """The scheduler stopped ``trial`` before its last step (``Algorithm.stopped_early``):
        its last row gets the columns of a pruned trial. None if it did not."""
        mine = self.sink.rows_of(trial.trial_id)
        cols = plugin(self.spec.scheduler).stopped_early(
            self.spec, mine, self.plan.trial(self.spec, dict(trial.config)).config.steps)
        if cols is not None:
            self.sink.add({**mine[max(mine)], **cols})
        return cols

    def on_trial_error(self, iteration, trials, trial, **info):
        self._ensure_loaded()
        status, reason, cols = error_outcome(trial)  # oom: killed by Ray's memory monitor
        self.sink.mark(trial.trial_id, status, reason, placeholder=self._placeholder(trial),
                       columns=cols)
        if status == OOM_STATUS:
            console.progress(f"trial {trial.trial_id}: {reason}")
        self.sink.flush()
        self._progress(trials, trial)

    def on_trial_recover(self, iteration, trials, trial, **info):
        status, reason, _ = error_outcome(trial)
        if status == OOM_STATUS:  # Tune retries it (failure.max_failures)
            console.progress(f"trial {trial.trial_id}: {reason.split('; ')[0]}; retrying it")

    def _progress(self, trials, ended) -> None:
        n = len(self.done)
        states = [getattr(t, "status", "") for t in trials if t is not ended]
        console.progress(
            f"{n}/{'≤' if self.at_most else ''}{self.total} trials done "
            f"({states.count('RUNNING')} running, "
            f"{self.sink.count('failed')} failed, "
            f"{self.sink.count('pruned')} pruned)   "
            f"best {self.spec.metric}={self.best:.4f}   "
            f"ETA {console.eta(n, self.total, self.started)}")

    def on_experiment_end(self, trials, **info):
        self._ensure_loaded()
        reconcile(self.sink, trials, signals.received(), budget.stopped_by())
        self.sink.close()

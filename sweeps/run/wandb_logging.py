"""The W&B logger of a sweep: Ray Tune's ``WandbLoggerCallback``, one run per trial in the
sweep's group, with the trial's columns and the provenance as run config and the per-layer MoE
health grouped by layer (what a run holds: docs/looking-at-a-sweep.md). W&B logging is never
what ends a sweep: a dead logging or queue actor (Ray's memory monitor kills them first) loses
W&B logging in one line, and every later call is a no-op (docs/reliability.md); the results
Parquet, which the driver writes itself, stays complete.

Imported only where W&B logs (it imports wandb)."""

from __future__ import annotations

import contextlib
from collections.abc import Collection
from typing import Any

import ray
from ray.air.integrations.wandb import WandbLoggerCallback, _WandbLoggingActor
from ray.exceptions import RayError

from sweeps.run import console
from sweeps.store.oom import is_oom
from sweeps.store.provenance import provenance
from sweeps.store.wandb_keys import HEALTH, merged, nest, wandb_result

STEP_METRICS = (f"{HEALTH}/*", "val_loss", "train_loss", "lr", "aux_loss")
"""Metrics W&B plots against the optimizer ``step`` column (``define_metric``)."""
LOST = "W&B logging lost for the rest of the run"


class StepLoggingActor(_WandbLoggingActor):
    """Ray's logging actor whose run plots ``STEP_METRICS`` against ``step``, defined once the
    run exists (Ray's actor starts it in ``run``)."""

    _defined = False

    def _handle_result(self, result: dict) -> tuple[dict, dict]:
        if not self._defined:
            self._wandb.define_metric("step")
            for name in STEP_METRICS:
                self._wandb.define_metric(name, step_metric="step")
            self._defined = True
        return super()._handle_result(result)


class ProvenanceWandbLogger(WandbLoggerCallback):
    """``WandbLoggerCallback`` whose runs hold the provenance and the trial's columns as config
    and the health metrics by layer (``static``: the sweep's static columns); it gives up W&B
    logging (in one line) rather than the sweep when one of its actors dies."""

    _logger_actor_cls = StepLoggingActor
    lost: str | None = None
    """Why W&B logging was given up, once it was."""

    def __init__(self, *args: Any, static: Collection[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.static = frozenset(static)
        self._configs: dict[Any, dict[str, Any]] = {}  # each trial's run config so far

    def _start_logging_actor(self, trial: Any, exclude_results: list[str],
                             **wandb_init_kwargs: Any) -> None:
        config = nest(dict(wandb_init_kwargs.get("config") or {}))
        config["provenance"] = provenance()
        wandb_init_kwargs["config"] = config
        super()._start_logging_actor(trial, exclude_results, **wandb_init_kwargs)

    def _guarded(self, call: Any, *args: Any, **kwargs: Any) -> None:
        if self.lost is not None:
            return
        try:
            call(*args, **kwargs)
        except (RayError, RuntimeError) as e:  # RuntimeError: Ray's own wrapping of an OOM kill
            if not isinstance(e, RayError) and not is_oom(e):
                raise
            self.give_up(e)

    def _dead_actor(self, trial: Any) -> BaseException | None:
        """The error of ``trial``'s logging actor if it has already ended in one (killed)."""
        fut = self._trial_logging_futures.get(trial)
        if fut is None or not ray.wait([fut], timeout=0)[0]:
            return None
        try:
            ray.get(fut)
        except RayError as e:
            return e
        return None

    def give_up(self, error: BaseException) -> None:
        """Stop logging to W&B for the rest of the run, in one line."""
        why = "killed for memory" if is_oom(error) else type(error).__name__
        self.lost = f"{LOST} (a logging actor died: {why}); results.parquet keeps every row"
        console.progress(self.lost)
        for actor in [*self._trial_logging_actors.values(),
                      *(getattr(q, "actor", None) for q in self._trial_queues.values())]:
            if actor is None or not ray.is_initialized():
                continue
            with contextlib.suppress(Exception):  # already dead: nothing to let go
                ray.kill(actor)
        self._trial_logging_actors, self._trial_logging_futures = {}, {}
        self._logging_future_to_trial, self._trial_queues = {}, {}

    def log_trial_start(self, trial: Any) -> None:
        self._guarded(super().log_trial_start, trial)

    def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
        dead = self._dead_actor(trial) if self.lost is None else None
        if dead is not None:
            self.give_up(dead)
        out = wandb_result(result, self.static)
        # the run config accumulates: each update sends all that the trial has reported
        key = getattr(trial, "trial_id", id(trial))
        out["config"] = self._configs[key] = merged(self._configs.get(key, {}), out["config"])
        self._guarded(super().log_trial_result, iteration, trial, out)

    def log_trial_save(self, trial: Any) -> None:
        self._guarded(super().log_trial_save, trial)

    def log_trial_end(self, trial: Any, failed: bool = False) -> None:
        self._guarded(super().log_trial_end, trial, failed)

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        self._guarded(super().on_experiment_end, trials, **info)

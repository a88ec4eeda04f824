"""The W&B logger of a sweep: Ray Tune's ``WandbLoggerCallback``, one run per trial in the
sweep's group, with

- the run config: the trial's static columns, knobs and effective values (the knob audit),
  nested by YAML path (``sweeps.store.wandb_keys``), and the sweep's provenance
  (``sweeps.store.provenance``: code, library versions, device), so a W&B run can be traced
  like ``summary.json`` and the results Parquet;
- the metrics at each eval, per-layer MoE health namespaced ``health/layer<i>/<stat>``
  (``health/worst/<stat>``, ``health/all/<stat>``) so W&B's panels group it by layer, plotted
  against the optimizer ``step``.

Imported only where W&B logs (it imports wandb)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from ray.air.integrations.wandb import WandbLoggerCallback, _WandbLoggingActor

from sweeps.store.provenance import provenance
from sweeps.store.wandb_keys import HEALTH, nest, wandb_result

STEP_METRICS = (f"{HEALTH}/*", "val_loss", "train_loss", "lr", "aux_loss")
"""Metrics W&B plots against the optimizer ``step`` column (``define_metric``)."""


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
    and the health metrics by layer (``static``: the sweep's static columns)."""

    _logger_actor_cls = StepLoggingActor

    def __init__(self, *args: Any, static: Collection[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.static = frozenset(static)

    def _start_logging_actor(self, trial: Any, exclude_results: list[str],
                             **wandb_init_kwargs: Any) -> None:
        config = nest(dict(wandb_init_kwargs.get("config") or {}))
        config["provenance"] = provenance()
        wandb_init_kwargs["config"] = config
        super()._start_logging_actor(trial, exclude_results, **wandb_init_kwargs)

    def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
        super().log_trial_result(iteration, trial, wandb_result(result, self.static))

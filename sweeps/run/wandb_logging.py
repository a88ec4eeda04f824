"""The W&B logger of a sweep: Ray Tune's ``WandbLoggerCallback`` whose every run config also
holds the sweep's provenance (``sweeps.store.provenance``: code, library versions, device), so a W&B
run can be traced like ``summary.json`` and the results Parquet. Imported only where W&B logs
(it imports wandb)."""

from __future__ import annotations

from typing import Any

from ray.air.integrations.wandb import WandbLoggerCallback

from sweeps.store.provenance import provenance


class ProvenanceWandbLogger(WandbLoggerCallback):
    """``WandbLoggerCallback`` adding ``provenance`` to each trial's run config."""

    def _start_logging_actor(self, trial: Any, exclude_results: list[str],
                             **wandb_init_kwargs: Any) -> None:
        config = dict(wandb_init_kwargs.get("config") or {})
        config["provenance"] = provenance()
        wandb_init_kwargs["config"] = config
        super()._start_logging_actor(trial, exclude_results, **wandb_init_kwargs)

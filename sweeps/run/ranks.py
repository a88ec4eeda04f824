"""The Ray Train TorchTrainer that runs a job on several ranks: a multi-rank trial
(``sweeps.run.trial.run_multi_rank``) or a data-parallel parent (``resources.parent_ranks``,
``sweeps.run.parents``). Each worker holds one trial rank's CPUs and GPUs
(``sweeps.plan.resources.rank_resources``); NCCL on GPUs, gloo on the CPU; Ray Train keeps its
run state and checkpoints under ``<results>/train`` (object storage through the signing
filesystem)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sweeps.plan import resources
from sweeps.spec.sweep import SweepSpec
from sweeps.store.storage import Location, join_uri


def train_storage(spec: SweepSpec) -> Location:
    """Where Ray Train writes the run state and checkpoints of the sweep's multi-rank jobs."""
    return Location.of(join_uri(spec.results_uri, "train"))


def rank_trainer(spec: SweepSpec, fn: Callable[[dict[str, Any]], None], config: dict[str, Any],
                 *, name: str, workers: int, max_failures: int = 0, keep: int | None = None,
                 callbacks: Sequence[Any] = ()) -> Any:
    """A TorchTrainer running ``fn(config)`` on ``workers`` ranks (``max_failures`` worker-group
    restarts, ``keep`` checkpoints kept)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    r, storage = spec.resources, train_storage(spec)
    return TorchTrainer(
        fn, train_loop_config=config,
        torch_config=TorchConfig(backend="nccl" if r.gpus > 0 else "gloo"),
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=r.gpus > 0,
                                     resources_per_worker=resources.rank_resources(spec)),
        run_config=RunConfig(name=name, storage_path=storage.path,
                             storage_filesystem=None if storage.is_local else
                             storage.signed().fs,
                             failure_config=FailureConfig(max_failures=max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=keep),
                             callbacks=list(callbacks)),
    )

"""What each task of a sweep reserves from Ray, and who sees a GPU.

``resources.gpus: auto`` is one GPU per trial rank, parent task and stable-run task when the Ray
cluster has GPUs (:func:`resolve`; ``--dry-run``: :func:`local_cluster`), else none. Since Ray 2.48
a zero-GPU task keeps the parent's ``CUDA_VISIBLE_DEVICES`` (ray#54868) and would train on
``cuda:0`` unreserved: :data:`WORKER_ENV` sets Ray's opt-out (docs/gpu.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moe_core.errors import SearchSpaceError
from moe_core.fsio import atomic_write_text
from moe_core.train.callbacks import Callback
from sweeps.spec.sweep import Resources, SweepSpec

if TYPE_CHECKING:
    from moe_core.train.config import TrainConfig

AUTO = "auto"
ON_ZERO_ENV = "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"
WORKER_ENV = {ON_ZERO_ENV: "1"}
"""Environment of every Ray worker of a sweep: a task or actor given no GPU sees none."""

MULTI_RANK_TOKEN = {"cpu": 0, "memory": 2**20}
"""What the Tune trial of a multi-rank spec reserves itself: a token bundle (its TorchTrainer
workers reserve the CPUs and GPUs, one set per rank; not twice here)."""


def resolve_gpus(gpus: float | str, cluster: Mapping[str, float]) -> float:
    """GPUs per trial rank / parent / stable-run task: ``auto`` is 1 when ``cluster`` (Ray's
    resource totals, e.g. ``ray.cluster_resources()``) has any GPU, else 0; a number as is."""
    if gpus != AUTO:
        return float(gpus)
    return 1.0 if float(cluster.get("GPU", 0) or 0) > 0 else 0.0


def resolve(spec: SweepSpec, cluster: Mapping[str, float]) -> SweepSpec:
    """``spec`` with ``resources.gpus`` a number (see :func:`resolve_gpus`)."""
    r = spec.resources
    return dataclasses.replace(spec, resources=dataclasses.replace(
        r, gpus=resolve_gpus(r.gpus, cluster)))


def _autoscaler_max() -> dict[str, float]:
    """The most resources the autoscaler's node types may bring ({}: no autoscaler config, a
    local cluster)."""
    try:
        from ray._private.state import state

        return state.get_max_resources_from_cluster_config() or {}
    except Exception:  # noqa: BLE001 -- no autoscaler config
        return {}


def ray_cluster() -> dict[str, float]:
    """The running Ray cluster's resources, GPUs counted also where only the autoscaler's
    node types have them (a cluster that starts with no GPU worker and scales up)."""
    import ray

    out, most = dict(ray.cluster_resources()), _autoscaler_max()
    if float(most.get("GPU", 0) or 0) > float(out.get("GPU", 0) or 0):
        out["GPU"] = float(most["GPU"])
    return out


def ray_hosts() -> int:
    """Machines of the running Ray cluster: its alive nodes' distinct addresses (the local fake
    cluster's raylets share 127.0.0.1), one more where its autoscaler may add nodes."""
    import ray

    alive = {n.get("NodeManagerAddress") for n in ray.nodes() if n.get("Alive")}
    most, now = _autoscaler_max(), ray.cluster_resources()
    grows = any(float(most.get(k, 0) or 0) > float(now.get(k, 0) or 0) for k in ("CPU", "GPU"))
    return len(alive) + grows


def local_cluster() -> dict[str, float]:
    """This machine's CPUs and CUDA GPUs, for ``--dry-run`` (which starts no Ray): torch's
    count when torch is loaded already, else ``nvidia-smi -L`` (no torch import on the front
    door), else none."""
    gpus = 0
    if "torch" in sys.modules:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    elif shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                 timeout=10).stdout
            gpus = sum(line.startswith("GPU ") for line in out.splitlines())
        except (OSError, subprocess.SubprocessError):
            gpus = 0
    return {"CPU": float(os.cpu_count() or 1), "GPU": float(gpus)}


def _gpus(r: Resources) -> float:
    if r.gpus == AUTO:
        raise ValueError("resources.gpus=auto is not resolved: call sweeps.plan.resources.resolve "
                         "with the cluster's resources first")
    return float(r.gpus)


def trial_resources(spec: SweepSpec) -> dict[str, float]:
    """``tune.with_resources`` of a trial: its CPUs and GPUs (one rank), or the token bundle
    of a multi-rank trial."""
    r = spec.resources
    if r.ranks > 1:
        return dict(MULTI_RANK_TOKEN)
    return {"cpu": r.cpus, "gpu": _gpus(r)}


def rank_resources(spec: SweepSpec) -> dict[str, float]:
    """``resources_per_worker`` of each rank of a multi-rank trial (Ray Train)."""
    r = spec.resources
    g = _gpus(r)
    return {"CPU": r.cpus, **({"GPU": g} if g else {})}


def task_options(spec: SweepSpec) -> dict[str, float]:
    """Ray options of a parent or stable-run task: what one trial rank reserves."""
    r = spec.resources
    return {"num_cpus": r.cpus, "num_gpus": _gpus(r)}


PARENT_RANKS_AUTO_CAP = 8
"""``resources.parent_ranks: auto`` trains a parent on at most this many ranks: one node of 8
GPUs, whose NVLink keeps data-parallel scaling near the linear scaling the forecast assumes."""


def data_parallel_refusal(child: TrainConfig) -> str | None:
    """Why ``child``'s parent cannot train data-parallel over several ranks, or None."""
    if child.parent is None or child.parent.from_pretrained is not None:
        return "it is loaded, not trained"
    if child.parent_run().moe is not None:
        return "an MoE parent's experts would be split over its ranks"
    return None


def parent_ranks(spec: SweepSpec, child: TrainConfig, gpus: float, waiting_gpus: float) -> int:
    """Ranks that train the parent of ``child`` (a trial config), each holding ``gpus`` GPUs:
    ``resources.parent_ranks`` as given (refused in one line where the parent cannot train on
    them), or for ``auto`` as many as ``waiting_gpus`` (what the trials waiting for it would
    hold) fill with whole GPUs, at most :data:`PARENT_RANKS_AUTO_CAP`, such that the parent's
    global batch splits into whole micro-batches on every rank; 1 on the CPU, with shared
    (fractional) GPUs and for a parent that cannot train data-parallel."""
    want, why = spec.resources.parent_ranks, data_parallel_refusal(child)
    batch = child.parent_run().batch if why is None else None
    if want != AUTO:
        if want > 1 and why is not None:
            raise SearchSpaceError(f"resources.parent_ranks={want}: the parent cannot train on "
                                   f"several ranks ({why}); set resources.parent_ranks: 1")
        if want > 1 and batch is not None and batch.global_batch % (want * batch.micro_batch):
            raise SearchSpaceError(
                f"resources.parent_ranks={want}: the parent's batch.global_batch="
                f"{batch.global_batch} does not split into {want} ranks × micro-batches of "
                f"{batch.micro_batch}; pick a rank count that divides it, or auto")
        return int(want)
    if gpus < 1 or batch is None:
        return 1
    cap = max(1, min(PARENT_RANKS_AUTO_CAP, int(waiting_gpus // gpus)))
    return max(n for n in range(1, cap + 1)
               if batch.global_batch % (n * batch.micro_batch) == 0)


def reservations(spec: SweepSpec) -> list[tuple[str, dict[str, float]]]:
    """(task, {resource: amount}) of every kind of task the sweep starts (a resolved spec)."""
    r = spec.resources
    task = {"CPU": r.cpus, "GPU": _gpus(r)}  # one rank's: a trial (rank), parent or stable run
    rows = [("trial (Tune)", {k: v for k, v in MULTI_RANK_TOKEN.items() if v}),
            (f"trial rank (x{r.ranks})", task)] if r.ranks > 1 else [("trial", task)]
    pr = r.parent_ranks
    return rows + [("parent" if pr == 1 else f"parent rank (x{pr})" if pr != AUTO else
                    "parent rank (auto)", task),
                   ("stable run", task)]


def describe(spec: SweepSpec, resolved: SweepSpec, cluster: Mapping[str, float],
             where: str) -> list[str]:
    """The lines ``--dry-run`` prints: what each task reserves, and how ``auto`` resolved."""
    gpus = spec.resources.gpus
    head = (f"resources.gpus=auto -> {resolved.resources.gpus:g} per task ({where}: "
            f"{cluster.get('GPU', 0):g} GPU(s); a cluster with GPUs gives 1)"
            if gpus == AUTO else f"resources.gpus={float(gpus):g} per task (as the spec says)")
    out = [head]
    for name, res in reservations(resolved):
        parts = [f"memory {v:,.0f} B" if k == "memory" else f"{k} {v:g}" for k, v in res.items()]
        out.append(f"  {name:<16} reserves {', '.join(parts)}")
    if resolved.resources.gpus == 0:
        out.append("  zero-GPU work runs with CUDA_VISIBLE_DEVICES='' (Ray's "
                   f"{ON_ZERO_ENV}=1): it never trains on a GPU it did not reserve")
    return out


# ---- where a parent or stable run trained ------------------------------------------------------


def placement() -> dict[str, Any]:
    """Where this Ray worker trains: its Ray-assigned GPU ids and ``CUDA_VISIBLE_DEVICES``."""
    import ray

    try:  # outside Ray, asking would start a local Ray instance in this process
        ids = [str(i) for i in ray.get_gpu_ids()] if ray.is_initialized() else None
    except Exception:  # noqa: BLE001 -- not in a Ray worker
        ids = None
    return {"ray_gpu_ids": ids, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def node_id() -> str | None:
    """The Ray node this process runs on (None outside Ray)."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def stamp_placement(checkpoint: str | Path, started: float | None = None) -> None:
    """Record :func:`placement` under ``placement`` in a checkpoint's ``meta.json`` (which its
    SHA-256 list does not cover), atomically; with ``started`` (epoch seconds) also ``span``:
    the Ray node it trained on (``node_id``), ``start`` and ``end`` (now), which the scheduling
    proof reads (docs/cluster.md §4)."""
    meta = Path(checkpoint) / "meta.json"
    m = json.loads(meta.read_text())
    m["placement"] = placement()
    if started is not None:
        m["span"] = {"node_id": node_id(), "start": started, "end": time.time()}
    atomic_write_text(meta, json.dumps(m, indent=1))


class PlacementStamp(Callback):
    """Stamps :func:`placement` into each checkpoint a run writes (a WSD stable-run task)."""

    def on_checkpoint(self, step: int, path: Path) -> None:
        stamp_placement(path)

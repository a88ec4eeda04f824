"""Which device a trial (or a parent / stable-run task) trains on, given the GPUs Ray lent it:
CUDA, else a one-line error (training on the CPU would hide a broken node behind a run 100x
slower) unless ``UPCYCLE_SWEEPS_ALLOW_CPU_FOR_GPU=1`` is in the driver's environment (passed to
every trial: ``sweeps.run.driver.PASS_ENV``), as the local fake cluster's logical GPUs need
(docs/cluster.md §1).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from moe_core.errors import ConfigError, UpcycleError

ALLOW_CPU_ENV = "UPCYCLE_SWEEPS_ALLOW_CPU_FOR_GPU"


def allow_cpu_for_gpu(env: Mapping[str, str] | None = None) -> bool:
    """The switch: ``1`` on, ``0`` or unset off; any other value is refused."""
    value = (os.environ if env is None else env).get(ALLOW_CPU_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ConfigError(f"{ALLOW_CPU_ENV}={value!r} must be 1 (a trial holding a GPU "
                          "reservation may train on the CPU when CUDA is absent) or 0/unset")
    return value == "1"


def device_for(gpu_ids: Sequence[object], cuda: bool, allow_cpu: bool) -> str:
    """``"cuda"`` or ``"cpu"`` for a task holding the GPUs ``gpu_ids`` (Ray's
    ``get_gpu_ids()``), where ``cuda`` says whether torch sees CUDA."""
    if cuda:
        return "cuda"
    if gpu_ids and not allow_cpu:
        import torch

        raise UpcycleError(
            f"this trial holds GPU reservation {list(gpu_ids)} but CUDA is not available on its "
            f"node (torch {torch.__version__}); fix the node's CUDA, set resources.gpus: 0, or "
            f"set {ALLOW_CPU_ENV}=1 in the driver's environment to train on the CPU (logical "
            "GPUs of a test cluster)")
    return "cpu"


def check_reserved_device() -> str:
    """The device this Ray task or actor trains on, raising the one-line error of
    :func:`device_for` when it holds a GPU and CUDA is absent without the switch. Outside Ray
    (a trial run in-process) nothing is reserved: Ray is not asked, since ``ray.get_gpu_ids``
    would start a local Ray instance in this process."""
    import ray
    import torch

    ids = ray.get_gpu_ids() if ray.is_initialized() else []
    return device_for(ids, torch.cuda.is_available(), allow_cpu_for_gpu())

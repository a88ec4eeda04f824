"""Which device a trial (or a parent / stable-run task) trains on, given the GPUs Ray lent it.

A task that holds a GPU reservation trains on CUDA. Where CUDA is absent (the logical GPUs of
the local fake cluster, ``sweeps.cluster.local``, or a node whose driver is broken), training on
the CPU instead would hide the problem behind a run 100x slower, so it is a one-line error
before training starts, unless ``UPCYCLE_SWEEPS_ALLOW_CPU_FOR_GPU=1`` is set in the driver's
environment (the driver passes it to every trial, see ``sweeps.run.driver.PASS_ENV``): then the
trial trains on the CPU while holding the GPU reservation, which is what a laptop or CI run of
the GPU path needs.
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
        raise UpcycleError(
            f"this trial holds GPU reservation {list(gpu_ids)} but CUDA is not available on its "
            f"node (torch {_torch_version()}); fix the node's CUDA, set resources.gpus: 0, or "
            f"set {ALLOW_CPU_ENV}=1 in the driver's environment to train on the CPU (logical "
            "GPUs of a test cluster)")
    return "cpu"


def _torch_version() -> str:
    import torch

    return torch.__version__


def check_reserved_device() -> str:
    """The device this Ray task or actor trains on, raising the one-line error of
    :func:`device_for` when it holds a GPU and CUDA is absent without the switch. Outside Ray
    (a trial run in-process) nothing is reserved: Ray is not asked, since ``ray.get_gpu_ids``
    would start a local Ray instance in this process."""
    import ray
    import torch

    ids = ray.get_gpu_ids() if ray.is_initialized() else []
    return device_for(ids, torch.cuda.is_available(), allow_cpu_for_gpu())

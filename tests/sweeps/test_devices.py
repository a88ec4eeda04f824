"""The GPU-reservation-without-CUDA switch (``sweeps.plan.devices``)."""

import pytest

from moe_core.errors import ConfigError, UpcycleError
from sweeps.plan.devices import ALLOW_CPU_ENV, allow_cpu_for_gpu, device_for


def test_gpu_reservation_without_cuda_is_an_error_unless_switched_on():
    with pytest.raises(UpcycleError, match=f"holds GPU reservation \\[0\\].*{ALLOW_CPU_ENV}=1"):
        device_for([0], cuda=False, allow_cpu=False)
    assert device_for([0], cuda=False, allow_cpu=True) == "cpu"
    assert device_for([0], cuda=True, allow_cpu=False) == "cuda"
    assert device_for([], cuda=False, allow_cpu=False) == "cpu"  # no GPU held: the CPU path


def test_switch_values():
    assert allow_cpu_for_gpu({ALLOW_CPU_ENV: "1"}) is True
    assert allow_cpu_for_gpu({ALLOW_CPU_ENV: "0"}) is False
    assert allow_cpu_for_gpu({}) is False
    with pytest.raises(ConfigError, match=f"{ALLOW_CPU_ENV}='yes' must be 1"):
        allow_cpu_for_gpu({ALLOW_CPU_ENV: "yes"})


@pytest.mark.slow
@pytest.mark.distributed  # starts Ray
def test_a_ray_task_holding_a_logical_gpu_without_cuda(monkeypatch):
    """Through Ray itself: a task holding one of Ray's logical GPUs (no CUDA here) gets the
    one-line error, or trains on the CPU with the switch (the env reaches it as a trial's does,
    through runtime_env)."""
    import ray
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available: the reservation is honoured")
    from sweeps.plan.devices import check_reserved_device

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray.init(address="local", num_cpus=1, num_gpus=1, include_dashboard=False,
             log_to_driver=False)
    try:
        task = ray.remote(num_gpus=1, num_cpus=0)(check_reserved_device)
        with pytest.raises(UpcycleError, match=f"holds GPU reservation.*{ALLOW_CPU_ENV}=1"):
            ray.get(task.remote())
        on = task.options(runtime_env={"env_vars": {ALLOW_CPU_ENV: "1"}})
        assert ray.get(on.remote()) == "cpu"
    finally:
        ray.shutdown()


def test_outside_ray_no_reservation_and_no_ray_started():
    """A trial run in-process (tests, ``python -m moe_core.train``) holds no reservation, and
    checking must not start a local Ray instance in the process (``ray.get_gpu_ids`` would)."""
    import ray

    from sweeps.plan.devices import check_reserved_device
    from sweeps.plan.resources import placement

    if ray.is_initialized():
        pytest.skip("Ray is running in this process")
    check_reserved_device()
    assert placement()["ray_gpu_ids"] is None
    assert not ray.is_initialized()

"""The GPU-reservation-without-CUDA switch (``sweeps.devices``)."""

import pytest

from moe_core.errors import ConfigError, UpcycleError
from sweeps.devices import ALLOW_CPU_ENV, allow_cpu_for_gpu, device_for


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

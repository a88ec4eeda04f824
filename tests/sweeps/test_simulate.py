"""``sweeps.testing.simulate``'s noise: the shared part of a group, constant over the group or
fading along D2 with the stated correlation length (checked against the kernel over many groups)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sweeps.testing.simulate import SimulatedStudy

D2 = [1e9 * 2 ** k for k in range(5)]  # 0 … 4 octaves


def _shared(study: SimulatedStudy, groups: int) -> np.ndarray:
    """ln(loss / truth) of each group's branches at D2 (own noise 0: the shared part alone)."""
    return np.array([[math.log(study.loss({"D1": 1e9, "D2": d}, group=f"g{k}")
                               / study.true_loss({"D1": 1e9, "D2": d})) for d in D2]
                     for k in range(groups)])


def test_constant_shared_noise_is_one_number_per_group():
    X = _shared(SimulatedStudy(sigma=0.0, sigma_group=0.01, seed=1), 50)
    assert np.allclose(X, X[:, :1])
    assert X[:, 0].std() == pytest.approx(0.01, rel=0.3)


def test_fading_shared_noise_follows_its_kernel():
    length = 1.5
    X = _shared(SimulatedStudy(sigma=0.0, sigma_group=0.01, seed=2, group_length=length), 1500)
    assert X.std(axis=0) == pytest.approx([0.01] * 5, rel=0.1)
    corr = np.corrcoef(X.T)[0, 1:]
    kernel = [math.exp(-d * d / (2 * length ** 2)) for d in range(1, 5)]
    assert corr == pytest.approx(kernel, abs=0.08)
    assert corr[3] < 0.2 < corr[0]  # far budgets nearly independent, near ones not


def test_group_length_must_be_positive():
    with pytest.raises(ValueError, match="group_length"):
        SimulatedStudy(group_length=0.0)

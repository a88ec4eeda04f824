"""bench/law_design_bound.py's numerical claims, against direct computations: the latent-effect
information is the generalised-least-squares information under equicorrelated branch noise, and
the relaxed once-each programme returns a design that reaches the width it was asked for."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "law_design_bound.py"
_spec = importlib.util.spec_from_file_location("law_design_bound", _PATH)
bound = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bound)


def _gls_variance(rows, sizes, g, sigma, sg):
    Z = np.zeros((len(rows), len(sizes)))
    Z[np.arange(len(rows)), np.repeat(np.arange(len(sizes)), sizes)] = 1.0
    cov = sigma ** 2 * np.eye(len(rows)) + sg ** 2 * Z @ Z.T
    return float(g @ np.linalg.solve(rows.T @ np.linalg.solve(cov, rows), g))


@pytest.mark.parametrize("sg", [0.0, 0.002, 0.01])
def test_latent_effects_give_the_gls_variance(sg):
    rng = np.random.default_rng(3)
    sizes = [3, 5, 2, 4]
    rows, g = rng.normal(size=(sum(sizes), 4)), rng.normal(size=4)
    J, P, gt = bound.augmented(rows, sizes, g, 0.003, sg)
    assert J.shape == (14, 4 if sg == 0 else 8)
    v = float(gt @ np.linalg.solve(J.T @ J + P, gt))
    assert v == pytest.approx(_gls_variance(rows, sizes, g, 0.003, sg), rel=1e-9)


def test_shared_noise_makes_a_groups_branches_worth_less():
    """With one group of many branches the shared effect cannot be averaged away: the variance
    of the mean level stays ≥ σ_g², where independent branches would give σ²/n."""
    n = 50
    rows, g = np.ones((n, 1)), np.ones(1)
    J, P, gt = bound.augmented(rows, [n], g, 0.003, 0.01)
    v = float(gt @ np.linalg.solve(J.T @ J + P, gt))
    assert v == pytest.approx(0.01 ** 2 + 0.003 ** 2 / n, rel=1e-9)


def test_once_each_design_reaches_the_width_and_is_no_cheaper_than_its_bound():
    rng = np.random.default_rng(0)
    sizes = [6, 6, 6]
    rows = rng.normal(size=(18, 4))
    g = rng.normal(size=4)
    cost = rng.uniform(0.5, 2.0, size=18)
    J, P, gt = bound.augmented(rows, sizes, g, 0.003, 0.002)
    full = float(gt @ np.linalg.solve(J.T @ J + P, gt))
    relaxed, rounded = bound.once_each(J, cost, gt, 1.5 * full, P)
    assert relaxed <= rounded <= cost.sum() + 1e-9
    assert relaxed < cost.sum()  # a looser width than every branch's needs less than all of them
    assert bound.once_each(J, cost, gt, 0.5 * full, P) is None  # tighter than every branch gives


def test_group_information_is_the_schur_complement_of_the_latent_effect():
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(6, 4))
    member = np.array([[1, 0, 1, 1, 0, 1], [1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 0, 0]], bool)
    infos = bound.group_information(rows, member, 0.003, 0.004)
    for t, m in enumerate(member):
        J, P, _ = bound.augmented(rows[m], [int(m.sum())], np.zeros(4), 0.003, 0.004)
        F = J.T @ J + P  # information on (θ, u); the u block integrated out:
        schur = F[:4, :4] - np.outer(F[:4, 4], F[4, :4]) / F[4, 4]
        np.testing.assert_allclose(infos[t], schur, rtol=1e-10, atol=1e-6)


def test_cheapest_stable_runs_on_a_case_solved_by_hand():
    """One parameter, types of information a_t at price c_t: the cheapest way to variance v buys
    only the type with the largest a/c, for c/(a·v)."""
    a, c, v = np.array([2.0, 5.0, 3.0]), np.array([1.0, 4.0, 1.0]), 0.01
    r = bound.cheapest_stable_runs(a[:, None, None], c, np.ones(1), v)
    best = 1.0 / (3.0 * v)
    assert r["lower"] == pytest.approx(best, rel=1e-3) and r["upper"] == pytest.approx(best,
                                                                                       rel=1e-3)
    assert r["shares"].argmax() == 2


def test_certified_bound_holds_before_convergence():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(30, 3, 3))
    infos = np.einsum("tij,tkj->tik", X, X)  # PSD types
    cost, g = rng.uniform(0.5, 2.0, 30), rng.normal(size=3)
    exact = bound.cheapest_stable_runs(infos, cost, g, 1.0, iters=4000)
    early = bound.cheapest_stable_runs(infos, cost, g, 1.0, iters=2)
    assert exact["lower"] <= exact["upper"] * (1 + 1e-9)
    assert early["lower"] <= exact["upper"] * (1 + 1e-9) <= early["upper"] * (1 + 1e-9)
    assert exact["upper"] <= exact["lower"] * (1 + 1e-3)


def test_fading_shared_noise_spans_equicorrelated_to_independent():
    """The kernel form: a length far beyond the axis is the equicorrelated closed form; a length
    far below the spacing leaves each branch independent with variance σ² + σ_g²."""
    rng = np.random.default_rng(4)
    rows = rng.normal(size=(5, 4))
    octaves = np.arange(5.0)
    member = np.array([[1, 1, 1, 1, 1], [1, 0, 1, 0, 1], [0, 1, 0, 0, 1]], bool)
    flat = bound.group_information(rows, member, 0.003, 0.004)
    long = bound.group_information(rows, member, 0.003, 0.004, octaves, 1e5)
    np.testing.assert_allclose(long, flat, rtol=1e-6, atol=1e-3)
    short = bound.group_information(rows, member, 0.003, 0.004, octaves, 1e-3)
    for t, m in enumerate(member):
        np.testing.assert_allclose(short[t], rows[m].T @ rows[m] / (0.003 ** 2 + 0.004 ** 2),
                                   rtol=1e-9)

"""scaling.design's numerical claims (studies/law_design_bound.py's maths), against direct
computations: the law's Jacobian is Eq. 8's hand derivative, g moves D* as a recomputed crossing
does, the latent-effect information is the generalised-least-squares information under
equicorrelated branch noise, and the relaxed once-each programme returns a design that reaches
the width it was asked for."""

from __future__ import annotations

import numpy as np
import pytest

import scaling.design as bound
from scaling.laws import TABLE2, get_law


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


def _hand_jacobian(th, E, l1, l2):
    """∂ ln L/∂(ln A, α1, α2, α3) of 000 Eq. 8 at log tokens, by hand: with
    t = A·D1^−α1·D2^(−α2+α3·ln D1), ∂ ln(t + E)/∂θ = t/(t + E)·∂ ln t/∂θ."""
    t = np.exp(th[0] - th[1] * l1 - th[2] * l2 + th[3] * l1 * l2)
    return ((t / (t + E)) * np.array([np.ones_like(l1), -l1, -l2, l1 * l2])).T


def test_the_laws_jacobian_is_the_hand_derivative_of_eq8():
    u = TABLE2["upcycled"]
    E = 0.3
    theta = {"ln_A": np.log(u["A"]), "alpha1": u["alpha1"], "alpha2": u["alpha2"],
             "alpha3": u["alpha3"], "ln_E": np.log(E)}
    l1, l2 = np.log(np.array([5e8, 2e9, 8e9])), np.log(np.array([1e9, 5e8, 4e9]))
    J = bound.jacobian(get_law("upcycled_mul"), theta, ("ln_A", "alpha1", "alpha2", "alpha3"),
                       {"D1": np.exp(l1), "D2": np.exp(l2)})
    th = np.array([theta["ln_A"], u["alpha1"], u["alpha2"], u["alpha3"]])
    assert np.allclose(J, _hand_jacobian(th, E, l1, l2), rtol=1e-7, atol=1e-10)


def test_dstar_gradient_moves_dstar_as_a_refit_would():
    """g·δθ predicts the shift of ln D* when θ moves by δθ (the crossing recomputed)."""
    from scipy.optimize import brentq

    law, free = get_law("upcycled_mul"), ("ln_A", "alpha1", "alpha2", "alpha3")
    u = TABLE2["upcycled"]
    theta = {"ln_A": np.log(u["A"]), "alpha1": u["alpha1"], "alpha2": u["alpha2"],
             "alpha3": u["alpha3"], "ln_E": np.log(0.3)}
    s = {"A": 32.0, "alpha": 0.161, "E": 0.3}
    sc = get_law("chinchilla_d")

    def scratch(l):
        return sc.log_predict(s, {"D": np.exp(l)})

    def ln_dstar(th):
        def gap(lnd):
            d = np.array([np.exp(lnd)])
            return float(scratch(np.array([lnd]))[0]
                         - law.log_predict({"A": np.exp(th["ln_A"]), "alpha1": th["alpha1"],
                                            "alpha2": th["alpha2"], "alpha3": th["alpha3"],
                                            "E": np.exp(th["ln_E"])}, {"D1": d, "D2": d})[0])
        return brentq(gap, np.log(1e3), np.log(1e17))

    l0 = ln_dstar(theta)
    g = bound.dstar_gradient(law, theta, free, scratch, l0)
    for j, k in enumerate(free):  # central differences of the recomputed crossing
        up, dn = dict(theta), dict(theta)
        up[k] += 1e-5
        dn[k] -= 1e-5
        assert (ln_dstar(up) - ln_dstar(dn)) / 2e-5 == pytest.approx(g[j], rel=1e-4), k

"""The fading-kernel parametric bootstrap (issue #30): a group's shared noise with correlation
exp(−d²/2ℓ²) between branches d octaves of D2 apart (the kernel sweeps.testing.simulate draws from).
Its limits are the existing bootstraps: ℓ = inf the equicorrelated one, τ = 0 independent."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scaling.bootstrap import (
    NoiseComponents,
    _kernel_root,
    _resample_log,
    group_matrix,
    group_noise_bootstrap,
    kernel_matrix,
    noise_components,
)
from scaling.fit import fit
from scaling.laws import Points, get_law

TRUTH = {"A": 16.3, "alpha1": 0.043, "alpha2": 0.085, "E": 0.9}
LAW = "upcycled_mul_noint"


def _fading(seed: int, groups: int = 5, per: int = 5, sg: float = 0.02, se: float = 0.003,
            length: float = 2.0):
    """A D1 × D2 grid, each D1 one group whose shared noise fades along log2 D2."""
    rng = np.random.default_rng(seed)
    d1 = np.repeat(np.geomspace(0.5e9, 8e9, groups), per)
    d2 = np.tile(np.geomspace(0.5e9, 8e9, per), groups)
    g = tuple(f"g{i}" for i in np.repeat(np.arange(groups), per))
    K = kernel_matrix(g, np.log2(d2), length)
    ln_true = np.log(TRUTH["A"] * d1 ** -TRUTH["alpha1"] * d2 ** -TRUTH["alpha2"] + TRUTH["E"])
    u = rng.multivariate_normal(np.zeros(len(d1)), sg ** 2 * K)
    L = np.exp(ln_true + u + rng.normal(0, se, len(d1)))
    return Points({"D1": d1, "D2": d2}, L, tuple(f"t{i}" for i in range(len(d1)))), g


def test_kernel_matrix_by_hand():
    t = np.array([0.0, 1.0, 3.0, 0.0])
    K = kernel_matrix(["a", "a", "a", None], t, 2.0)
    assert K[0, 1] == pytest.approx(math.exp(-1 / 8))       # 1 octave apart, ℓ = 2
    assert K[0, 2] == pytest.approx(math.exp(-9 / 8))       # 3 octaves
    assert K[1, 2] == pytest.approx(math.exp(-4 / 8))
    assert K[0, 3] == 0 and K[3, 3] == 1                    # no group: only itself
    np.testing.assert_array_equal(kernel_matrix(["a", "a", None], t[:3], None),
                                  group_matrix(["a", "a", None]))
    np.testing.assert_array_equal(kernel_matrix(["a", "a", None], t[:3], math.inf),
                                  group_matrix(["a", "a", None]))


def test_components_limits_are_the_existing_estimators():
    """ℓ → inf: the equicorrelated components; τ = 0 given (icc 0): RSS / tr M whatever ℓ."""
    pts, groups = _fading(1)
    r = fit(LAW, pts, fixed={"E": TRUTH["E"]})
    law = get_law(LAW)
    eq, far = (noise_components(law, pts, r, groups, length=ell) for ell in (None, 1e7))
    assert far.own == pytest.approx(eq.own, rel=1e-6)
    assert far.shared == pytest.approx(eq.shared, rel=1e-6)
    assert far.length == 1e7 and eq.length is None
    eq_g, far_g = (noise_components(law, pts, r, groups, icc=0.6, length=ell)
                   for ell in (None, 1e7))
    assert far_g.total == pytest.approx(eq_g.total, rel=1e-6)
    ind = noise_components(law, pts, r, [None] * len(pts))
    for ell in (0.5, 2.0):
        zero = noise_components(law, pts, r, groups, icc=0.0, length=ell)
        assert zero.shared == 0 and zero.own == pytest.approx(ind.own, rel=1e-9)


def test_fading_components_by_hand():
    """icc given: σ² = rᵀr / tr(M((1 − icc)I + icc·K_ℓ)M), M = I − J J⁺ (computed here)."""
    pts, groups = _fading(2)
    r = fit(LAW, pts, fixed={"E": TRUTH["E"]})
    law = get_law(LAW)
    comp = noise_components(law, pts, r, groups, icc=0.9, length=1.5)
    h = 1e-6
    free = [p for p in law.params if p.name != "E"]
    theta = {p.name: r.params[p.name] for p in law.params}

    def ln_pred(name, step):
        q = dict(theta)
        p = law.param(name)
        q[name] = p.to_natural(p.to_fit(theta[name]) + step)
        return np.log(law.predict(q, pts.x))

    J = np.stack([(ln_pred(p.name, h) - ln_pred(p.name, -h)) / (2 * h) for p in free], axis=1)
    M = np.eye(len(pts)) - J @ np.linalg.pinv(J)
    K = np.array([[math.exp(-(a - b) ** 2 / (2 * 1.5 ** 2)) if ga == gb else 0.0
                   for b, gb in zip(np.log2(pts.x["D2"]), groups)]
                  for a, ga in zip(np.log2(pts.x["D2"]), groups)])
    var = float(r.residuals @ r.residuals) / np.trace(M @ (0.1 * np.eye(len(pts)) + 0.9 * K) @ M)
    assert comp.total == pytest.approx(var, rel=1e-4)
    assert comp.icc == pytest.approx(0.9)


def test_fading_resample_has_the_kernel_covariance():
    """The draws' covariance is s²·I + τ²·K_ℓ (5 000 draws; sampling error ~3 %)."""
    groups = ["a"] * 4 + ["b"] * 2
    t = np.array([0.0, 1.0, 2.0, 4.0, 0.0, 3.0])
    comp = NoiseComponents(own=0.2, shared=1.0, groups=2, length=2.0)
    root = _kernel_root(groups, t, 2.0)
    rng = np.random.default_rng(0)
    draws = np.array([_resample_log(np.zeros(6), comp, groups, rng, root) for _ in range(5000)])
    want = 0.2 * np.eye(6) + kernel_matrix(groups, t, 2.0)
    np.testing.assert_allclose(np.cov(draws.T), want, atol=0.08)
    assert want[0, 3] < 0.15 and want[0, 1] > 0.85  # fades: far branches nearly independent


@pytest.mark.slow
def test_bootstrap_limits_match_the_existing_bootstraps():
    """ℓ = 1e6 gives the equicorrelated bootstrap's spread; τ = 0 gives the independent one's
    (200 resamples each, the same seeds but other draws: the interquartile range of α1 is
    compared, within 20 %)."""
    pts, groups = _fading(3)
    r = fit(LAW, pts, fixed={"E": TRUTH["E"]})

    def spread(**kw):
        boot, _ = group_noise_bootstrap(LAW, pts, r, groups, 200, seed=7, **kw)
        col = boot[:, 1][np.isfinite(boot[:, 1])]
        return float(np.subtract(*np.percentile(col, [75, 25])))

    assert spread(length=1e6, icc=0.8) == pytest.approx(spread(icc=0.8), rel=0.2)
    assert spread(length=1.0, icc=0.0) == pytest.approx(spread(icc=0.0), rel=0.2)
    # and the fading model is in between: shorter ℓ, less shared, narrower (here)
    assert spread(length=0.3, icc=0.8) < spread(icc=0.8)

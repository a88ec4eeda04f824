"""Scaling laws and the fitter: hand values, planted-truth recovery, LOO model selection,
invariances, fixed/shared parameters, bootstrap intervals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.data import load_points
from moe_core.errors import FitError
from scaling.fit import fit, fit_shared
from scaling.laws import LAWS, TABLE2, Law, Param, Points, get_law, register


def _grid_d1d2(n1=5, n2=5, lo=1e9, hi=1e11):
    g = np.exp(np.linspace(math.log(lo), math.log(hi), n1))
    h = np.exp(np.linspace(math.log(lo), math.log(hi), n2))
    D1, D2 = np.meshgrid(g, h, indexing="ij")
    return {"D1": D1.ravel(), "D2": D2.ravel()}


def _noisy(law, params, x, sigma, seed=0):
    L = law.predict(params, x)
    return L * np.exp(np.random.default_rng(seed).normal(0.0, sigma, len(L)))


# ---- the laws by hand ---------------------------------------------------------------------------


def test_chinchilla_by_hand():
    p = {"A": 400.0, "alpha": 0.3, "B": 10.0, "beta": 0.1, "E": 1.7}
    L = get_law("chinchilla").predict(p, {"N": np.array([1e8]), "D": np.array([1e10])})
    assert L[0] == pytest.approx(400 * 1e10 ** -0.3 + 10 * 1e8 ** -0.1 + 1.7, rel=1e-12)


def test_upcycled_mul_and_add_by_hand():
    x = {"D1": np.array([2e9]), "D2": np.array([5e9])}
    p = {"A": 16.3, "alpha1": 0.043, "alpha2": 0.085, "alpha3": 7.98e-4, "E": 0.165}
    ex = -0.085 + 7.98e-4 * math.log(2e9)
    want = 16.3 * 2e9 ** -0.043 * 5e9 ** ex + 0.165
    assert get_law("upcycled_mul").predict(p, x)[0] == pytest.approx(want, rel=1e-12)
    q = {"A": 3.0, "alpha1": 0.05, "F": 7.0, "alpha2": 0.09, "alpha3": 1e-3, "E": 0.4}
    want = 3.0 * 2e9 ** -0.05 + 7.0 * 5e9 ** (-0.09 + 1e-3 * math.log(2e9)) + 0.4
    assert get_law("upcycled_add").predict(q, x)[0] == pytest.approx(want, rel=1e-12)
    noint = {k: v for k, v in q.items() if k != "alpha3"}
    want = 3.0 * 2e9 ** -0.05 + 7.0 * 5e9 ** -0.09 + 0.4
    assert get_law("upcycled_add_noint").predict(noint, x)[0] == pytest.approx(want, rel=1e-12)


def test_model_config_and_joint_by_hand():
    x = {"P": np.array([4.0]), "N2": np.array([3e8])}
    p = {"A": 2.0, "beta1": 1.87, "F": 30.0, "beta2": 0.34, "E": 1.0}
    want = 2.0 * 4.0 ** -1.87 + 30.0 * 3e8 ** -0.34 + 1.0  # 000 Eq. 11
    assert get_law("model_config_add").predict(p, x)[0] == pytest.approx(want, rel=1e-12)
    m = {"A": 50.0, "beta1": 0.2, "beta2": 0.15, "beta3": 0.01, "E": 1.0}
    want = 50.0 * 4.0 ** -0.2 * 3e8 ** (-0.15 + 0.01 * math.log(4.0)) + 1.0  # Eq. 17
    assert get_law("model_config_mul").predict(m, x)[0] == pytest.approx(want, rel=1e-12)
    u = TABLE2["upcycled"]
    xj = {"D1": np.array([4e9]), "D2": np.array([4e9]), "N1": np.array([1e9])}
    want = (u["A"] * 4e9 ** -u["alpha1"] * 4e9 ** (-u["alpha2"] + u["alpha3"] * math.log(4e9))
            + u["B"] * 1e9 ** -u["beta"] + u["E"])
    got = get_law("joint_upcycled").predict(u, xj)[0]
    assert got == pytest.approx(want, rel=1e-12)
    assert got == pytest.approx(2.424, abs=2e-3)  # a plausible loss: Table 2 is in raw tokens


def test_logsumexp_is_stable_for_tiny_terms():
    law = get_law("chinchilla")
    p = {"A": 1e-300, "alpha": 0.5, "B": 1e-300, "beta": 0.5, "E": 1.0}
    L = law.predict(p, {"N": np.array([1e300]), "D": np.array([1e300])})
    assert L[0] == pytest.approx(1.0)


def test_register_custom_law_and_errors():
    law = Law("test_single_power", ("D",), (Param("A", "scale", init=(0.0, 3.0)),
                                            Param("alpha", bounds=(0.0, 2.0), init=(0.2,)),
                                            Param("E", "scale", init=(0.0,))),
              lambda p, x: [p["ln_A"] - p["alpha"] * np.log(x["D"]), p["ln_E"]])
    register(law, replace=True)
    try:
        x = {"D": np.exp(np.linspace(10, 20, 12))}
        truth = {"A": 30.0, "alpha": 0.25, "E": 1.2}
        r = fit("test_single_power", Points(x, law.predict(truth, x)))
        for k, v in truth.items():
            assert r.params[k] == pytest.approx(v, rel=1e-3)
        with pytest.raises(FitError, match="already registered"):
            register(law)
    finally:
        LAWS.pop("test_single_power", None)
    with pytest.raises(FitError, match="unknown law"):
        get_law("nope")
    with pytest.raises(FitError, match="no parameter 'Q'"):
        fit("chinchilla", Points({"N": np.ones(9) * 1e8, "D": np.ones(9) * 1e9}, np.ones(9)),
            fixed={"Q": 1.0})
    with pytest.raises(FitError, match="free parameters but only 3 points"):
        fit("chinchilla", Points({"N": np.ones(3) * 1e8, "D": np.ones(3) * 1e9}, np.ones(3)))
    with pytest.raises(FitError, match="non-positive"):
        fit("chinchilla", Points({"N": np.ones(9) * 1e8, "D": np.zeros(9)}, np.ones(9)))


# ---- planted truth ------------------------------------------------------------------------------

PLANTED = {
    "chinchilla": ({"A": 406.4, "alpha": 0.34, "B": 410.7, "beta": 0.28, "E": 1.69},
                   lambda rng: {"N": np.exp(rng.uniform(math.log(1e7), math.log(1e10), 60)),
                                "D": np.exp(rng.uniform(math.log(1e8), math.log(1e12), 60))}),
    "upcycled_mul": ({"A": 16.3, "alpha1": 0.043, "alpha2": 0.085, "alpha3": 7.98e-4,
                      "E": 1.2}, lambda rng: _grid_d1d2(6, 6, 1e8, 1e12)),
    "upcycled_add": ({"A": 6.0, "alpha1": 0.09, "F": 12.0, "alpha2": 0.12, "alpha3": 1.5e-3,
                      "E": 1.0}, lambda rng: _grid_d1d2(6, 6, 1e8, 1e12)),
    "model_config_add": ({"A": 0.8, "beta1": 1.0, "F": 40.0, "beta2": 0.34, "E": 1.3},
                         lambda rng: {"P": np.repeat([1.0, 2.0, 4.0, 8.0, 16.0], 6),
                                      "N2": np.tile(np.exp(np.linspace(15, 21, 6)), 5)}),
    "joint_upcycled": ({**TABLE2["upcycled"], "E": 0.9},
                       lambda rng: {**_grid_d1d2(5, 5, 1e8, 1e12),
                                    "N1": np.exp(rng.uniform(math.log(1e7), math.log(1e10), 25))}),
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_planted_truth_is_recovered(name):
    truth, make = PLANTED[name]
    law = get_law(name)
    x = make(np.random.default_rng(1))
    r = fit(law, Points(x, _noisy(law, truth, x, 1e-4)))
    for k, v in truth.items():
        tol = 0.15 * abs(v) if k in ("alpha3", "beta3") else 0.03 * abs(v)
        assert r.params[k] == pytest.approx(v, abs=tol), (k, r.params)
    assert r.rms_ln < 3e-4


def test_generating_form_wins_on_loo():
    """000 Table 1's procedure: the form that generated the data has the lowest LOO RMS."""
    x = _grid_d1d2(5, 5, 1e8, 1e12)
    truth = {"A": 16.3, "alpha1": 0.043, "alpha2": 0.085, "alpha3": 2e-3, "E": 1.2}
    L = _noisy(get_law("upcycled_mul"), truth, x, 5e-4, seed=3)
    loo = {n: fit(n, Points(x, L), loo=True).loo["rms_ln"]
           for n in ("upcycled_mul", "upcycled_mul_noint", "upcycled_add", "upcycled_add_noint")}
    assert min(loo, key=loo.get) == "upcycled_mul", loo
    assert loo["upcycled_mul_noint"] > 2 * loo["upcycled_mul"], loo
    # and the additive data selects the additive form
    truth = {"A": 6.0, "alpha1": 0.09, "F": 12.0, "alpha2": 0.12, "alpha3": 1.5e-3, "E": 1.0}
    L = _noisy(get_law("upcycled_add"), truth, x, 5e-4, seed=4)
    loo = {n: fit(n, Points(x, L), loo=True).loo["rms_ln"]
           for n in ("upcycled_mul", "upcycled_add", "upcycled_add_noint")}
    assert min(loo, key=loo.get) == "upcycled_add", loo


def test_loo_rms_matches_a_manual_refit():
    x = _grid_d1d2(4, 4, 1e8, 1e11)
    law = get_law("upcycled_mul_noint")
    L = _noisy(law, {"A": 10.0, "alpha1": 0.05, "alpha2": 0.08, "E": 1.0}, x, 3e-3, seed=5)
    r = fit(law, Points(x, L), loo=True)
    errs = []
    for i in range(len(L)):
        keep = np.delete(np.arange(len(L)), i)
        ri = fit(law, Points({k: v[keep] for k, v in x.items()}, L[keep]))
        pred = law.predict(ri.params, {k: v[i:i + 1] for k, v in x.items()})[0]
        errs.append(math.log(pred) - math.log(L[i]))
    assert r.loo["rms_ln"] == pytest.approx(float(np.sqrt(np.mean(np.square(errs)))), rel=2e-3)
    assert r.loo["rms_ln"] > r.rms_ln  # held-out error exceeds in-sample error


def test_rescaling_D_shifts_exponents_and_keeps_predictions():
    """D' = D/s: the multiplicative law is the same function with α1, α2 shifted by −α3·ln s
    (the bilinear ln-term of 000 App. C), so the fit's predictions do not change."""
    law = get_law("upcycled_mul")
    x = _grid_d1d2(5, 5, 1e8, 1e12)
    truth = {"A": 16.3, "alpha1": 0.043, "alpha2": 0.085, "alpha3": 2e-3, "E": 1.2}
    L = _noisy(law, truth, x, 3e-4, seed=7)
    s = 1e9
    xs = {k: v / s for k, v in x.items()}
    r1 = fit(law, Points(x, L), fixed={"E": 1.2})
    r2 = fit(law, Points(xs, L), fixed={"E": 1.2})
    c = math.log(s)
    a3 = r1.params["alpha3"]
    assert r2.params["alpha3"] == pytest.approx(a3, rel=1e-3)
    assert r2.params["alpha1"] == pytest.approx(r1.params["alpha1"] - a3 * c, abs=2e-4)
    assert r2.params["alpha2"] == pytest.approx(r1.params["alpha2"] - a3 * c, abs=2e-4)
    np.testing.assert_allclose(law.predict(r2.params, xs), law.predict(r1.params, x), rtol=1e-5)
    # exactly, as a function: the shifted parameters give identical predictions
    p = dict(truth)
    q = dict(p, alpha1=p["alpha1"] - p["alpha3"] * c, alpha2=p["alpha2"] - p["alpha3"] * c,
             A=p["A"] * s ** (-p["alpha1"] - p["alpha2"]) * math.exp(p["alpha3"] * c * c))
    np.testing.assert_allclose(law.predict(q, xs), law.predict(p, x), rtol=1e-10)


def test_fixed_E_is_respected_and_helps():
    law = get_law("upcycled_mul")
    x = _grid_d1d2(5, 5, 1e9, 1e11)  # a narrow range: E is poorly identified on its own
    truth = {"A": 16.3, "alpha1": 0.043, "alpha2": 0.085, "alpha3": 7.98e-4, "E": 0.165}
    L = _noisy(law, truth, x, 2e-3, seed=11)
    r = fit(law, Points(x, L), fixed={"E": 0.165})
    assert r.params["E"] == 0.165 and r.fixed == {"E": 0.165}
    assert r.params["alpha2"] == pytest.approx(0.085, abs=0.01)


def test_shared_E_across_dense_and_moe_fits():
    """000 §5: E fitted jointly from dense and MoE Chinchilla fits, each keeping its A, B, α, β."""
    rng = np.random.default_rng(2)
    law = get_law("chinchilla")
    dense = dict(TABLE2["dense"], E=1.1)
    moe = dict(TABLE2["moe"], E=1.1)
    mk = lambda: {"N": np.exp(rng.uniform(math.log(1e7), math.log(1e10), 40)),  # noqa: E731
                  "D": np.exp(rng.uniform(math.log(1e8), math.log(1e13), 40))}
    xd, xm = mk(), mk()
    rd, rm = fit_shared([(law, Points(xd, _noisy(law, dense, xd, 1e-4, 1))),
                         (law, Points(xm, _noisy(law, moe, xm, 1e-4, 2)))], shared=["E"])
    assert rd.params["E"] == rm.params["E"]
    assert rd.params["E"] == pytest.approx(1.1, rel=0.05)
    assert rd.params["alpha"] == pytest.approx(0.088, rel=0.1)
    assert rm.params["alpha"] == pytest.approx(0.161, rel=0.1)


def test_bootstrap_interval_covers_truth_and_is_parallel_safe():
    law = get_law("upcycled_mul_noint")
    x = _grid_d1d2(5, 5, 1e8, 1e12)
    truth = {"A": 10.0, "alpha1": 0.05, "alpha2": 0.08, "E": 1.0}
    L = _noisy(law, truth, x, 2e-3, seed=9)
    r1 = fit(law, Points(x, L), bootstrap=24, n_jobs=1)
    r2 = fit(law, Points(x, L), bootstrap=24, n_jobs=2)
    np.testing.assert_allclose(r1.bootstrap, r2.bootstrap, rtol=1e-9)  # same resamples
    for k in ("alpha1", "alpha2"):
        lo, hi = r1.ci[k]
        assert lo < r1.params[k] < hi
        assert lo < truth[k] < hi, (k, lo, hi)
        assert hi - lo < 0.05
    # more noise, wider interval
    r3 = fit(law, Points(x, _noisy(law, truth, x, 2e-2, seed=9)), bootstrap=24, n_jobs=1)
    assert (r3.ci["alpha2"][1] - r3.ci["alpha2"][0]) > (r1.ci["alpha2"][1] - r1.ci["alpha2"][0])


def test_load_points_from_sweep_like_frame():
    import pandas as pd

    rows = []
    for t, (d1, d2) in enumerate([(1e8, 1e8), (1e8, 2e8), (2e8, 1e8), (2e8, 2e8), (4e8, 4e8)]):
        for step, frac in ((0, 0.0), (5, 0.5), (10, 1.0)):
            rows.append({"trial_id": f"t{t}", "status": "ok", "step": step, "D1": d1,
                         "D2": d2 * frac, "tokens": d2 * frac, "N_total": 8e6, "N2": 2e6,
                         "val_loss": 3.0 - frac, "kind": "upcycled"})
    rows.append({"trial_id": "bad", "status": "failed", "step": 10, "D1": 1e8, "D2": 1e8,
                 "tokens": 1e8, "val_loss": 9.0, "kind": "upcycled"})
    df = pd.DataFrame(rows)
    pts = load_points(df, "upcycled_mul")
    assert len(pts) == 5 and set(pts.L) == {2.0}
    assert sorted(pts.x["D2"]) == [1e8, 1e8, 2e8, 2e8, 4e8]
    curves = load_points(df, "upcycled_mul", curves=True)
    assert len(curves) == 10  # step 0 (D2 = 0) is dropped
    cfg = load_points(df, "model_config_add")
    assert set(cfg.x["P"]) == {4.0}
    with pytest.raises(FitError, match="--columns N1="):
        load_points(df, "joint_upcycled")


def test_parameters_on_a_bound_are_reported():
    law = get_law("upcycled_mul_noint")
    x = _grid_d1d2(4, 4, 1e8, 1e11)
    truth = {"A": 10.0, "alpha1": 0.05, "alpha2": 0.08, "E": 1e-6}  # E below its bound
    L = law.predict(truth, x)
    r = fit(law, Points(x, L))
    assert r.at_bounds == ["E"] and r.to_dict()["at_bounds"] == ["E"]
    assert fit(law, Points(x, L), fixed={"E": 1e-4}).at_bounds == []

"""Derived quantities against hand calculations from 000 Table 2's published parameters."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.derived import (
    compute_optimal,
    d_star,
    d_star_approx,
    expert_upcycling_cost,
    flops_6nd,
    gpu_hours,
    loss_moe_scratch,
    loss_upcycled,
    skywork_advice,
    upcycling_efficiency,
)
from moe_core.errors import FitError
from scaling.laws import TABLE2

MOE, UPC = TABLE2["moe"], TABLE2["upcycled"]


def test_losses_by_hand_at_4b_tokens():
    # hand: 32·(4e9)^−0.161 + 7.05·(1e9)^−0.080 + 0.165
    moe = 32.0 * 4e9 ** -0.161 + 7.05 * 1e9 ** -0.080 + 0.165
    assert loss_moe_scratch(MOE, np.array([4e9]), 1e9)[0] == pytest.approx(moe, rel=1e-12)
    assert moe == pytest.approx(2.419, abs=1e-3)
    ex = -0.085 + 7.98e-4 * math.log(4e9)
    upc = 16.3 * 4e9 ** -0.043 * 4e9 ** ex + 8.53 * 1e9 ** -0.112 + 0.165
    assert float(loss_upcycled(UPC, 4e9, 4e9, 1e9)) == pytest.approx(upc, rel=1e-12)


def test_d_star_solves_eq13_and_shrinks_with_model_size():
    ds = d_star(MOE, UPC, 1e9)
    # the two losses agree at D* (Eq. 13) ...
    assert loss_moe_scratch(MOE, np.array([ds]), 1e9)[0] == pytest.approx(
        float(loss_upcycled(UPC, ds, ds, 1e9)), abs=1e-9)
    # ... upcycling is ahead below it and behind above it
    assert loss_upcycled(UPC, ds / 2, ds / 2, 1e9) < loss_moe_scratch(MOE, np.array([ds / 2]), 1e9)
    assert loss_upcycled(UPC, ds * 2, ds * 2, 1e9) > loss_moe_scratch(MOE, np.array([ds * 2]), 1e9)
    # 000 §5.1: "D* equal to 4B tokens for an 8x1B model" (Table 2's rounded parameters give 3.0B)
    assert 2.5e9 < ds < 4.5e9
    # D* decreases with model size (000 Fig. 1 right)
    assert d_star(MOE, UPC, 7e9) < ds and d_star(MOE, UPC, 7e10) < d_star(MOE, UPC, 7e9)


def test_d_star_reports_no_crossover():
    # at 0.1B, Table 2's upcycled law stays ahead up to 1e17 tokens
    assert d_star(MOE, UPC, 1e8) == math.inf
    worse = dict(UPC, B=100.0)
    assert d_star(MOE, worse, 1e9) == 0.0


def test_sign_changes_finds_every_crossing_both_ways():
    from scaling.crossing import sign_changes

    # gap < 0 below 1e6 (scratch ahead), > 0 until 1e9, < 0 again after: − → + then + → −
    def gap(lnd):
        return -(lnd - math.log(1e6)) * (lnd - math.log(1e9))

    r = sign_changes(gap, 1e3, 1e12)
    assert [c.to for c in r.crossings] == ["upcycled", "scratch"]
    assert r.crossings[0].D == pytest.approx(1e6, rel=1e-9)
    assert r.crossings[1].D == pytest.approx(1e9, rel=1e-9)
    assert r.value == pytest.approx(1e9, rel=1e-9) and r.winner_everywhere is None
    # only − → + (the old code raised IndexError here): no D*, the crossing is reported
    only_up = sign_changes(lambda lnd: lnd - math.log(1e6), 1e3, 1e12)
    assert only_up.value is None and [c.to for c in only_up.crossings] == ["upcycled"]
    assert d_star(MOE, dict(UPC, B=8.53 * 1.0), 1e9) > 0  # Table 2 itself unaffected
    flat = sign_changes(lambda lnd: 1.0, 1e3, 1e12)
    assert flat.crossings == () and flat.winner_everywhere == "upcycled"


def test_d_star_approximation_eq2_by_hand():
    assert d_star_approx(1e9) == pytest.approx(4e9)
    r = 7.0
    assert d_star_approx(7e9) == pytest.approx(4e9 * r ** (-0.7 + 0.04 * math.log(r)))


def test_compute_optimal_llama2_exponent():
    """000 §5.2: for D1 = 2T tokens (Llama 2), D2_opt ∝ N1^1.8."""
    c = compute_optimal(UPC, 2e12, 1e22)
    alpha_eff = 0.085 - 7.98e-4 * math.log(2e12)
    assert c.alpha_eff == pytest.approx(alpha_eff)
    assert c.exponent_D2_N1 == pytest.approx(0.112 / alpha_eff)
    assert round(c.exponent_D2_N1, 1) == 1.8
    assert c.a + c.b == pytest.approx(1.0)
    # consistency: the optimum spends the budget, 6·1.75·N1·D2 = C2
    assert 10.5 * c.N1_opt * c.D2_opt == pytest.approx(1e22, rel=1e-9)


def test_compute_optimal_is_the_minimum_along_the_budget():
    D1, C2 = 1e11, 1e21
    c = compute_optimal(UPC, D1, C2)
    d2 = c.D2_opt * np.exp(np.linspace(-1, 1, 201))
    n1 = C2 / (10.5 * d2)
    L = loss_upcycled(UPC, D1, d2, n1)
    assert abs(int(np.argmin(L)) - 100) <= 1


def test_compute_optimal_refuses_a_nonpositive_alpha_eff():
    with pytest.raises(FitError, match="α_eff"):
        compute_optimal(UPC, 1e60, 1e21)


def test_efficiency_eq4_by_hand():
    # 003 §5.2: Fixed-32 1.339, Upcycled 1.305, Fixed-64 1.308 → η = 0.034/0.031 ≈ 109.7 %
    assert upcycling_efficiency(1.339, 1.305, 1.308) == pytest.approx(0.034 / 0.031)
    assert upcycling_efficiency(2.0, 2.0, 1.5) == 0.0
    assert upcycling_efficiency(2.0, 1.5, 1.5) == 1.0
    with pytest.raises(FitError):
        upcycling_efficiency(1.0, 1.0, 1.0)


def test_eta_interval_by_resampling_runs():
    from analysis.derived import eta_interval

    # one run per group: no spread, the interval is η itself (0.5 by hand)
    lo, hi = eta_interval([2.0], [1.9], [1.8])
    assert lo == pytest.approx(0.5) and hi == pytest.approx(0.5)
    # noisy seeds: the interval holds the point estimate and widens with the spread
    rng = np.random.default_rng(0)
    e, m = 2.0 + rng.normal(0, 0.01, 4), 1.8 + rng.normal(0, 0.01, 4)
    lo, hi = eta_interval(e, [1.9], m)
    point = upcycling_efficiency(e.mean(), 1.9, m.mean())
    assert lo < point < hi and hi - lo > 0.01
    lo2, hi2 = eta_interval(2.0 + (e - 2.0) * 4, [1.9], 1.8 + (m - 1.8) * 4)
    assert hi2 - lo2 > 2 * (hi - lo)
    with pytest.raises(FitError):
        eta_interval([], [1.9], [1.8])


def test_gpu_hour_cost_model_eq1_eq2():
    # 003 Fig. 1: 2.2 s vs 4.2 s per step; τ = 2/3·T saves τ·(s_mE − s_E)
    c = expert_upcycling_cost(T=30_000, tau=20_000, s_E=2.2, s_mE=4.2, gpus=8)
    assert c.from_scratch == pytest.approx(30_000 * 4.2 * 8 / 3600)
    assert c.upcycled == pytest.approx((20_000 * 2.2 + 10_000 * 4.2) * 8 / 3600)
    assert c.saving == pytest.approx(20_000 * 2.0 * 8 / 3600)
    assert c.saving_frac == pytest.approx(20_000 * 2.0 / (30_000 * 4.2))
    assert round(c.saving_frac, 2) == 0.32  # 003 §3.1: τ ≈ ⅔·T saves ~32 % of GPU hours
    with pytest.raises(FitError):
        expert_upcycling_cost(T=10, tau=11, s_E=1, s_mE=2)


def test_flops_and_gpu_hours():
    assert flops_6nd(1e9, 2e10) == 1.2e20
    assert gpu_hours(400e12 * 3600) == pytest.approx(1.0)


def test_skywork_rules():
    assert skywork_advice(1.0, 10.0).verdict == "upcycle"
    assert skywork_advice(2.0, 1.0).verdict == "from_scratch"
    assert skywork_advice(1.0, 0.0).verdict == "from_scratch"
    b = skywork_advice(2 / 3, 1.0)
    assert b.verdict == "borderline" and b.ratio == pytest.approx(2 / 3)


def test_derived_cli(tmp_path, capsys):
    import json

    from analysis.cli import derived_main as main

    assert main(["dstar", "--n1", "1e9"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["d_star"] == pytest.approx(d_star(MOE, UPC, 1e9)) and out["d_star_eq2"] == 4e9
    assert main(["optimal", "--d1", "2e12", "--c2", "1e22"]) == 0
    assert round(json.loads(capsys.readouterr().out)["exponent_D2_N1"], 1) == 1.8
    assert main(["advice", "--c-moe", "3", "--c-dense", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "from_scratch"
    # a fit's JSON replaces Table 2
    f = tmp_path / "fit.json"
    f.write_text(json.dumps({"law": "joint_upcycled", "params": dict(UPC, B=100.0)}))
    assert main(["dstar", "--n1", "1e9", "--upcycled", str(f)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["d_star"] is None and out["winner_everywhere"] == "scratch"
    # no crossing up to 1e17 at 0.1B: an answer (upcycling wins everywhere), not Infinity
    assert main(["dstar", "--n1", "1e8"]) == 0
    text = capsys.readouterr().out
    assert "Infinity" not in text and json.loads(text)["winner_everywhere"] == "upcycled"
    assert main(["cost", "--T", "10", "--tau", "11", "--s-e", "1", "--s-me", "2"]) == 2

"""Issue #30: the calibrated widening (``law.widen``, :func:`scaling.interval.widen`) applied by
the searcher and said in its lines; and the proposals' value of a trial under noise that fades
along D2 (``law.length``), by hand on two and three branches of one stable run."""

from __future__ import annotations

import math

import numpy as np
import pytest

from moe_core.errors import FitError, SearchSpaceError
from scaling.bootstrap import NoiseComponents
from scaling.interval import widen
from sweeps.law.config import parse_law_block
from sweeps.law.design import Candidate, LawDesign, run_design
from sweeps.law.report import describe_outcome, describe_refit, outcome
from sweeps.testing.simulate import SimulatedStudy


def test_widen_by_hand():
    # ln end ↦ ln v + F·(ln end − ln v): 1 → 2·(1/2)^2 = 0.5, 4 → 2·2^2 = 8
    assert widen(2.0, 1.0, 4.0, 2.0) == pytest.approx((0.5, 8.0))
    lo, hi = widen(1e10, 5e9, 3e10, 1.15)
    assert math.log(lo) == pytest.approx(math.log(1e10) + 1.15 * math.log(0.5))
    assert math.log(hi) == pytest.approx(math.log(1e10) + 1.15 * math.log(3.0))
    # unbounded / non-positive ends and a missing estimate stay; factor 1 is the identity
    assert widen(2.0, 0.0, None, 3.0) == (0.0, None)
    assert widen(2.0, 1.0, math.inf, 1.5) == (pytest.approx(2 * 0.5 ** 1.5), math.inf)
    assert widen(None, 1.0, 4.0, 2.0) == (1.0, 4.0)
    assert widen(2.0, 1.0, 4.0, 1.0) == (1.0, 4.0)
    with pytest.raises(FitError, match=">= 1"):
        widen(2.0, 1.0, 4.0, 0.9)


@pytest.mark.parametrize("v", [0.5, 0, -1])
def test_law_widen_below_one_is_refused_naming_the_key(v):
    with pytest.raises(SearchSpaceError, match=r"law\.widen=.* must be >= 1 \(a calibrated "
                                               r"widening of the target's interval\)"):
        parse_law_block({"target": "alpha3", "widen": v})


def test_law_widen_defaults_to_the_calibrated_factor_and_a_number_wins():
    # #38: auto is the committed studies' factor for the noise model (docs/intervals.md)
    auto = parse_law_block({"target": "alpha3"})
    assert auto.widen == "auto" and auto.widen_factor == 1.55  # groups: equicorrelated
    assert auto.widen_source.startswith("auto: calibrated for equicorrelated noise")
    fading = parse_law_block({"target": "alpha3", "length": 2.73})
    assert fading.widen_factor == 1.35 and "fading" in fading.widen_source
    assert parse_law_block({"target": "alpha3", "noise": "trials"}).widen_factor == 1.0
    given = parse_law_block({"target": "alpha3", "widen": 1.15, "length": 2.73})
    assert given.widen == 1.15 and given.widen_factor == 1.15 and given.widen_source == "given"
    assert parse_law_block({"target": "alpha3", "widen": "1.15"}).widen_factor == 1.15
    with pytest.raises(SearchSpaceError, match=r"law\.widen='wide': use auto"):
        parse_law_block({"target": "alpha3", "widen": "wide"})


GRID = np.geomspace(0.5e9, 8e9, 5)


def _cands() -> list[Candidate]:
    return [Candidate({"D1": d1, "D2": d2}, {"parent.tokens": d1, "tokens": d2},
                      6 * 1.75e9 * d2, f"p{d1:.0f}", 6e9 * d1, f"b{d1:.0f}",
                      0.9 * 6 * 1.75e9 * d2) for d1 in GRID for d2 in GRID]


def _run(widen_f: float):
    study = SimulatedStudy(sigma=0.003, seed=3)
    cfg = parse_law_block({"law": "eq8", "fix": {"E": study.upcycled["E"]},
                           "scratch": study.scratch, "ci_width": None, "max_trials": 8,
                           "bootstrap": 15, "icc": 0.5, "widen": widen_f})
    d = LawDesign(cfg, _cands(), seed=3)
    run_design(d, study.loss_of, parallel=25)
    return cfg, d


def test_the_searcher_widens_its_interval_and_says_so():
    """The same study with law.widen 1 and 1.5: the same fit and resamples, the interval's
    ends 1.5× as far from D̂* in ln D*, its relative width from the widened ends, and the
    progress and closing lines say "widened ×1.5" (and not when F = 1)."""
    cfg1, d1 = _run(1.0)
    cfg2, d2 = _run(1.5)
    e1, e2 = d1.estimate, d2.estimate
    assert e2.value == pytest.approx(e1.value)
    assert (e2.lo, e2.hi) == pytest.approx(widen(e1.value, e1.lo, e1.hi, 1.5))
    assert e2.rel_width == pytest.approx((e2.hi - e2.lo) / e2.value)
    assert d2.history[-1]["widen"] == 1.5 and d1.history[-1]["widen"] == 1.0
    assert "widened ×1.5" in describe_refit(cfg2, d2.history[-1], 0)
    assert "widened" not in describe_refit(cfg1, d1.history[-1], 0)
    out = outcome(cfg2, {"design": d2.state()}, 25)
    assert out["widen"] == 1.5 and out["estimate"]["ci"] == e2.to_dict()["ci"]
    assert "widened ×1.5" in describe_outcome(cfg2, out)


# ---- fading noise in the proposals ------------------------------------------------------


def _branches(length: float | None, d2=(1.0, 2.0, 4.0)) -> LawDesign:
    """Branches of one stable run at D2 = 1, 2, 4 (0, 1, 2 octaves)."""
    study = SimulatedStudy(sigma=0.002, seed=0)
    cands = [Candidate({"D1": 2.0, "D2": x}, {"i": j}, 55.0, branch="g", stable_flops=45.0)
             for j, x in enumerate(d2)]
    raw = {"law": "eq8", "fix": {"E": study.upcycled["E"]}, "scratch": study.scratch,
           "target": "alpha3", "ci_width": 0.5}
    if length is not None:
        raw["length"] = length
    return LawDesign(parse_law_block(raw), cands)


def _prior(n: int) -> np.ndarray:
    """Cov(T, ŷ_i) = 1, Var ŷ_i = 1, predictions independent, Var T = 1 + n."""
    C = np.eye(1 + n)
    C[0, 1:] = C[1:, 0] = 1.0
    C[0, 0] = 1.0 + n
    return C


def _by_hand(first: int, then: int, length: float, s2: float, tau2: float,
             t=(0.0, 1.0, 2.0)) -> tuple[float, float]:
    """Var T's reduction by observing ``first``, then ``then``, with y_i = ŷ_i + u_i + e_i,
    Cov(u_i, u_j) = τ²·exp(−(t_i − t_j)²/2ℓ²): Cov(T, y_i) = 1, Var y_i = 1 + τ² + s²,
    Cov(y_i, y_j) = τ²·k_ij; after y_first: Cov(T, y_then) = 1 − Cov(y_then, y_first)/Var y,
    Var(y_then | y_first) = Var y − Cov²/Var y."""
    v = 1 + tau2 + s2
    k = tau2 * math.exp(-(t[first] - t[then]) ** 2 / (2 * length ** 2))
    g1 = 1 / v
    c = 1 - k / v
    return g1, c * c / (v - k * k / v)


@pytest.mark.parametrize("length", [0.7, 2.73])
def test_fading_value_of_a_trial_matches_the_formula(length):
    d = _branches(length)
    d._noise = NoiseComponents(0.5, 1.0, 1, None, length)
    C = d._augmented(_prior(3))
    for first, then in ((0, 1), (0, 2), (1, 2)):
        g1, g2 = _by_hand(first, then, length, 0.5, 1.0)
        assert d._gain(C, first) == pytest.approx(g1)
        assert d._gain(d._condition(C, first), then) == pytest.approx(g2)
    # a second branch near the first is worth less than one far away
    near = d._gain(d._condition(C, 0), 1)
    far = d._gain(d._condition(C, 0), 2)
    assert near < far


def test_fading_limits_are_the_equicorrelated_and_the_independent_case():
    C0 = _prior(3)
    equi = _branches(None)
    equi._noise = NoiseComponents(0.5, 1.0, 1)
    Ce = equi._augmented(C0)
    long_ = _branches(1e6)
    long_._noise = NoiseComponents(0.5, 1.0, 1, None, 1e6)
    Cl = long_._augmented(C0)
    short = _branches(1e-3)
    short._noise = NoiseComponents(0.5, 1.0, 1, None, 1e-3)
    Cs = short._augmented(C0)
    indep = _branches(None)
    indep._noise = NoiseComponents(1.5, 0.0, 0)  # the shared part as each trial's own
    Ci = indep._augmented(C0)
    for a, b in ((0, 1), (0, 2), (2, 1)):
        assert long_._gain(long_._condition(Cl, a), b) == pytest.approx(
            equi._gain(equi._condition(Ce, a), b))
        assert short._gain(short._condition(Cs, a), b) == pytest.approx(
            indep._gain(indep._condition(Ci, a), b))
    # equicorrelated by hand (k = τ² = 1): the second branch's gain (1 − 1/2.5)² / (2.5 − 1/2.5)
    assert equi._gain(equi._condition(Ce, 0), 2) == pytest.approx(0.36 / 2.1)


def test_law_reports_say_where_the_factor_comes_from():
    from sweeps.law.report import _estimate_text
    cfg = parse_law_block({"target": "alpha3", "length": 2.73})
    e = {"value": 0.05, "ci": [0.04, 0.06], "rel_width": 0.4, "widen": cfg.widen_factor,
         "widen_source": cfg.widen_source}
    assert "(widened ×1.35 in ln alpha3: law.widen auto: calibrated for fading noise)" in \
        _estimate_text(cfg, e).replace("α3", "alpha3")
    e1 = {**e, "widen": 1.0, "widen_source": parse_law_block(
        {"target": "alpha3", "noise": "trials"}).widen_source}
    assert "(not widened: law.widen auto: calibrated for independent noise)" in \
        _estimate_text(cfg, e1)

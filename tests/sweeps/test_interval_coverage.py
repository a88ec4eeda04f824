"""Honest intervals (issue #30): at a reduced study count, the full grid's 90 % D* interval
under the noise measured on this project's runs (a parent's effect fading along D2, findings
§10), bootstrapped with that structure (``law.length``), is not below nominal by more than the
sampling error; and the calibrated widening of studies/law_search.py by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.studies.test_studies import _load

ROOT = Path(__file__).resolve().parents[2]


def _study():
    return _load("law_search")


def test_widening_by_hand():
    ls = _study()
    assert ls.widened(2.0, [1.0, 4.0], 2.0) == pytest.approx([0.5, 8.0])  # ln-space ×2
    assert ls.widened(2.0, [1.0, None], 1.5) == [pytest.approx(2 * 0.5 ** 1.5), None]
    rows = [{"grid": [1.0, 3.0], "grid_value": 2.0, "true": t} for t in (2.5, 3.5, 1.2, 2.0)]
    # 3 of 4 inside as given; 3.5 needs hi ≥ 3.5: 2·1.5^c ≥ 3.5 ⇔ c ≥ ln 1.75 / ln 1.5 = 1.38
    cal = ls.calibrate(rows, None, level=0.9, searcher=False)
    assert cal["factor"] == 1.4 and cal["grid_coverage"] == 1.0
    assert math.log(1.75) / math.log(1.5) == pytest.approx(1.38, abs=0.01)


@pytest.mark.slow
def test_grid_coverage_under_fading_noise_is_nominal_within_sampling_error():
    """10 simulated studies (σ 0.00095 own, 0.00285 shared, fading over 2.73 octaves; the
    bootstrap given icc 0.9 and length 2.73; 30 resamples, to keep the suite's time): binomial
    se at 0.9 is 0.095, so at least 8 of 10 must hold the truth (0.9 − 2 se = 0.71). By trial
    the same grid held it in 0.60 of 20 (docs/intervals.md)."""
    ls = _study()
    args = ls._parser().parse_args([
        "--grid-only", "--sigma", "0.00095", "--sigma-group", "0.00285", "--group-length",
        "2.73", "--icc", "0.9", "--length", "2.73", "--bootstrap", "30"])
    rows = [ls.study(s, args) for s in range(500, 510)]
    hits = sum(r["grid_covers"] for r in rows)
    se = math.sqrt(0.9 * 0.1 / len(rows))
    assert hits / len(rows) >= 0.9 - 2 * se, hits


@pytest.mark.parametrize("raw, msg", [
    ({"target": "alpha3", "length": 0}, "law.length=0 must be > 0"),
    ({"target": "alpha3", "length": 2.0, "noise": "trials"}, "with noise: groups"),
    ({"target": "alpha3", "length": "far"}, "law.length"),
])
def test_law_length_errors_name_the_key(raw, msg):
    from moe_core.errors import SearchSpaceError
    from sweeps.law.config import parse_law_block

    with pytest.raises(SearchSpaceError, match=msg):
        parse_law_block(raw)


def test_law_length_reaches_the_bootstrap():
    from sweeps.law.config import parse_law_block

    assert parse_law_block({"target": "alpha3", "length": 2.73, "icc": 0.9}).length == 2.73
    assert parse_law_block({"target": "alpha3"}).length is None


def _replicated_grid(k: int):
    """A simulated ``scaling_d1_d2`` × 3 seeds with the noise measured on this project's runs
    (own 0.00095, a parent's 0.00285 fading over 2.73 octaves of D2; findings §10), each seed's
    parent per D1 its own group, and six from-scratch runs (independent noise 0.001). The
    from-scratch law shares the upcycled law's E (``analysis.decide`` fits E shared, 000 §5) and
    its A puts the true D* at 2e9 tokens, inside the grid (by hand: L_scratch(2e9) =
    L_upcycled(2e9, 2e9))."""
    import numpy as np
    import pandas as pd

    from sweeps.testing.simulate import SimulatedStudy

    grid, rows = np.geomspace(0.5e9, 8e9, 5), []
    for s in range(3):
        st = SimulatedStudy(N1=1e9, sigma=0.00095, sigma_group=0.00285, group_length=2.73,
                            seed=1000 * k + s)
        for i, d1 in enumerate(grid):
            for d2 in grid:
                rows.append({"trial_id": f"u{s}_{i}_{d2:.0f}", "kind": "upcycled", "seed": s,
                             "parent_key": f"p{i}_s{s}", "upcycle.method": "dense_to_moe",
                             "N1": 1e9, "N2": 1.75e9, "D1": d1, "D2": d2, "tokens": d2,
                             "val_loss": st.loss({"D1": d1, "D2": d2}, group=f"p{i}")})
    st = SimulatedStudy(N1=1e9)
    sc = dict(st.scratch, E=st.upcycled["E"])
    sc["A"] = (st.true_loss({"D1": 2e9, "D2": 2e9}) - sc["E"]) * 2e9 ** sc["alpha"]
    rng = np.random.default_rng(k)
    for d in np.geomspace(0.5e9, 16e9, 6):
        rows.append({"trial_id": f"s{d:.0f}", "kind": "moe", "seed": 0, "parent_key": "",
                     "N1": 1e9, "N2": 1.75e9, "D1": 0, "D2": d, "tokens": d,
                     "val_loss": (sc["A"] * d ** -sc["alpha"] + sc["E"]) *
                     math.exp(0.001 * rng.standard_normal())})
    return pd.DataFrame(rows), st.upcycled, sc


@pytest.mark.slow
def test_decide_dstar_interval_under_fading_noise_is_nominal_within_sampling_error():
    """``analysis.decide --noise fading --icc 0.9 --length 2.73`` on 16 simulated replicated
    grids (60 resamples each; data sets 100–115, not the 40 the factor was calibrated on): its
    90 % D* interval, widened by the calibrated ×1.3 (``--widen 1.3``), holds the true D* (2e9 by
    construction, checked through decide's own D* of the true laws) in at least 0.9 − 2 se of
    them (se = √(0.9·0.1/16) = 0.075: 12 of 16). Unwidened, the interval held the truth in only
    0.80 ± 0.06 of data sets 0–39, below nominal (docs/intervals.md). That figure is why the
    factor exists, so this test checks the widened interval, out of sample."""
    from analysis.decide import _dstar, decide, load_decision_data

    hits, raw = [], []
    for k in range(100, 116):
        df, upc, sc = _replicated_grid(k)
        data = load_decision_data(df)
        true = _dstar(data, upc, sc, 1e9).value
        assert true == pytest.approx(2e9, rel=1e-3)
        r = decide(data, bootstrap=60, noise="fading", icc=0.9, length=2.73, seed=k, widen=1.3)
        for out, (lo, hi) in ((hits, r.d_star["ci"]), (raw, r.d_star["ci_unwidened"])):
            out.append(lo is not None and lo <= true <= (math.inf if hi is None else hi))
    se = math.sqrt(0.9 * 0.1 / len(hits))
    assert sum(hits) / len(hits) >= 0.9 - 2 * se, (hits, raw)
    assert sum(hits) >= sum(raw)  # widening only adds cover

"""Bootstrap by trial, not by row: on curves (every eval a row) a trial's evals share its noise,
so resampling rows treats correlated points as independent and gives intervals that are too
narrow. Simulated curves with a known truth show it (deterministic seeds)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.data import bootstrap_units, load_points
from scaling.bootstrap import group_noise_bootstrap, noise_components
from scaling.fit import fit
from scaling.laws import Points, get_law

TRUTH = {"A": 16.3, "alpha1": 0.043, "alpha2": 0.085, "E": 0.9}
LAW = "upcycled_mul_noint"


def _curves(seed: int, trials: int = 12, evals: int = 8) -> Points:
    """``trials`` trials at D1 on a log grid, each a curve of ``evals`` evals in D2; each trial's
    curve is offset by its own noise (sd 0.02 in ln L) plus small per-eval noise (0.001)."""
    rng = np.random.default_rng(seed)
    d1 = np.repeat(np.geomspace(0.5e9, 8e9, trials), evals)
    d2 = np.tile(np.geomspace(0.25e9, 4e9, evals), trials)
    ln_true = np.log(TRUTH["A"] * d1 ** -TRUTH["alpha1"] * d2 ** -TRUTH["alpha2"] + TRUTH["E"])
    offset = np.repeat(rng.normal(0, 0.02, trials), evals)
    L = np.exp(ln_true + offset + rng.normal(0, 0.001, trials * evals))
    labels = tuple(f"t{i}" for i in np.repeat(np.arange(trials), evals))
    return Points({"D1": d1, "D2": d2}, L, labels)


def _interval(pts: Points, by_row: bool, seed: int) -> tuple[float, float]:
    if by_row:  # the old scheme: every row its own unit
        pts = Points(pts.x, pts.L, pts.labels, tuple(str(i) for i in range(len(pts))))
    r = fit(LAW, pts, fixed={"E": TRUTH["E"]}, bootstrap=60, ci_level=0.9, seed=seed, n_jobs=1)
    return r.ci["alpha1"]


@pytest.mark.slow
def test_row_resampling_gives_too_narrow_intervals_on_curves():
    cover = {True: 0, False: 0}
    widths = {True: [], False: []}
    for s in range(8):
        pts = _curves(s)
        for by_row in (True, False):
            lo, hi = _interval(pts, by_row, s)
            widths[by_row].append(hi - lo)
            cover[by_row] += lo <= TRUTH["alpha1"] <= hi
    # by trial: about 3× wider (√8 evals per trial), and it holds the truth far more often
    assert np.median(np.array(widths[False]) / np.array(widths[True])) > 2.0
    assert cover[False] >= 6 and cover[True] <= cover[False] - 3, cover


def test_units_are_trials_or_shared_parents():
    df = pd.DataFrame({"trial_id": ["a", "a", "b", "c"], "parent_key": ["p", "p", "p", ""]})
    assert bootstrap_units(df) == ("trial:a", "trial:a", "trial:b", "trial:c")  # 1 parent
    many = pd.DataFrame({"trial_id": [f"t{i}" for i in range(24)],
                         "parent_key": [f"p{i // 2}" for i in range(24)]})
    assert bootstrap_units(many)[:3] == ("parent:p0", "parent:p0", "parent:p1")
    pts = Points({"D": np.ones(4)}, np.ones(4), ("a", "a", "b", "c"))
    assert [u.tolist() for u in pts.units()] == [[0, 1], [2], [3]]


def test_load_points_in_curves_mode_keeps_a_trial_together():
    rows = [{"trial_id": f"t{t}", "status": "ok", "step": k, "D1": 1e9 * (t + 1),
             "D2": 1e8 * (k + 1), "val_loss": 2.0 - 0.01 * k - 0.1 * t} for t in range(3)
            for k in range(4)]
    pts = load_points(pd.DataFrame(rows), LAW, curves=True)
    assert len(pts) == 12 and len(pts.units()) == 3


# ---- trials that share a WSD stable run share its noise -------------------------------------


def _branches(seed: int, groups: int = 5, per: int = 5, sg: float = 0.02, se: float = 0.003):
    """A D1 × D2 grid: each D1 one stable run (a group) whose ``per`` branches share its noise
    (sd ``sg`` in ln L) besides their own (``se``)."""
    rng = np.random.default_rng(seed)
    d1 = np.repeat(np.geomspace(0.5e9, 8e9, groups), per)
    d2 = np.tile(np.geomspace(0.5e9, 8e9, per), groups)
    ln_true = np.log(TRUTH["A"] * d1 ** -TRUTH["alpha1"] * d2 ** -TRUTH["alpha2"] + TRUTH["E"])
    L = np.exp(ln_true + np.repeat(rng.normal(0, sg, groups), per) + rng.normal(0, se, len(d1)))
    groups_ = tuple(f"g{i}" for i in np.repeat(np.arange(groups), per))
    return Points({"D1": d1, "D2": d2}, L, tuple(f"t{i}" for i in range(len(d1)))), groups_


def test_noise_components_by_hand_without_groups():
    """No group has two trials: the shared part is 0 and the own variance is RSS / (n − p)
    (tr M = n − p for the linearised fit)."""
    pts, _ = _branches(3, sg=0.0, se=0.01)
    r = fit(LAW, pts, fixed={"E": TRUTH["E"]})
    comp = noise_components(get_law(LAW), pts, r, [None] * len(pts))
    assert comp.shared == 0 and comp.groups == 0
    assert comp.own == pytest.approx(float(r.residuals @ r.residuals) / (len(pts) - 3), rel=1e-6)
    given = noise_components(get_law(LAW), pts, r, [None] * len(pts), icc=0.0)
    assert given.own == pytest.approx(comp.own, rel=1e-6) and given.icc_given == 0.0


def test_noise_components_recover_the_split():
    """Many stable runs (40 groups of 5): the moment estimates find τ and s."""
    pts, groups = _branches(5, groups=40, sg=0.02, se=0.005)
    r = fit(LAW, pts, fixed={"E": TRUTH["E"]})
    comp = noise_components(get_law(LAW), pts, r, groups)
    assert math.sqrt(comp.shared) == pytest.approx(0.02, rel=0.3)
    assert math.sqrt(comp.own) == pytest.approx(0.005, rel=0.3)
    assert comp.groups == 40


@pytest.mark.slow
def test_trial_resampling_is_too_narrow_when_branches_share_a_stable_run():
    """With most of the noise shared by a stable run's branches, the bootstrap by trial holds
    the true α1 far less often than the parametric bootstrap that keeps the groups."""
    cover = {"trials": 0, "groups": 0}
    widths = {"trials": [], "groups": []}
    for s in range(8):
        pts, groups = _branches(100 + s)
        r = fit(LAW, pts, fixed={"E": TRUTH["E"]}, bootstrap=60, ci_level=0.9, seed=s, n_jobs=1)
        boot, comp = group_noise_bootstrap(LAW, pts, r, groups, 60, seed=s)
        intervals = {"trials": r.ci["alpha1"],
                     "groups": tuple(np.percentile(boot[:, 1][np.isfinite(boot[:, 1])],
                                                   [5, 95]))}
        for k, (lo, hi) in intervals.items():
            widths[k].append(hi - lo)
            cover[k] += lo <= TRUTH["alpha1"] <= hi
    assert np.median(np.array(widths["groups"]) / np.array(widths["trials"])) > 1.5
    assert cover["groups"] >= 6 and cover["trials"] <= 5 and \
        cover["groups"] >= cover["trials"] + 2, cover  # measured: 7 of 8 vs 4 of 8

"""Post-decay prediction (scaling.predict) on synthetic WSD curves with a known decay gain."""

import math

import numpy as np
import pytest

from moe_core.schedules import ScheduleConfig, lr_schedule
from scaling.predict import (
    Calibration,
    Curve,
    calibrate,
    decay_drop,
    fit_branch_gain,
    fit_ratio,
    loss_drop,
    lr_area,
    predict_final,
)

L0, A, ALPHA = 1.5, 0.8, 0.4
B, C, BETA, GAMMA = 300.0, 2.0, 0.6, 0.5
EVERY = 20


def _lrs(peak: float, total: int, decay_frac: float = 0.1) -> tuple[float, ...]:
    return lr_schedule(peak, ScheduleConfig(kind="wsd", warmup_steps=5, total_steps=total,
                                            decay_frac=decay_frac, min_ratio=0.1))


def _mpl_curve(peak: float, total: int) -> Curve:
    """A WSD run whose loss is exactly the multi-power law (Luo et al. 2025, Eq. 7)."""
    lrs = _lrs(peak, total)
    steps = sorted(set(range(0, total + 1, EVERY)) | {total})
    S = lr_area(lrs, np.array(steps))
    losses = [L0 + A * max(s, 1e-9) ** (-ALPHA) - loss_drop(lrs, t, B, C, BETA, GAMMA)
              for s, t in zip(S, steps)]
    start = ScheduleConfig(kind="wsd", total_steps=total, decay_frac=0.1).decay_start
    return Curve(tuple(steps), tuple(losses), lrs, start)


def test_lr_area_and_loss_drop_by_hand():
    lrs = (1.0, 1.0, 0.5, 0.25)
    assert list(lr_area(lrs, np.array([0, 1, 4]))) == [0.0, 1.0, 2.75]
    # t = 4: k = 1 (drop 0), k = 2 (drop 0.5, S_2 = 0.75), k = 3 (drop 0.25, S_3 = 0.25)
    g = lambda x: 1 - (2.0 * x + 1) ** -0.5  # noqa: E731
    want = 10 * (0.5 * g(0.5 ** -1.0 * 0.75) + 0.25 * g(0.25 ** -1.0 * 0.25))
    assert loss_drop(lrs, 4, 10, 2.0, 0.5, 1.0) == pytest.approx(want, rel=1e-12)
    assert loss_drop((1.0, 1.0, 1.0), 3, 10, 2.0, 0.5, 1.0) == 0.0  # constant LR: no drop
    assert decay_drop(lrs, 2) == 0.75


def test_multi_power_recovers_a_known_decay_gain():
    cal = calibrate([_mpl_curve(p, T) for p, T in [(1e-3, 200), (3e-3, 200), (2e-3, 400),
                                                     (1e-3, 400), (3e-3, 300)]])
    assert cal.alpha == pytest.approx(ALPHA, abs=0.03)
    held = _mpl_curve(2e-3, 300)
    true_final = held.final_loss
    true_gain = loss_drop(held.lrs, 300, B, C, BETA, GAMMA)
    assert true_gain > 0.05  # the decay matters on this curve
    for s in (100, 160, 260):  # stable-phase evals only
        seen = held.upto(s)
        assert seen.final_loss is None
        pred = predict_final(seen, cal, "multi_power")
        assert abs(pred - true_final) < 0.1 * true_gain, (s, pred, true_final)
        # the raw loss, and the stable extrapolation without the gain, are far off
        assert abs(seen.losses[-1] - true_final) > 0.5 * true_gain
    assert predict_final(held, cal, "multi_power") == true_final  # finished: its own loss


def _gain_curve(peak: float, total: int, k: float) -> Curve:
    """Stable phase L0 + A·S1^(−α); the decay gains exactly k·Δη (Δη = 0.9·peak)."""
    lrs = _lrs(peak, total)
    start = ScheduleConfig(kind="wsd", total_steps=total, decay_frac=0.1).decay_start
    steps = [s for s in range(EVERY, start + 1, EVERY)]
    S = lr_area(lrs, np.array(steps + [start]))
    stable = [L0 + A * s ** (-ALPHA) for s in S]
    return Curve(tuple(steps) + (total,), tuple(stable[:-1]) + (stable[-1] - k * 0.9 * peak,),
                 lrs, start)


def test_branch_gain_is_fitted_from_branches_and_predicts():
    k = 40.0
    curves = [_gain_curve(p, T, k) for p, T in [(1e-3, 200), (2e-3, 200), (4e-3, 300)]]
    cal0 = Calibration(alpha=ALPHA, A=A)
    logk, p, q = fit_branch_gain(curves, cal0)
    assert (math.exp(logk), p, q) == pytest.approx((k, 1.0, 0.0), rel=1e-6, abs=1e-9)
    cal = calibrate(curves)
    held = _gain_curve(3e-3, 250, k)
    for s in (60, 140, 200):
        pred = predict_final(held.upto(s), cal, "branch_gain")
        assert pred == pytest.approx(held.final_loss, abs=2e-3), s


def test_ratio_is_calibrated_on_finished_curves():
    # L_T / L_s = 0.9·(s/T)^0.1 exactly
    curves = []
    for T in (100, 200):
        steps = list(range(20, T, 20))
        fin = 2.0
        losses = [fin / (0.9 * (s / T) ** 0.1) for s in steps]
        lrs = _lrs(1e-3, T, decay_frac=0.0)
        curves.append(Curve(tuple(steps) + (T,), tuple(losses) + (fin,), lrs, T))
    a, b, fmin = fit_ratio(curves)
    assert (a, b) == pytest.approx((math.log(0.9), 0.1), abs=1e-9)
    assert fmin == pytest.approx(0.1)
    cal = Calibration(alpha=0.5, A=1.0, ratio=(a, b, fmin))
    c = curves[1]
    assert predict_final(c.upto(60), cal, "ratio") == pytest.approx(2.0, rel=1e-9)
    with pytest.raises(ValueError, match="unknown prediction method"):
        predict_final(c.upto(60), cal, "magic")

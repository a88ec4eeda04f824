"""Post-decay loss prediction for runs still in their WSD stable phase (pure numpy / scipy).

A WSD run (000 §3.1) sits on a plateau until its last ``decay_frac`` of steps, then its loss drops
by the *decay gain*. Comparing trials by their pre-decay loss favours low learning rates: a high
LR looks worse on the plateau and gains more in the decay. Three predictors of the loss a run
will reach at its last step ``T`` after its decay, from the evals it has reported so far:

- ``branch_gain``: a stable-phase power law in the LR area, extrapolated to the decay start,
  minus the decay gain measured on WSD branches, ``g = k·Δη^p·D^q`` (Δη the LR drop of the
  decay, D the tokens at its end), fitted on (stable loss at the decay start, post-decay loss)
  pairs;
- ``multi_power``: the multi-power law of Luo et al. 2025 (Eq. 7), a schedule-aware law of the
  whole curve, ``L(t) = L0 + A·S1(t)^(−α) − LD(t)`` with the loss drop
  ``LD(t) = B Σ_k (η_{k−1} − η_k)·G(η_k^(−γ) S_k(t))``, ``G(x) = 1 − (Cx + 1)^(−β)``;
- ``ratio``: a calibrated ratio ``L_T / L_s = exp(a + b·log(s/T))``.

The shared parameters (α, the gain or decay law, the ratio) are fitted once on finished curves
(``calibrate``); each run's own ``L0, A`` are refitted on its stable evals at every prediction
(linear least squares). Curves are :class:`Curve` objects: the evals so far plus the run's full
per-step LR schedule (``moe_core.schedules.lr_schedule``, which the caller supplies).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

METHODS = ("branch_gain", "multi_power", "ratio")
_ALPHAS = np.linspace(0.01, 2.0, 200)


@dataclass(frozen=True, slots=True)
class Curve:
    """One run's evals (``steps``, ``losses``: optimizer steps and validation losses) and its
    LR schedule ``lrs`` (``lrs[i]`` = LR of 0-based step ``i``, length ``T`` = its last step);
    ``decay_start`` = the first step of its decay (``T`` when it never decays)."""

    steps: tuple[int, ...]
    losses: tuple[float, ...]
    lrs: tuple[float, ...]
    decay_start: int
    tokens_per_step: int = 1

    @property
    def total(self) -> int:
        return len(self.lrs)

    def upto(self, step: int) -> Curve:
        """The curve as it was when the eval at ``step`` was reported."""
        keep = [i for i, s in enumerate(self.steps) if s <= step]
        return Curve(tuple(self.steps[i] for i in keep), tuple(self.losses[i] for i in keep),
                     self.lrs, self.decay_start, self.tokens_per_step)

    def stable_points(self) -> tuple[np.ndarray, np.ndarray]:
        """Evals in the stable phase after step 0 (step 0 of an upcycled run is the cold start,
        not a point of the power law), as (steps, losses)."""
        idx = [i for i, s in enumerate(self.steps)
               if 0 < s <= self.decay_start and math.isfinite(self.losses[i])]
        return (np.array([self.steps[i] for i in idx], float),
                np.array([self.losses[i] for i in idx], float))

    @property
    def final_loss(self) -> float | None:
        """The loss at the run's last step (None while it has not reached it)."""
        for s, v in zip(self.steps, self.losses):
            if s == self.total:
                return v
        return None


def lr_area(lrs: Sequence[float], steps: np.ndarray) -> np.ndarray:
    """S1(t) = Σ_{τ<t} η_τ, the LR area after t steps (Luo et al. 2025, Eq. 7)."""
    cum = np.concatenate([[0.0], np.cumsum(np.asarray(lrs, float))])
    return cum[np.asarray(steps, int)]


def loss_drop(lrs: Sequence[float], t: int, B: float, C: float, beta: float,
              gamma: float) -> float:
    """LD(t) = B Σ_{k=1}^{t−1} (η_{k−1} − η_k)·G(η_k^(−γ) S_k(t)), S_k(t) = Σ_{τ=k}^{t−1} η_τ,
    G(x) = 1 − (Cx + 1)^(−β) (Luo et al. 2025, Eq. 7; 0-based steps). The law's sum starts
    after the warmup: LR rises (η_{k−1} < η_k) count as zero. Zero for a run whose LR never
    fell."""
    eta = np.asarray(lrs[:t], float)
    if t < 2:
        return 0.0
    drops = np.maximum(eta[:-1] - eta[1:], 0.0)  # η_{k−1} − η_k for k = 1 .. t−1
    if not (drops > 0).any():
        return 0.0
    tail = np.cumsum(eta[::-1])[::-1]  # tail[k] = Σ_{τ=k}^{t−1} η_τ
    x = eta[1:] ** (-gamma) * tail[1:]
    return float(B * np.sum(drops * (1.0 - (C * x + 1.0) ** (-beta))))


def decay_drop(lrs: Sequence[float], decay_start: int) -> float:
    """Δη: the LR fallen over the decay (peak at its start minus the LR of the last step)."""
    if decay_start >= len(lrs) or decay_start < 1:
        return 0.0
    return float(lrs[decay_start - 1] - lrs[-1])


@dataclass(frozen=True, slots=True)
class Calibration:
    """Shared parameters of the three predictors, fitted by :func:`calibrate`."""

    alpha: float
    """Power of the stable-phase law L0 + A·S1^(−α)."""
    A: float
    """Median per-curve A (used when a run has a single stable eval)."""
    gain: tuple[float, float, float] = (0.0, 1.0, 0.0)
    """branch_gain: (log k, p, q) of g = k·Δη^p·D^q."""
    mpl: tuple[float, float, float, float] = (0.0, 1.0, 0.5, 0.5)
    """multi_power: (B, C, β, γ)."""
    ratio: tuple[float, float, float] = (0.0, 0.0, 1.0)
    """ratio: (a, b, f_min) of log(L_T / L_s) = a + b·log(max(s/T, f_min)), f_min the smallest
    fraction of a run it was fitted at."""
    curves: int = 0
    """How many calibration curves it was fitted on."""
    notes: tuple[str, ...] = field(default=())


# ---- the stable phase ----------------------------------------------------------------------


def _fit_l0_a(S: np.ndarray, L: np.ndarray, alpha: float,
              A_default: float | None) -> tuple[float, float]:
    """Per-run (L0, A) of L = L0 + A·S^(−α) by linear least squares (A ≥ 0); with one point
    (or a negative A) A is the calibration's and only L0 is fitted."""
    x = S ** (-alpha)
    if len(L) >= 2 and np.ptp(x) > 0:
        A, L0 = np.polyfit(x, L, 1)
        if A >= 0:
            return float(L0), float(A)
    A = A_default if A_default is not None else 0.0
    return float(np.mean(L - A * x)), float(A)


def fit_alpha(curves: Sequence[Curve]) -> tuple[float, float]:
    """Shared α (grid search) with per-curve (L0, A) on every curve's stable evals; returns
    (α, median A). Curves with fewer than 3 stable evals do not inform α."""
    usable = [(lr_area(c.lrs, s), loss) for c in curves for s, loss in [c.stable_points()]
              if len(loss) >= 3]
    if not usable:
        raise ValueError("no calibration curve has 3 stable-phase evals after step 0")
    best = (math.inf, 0.5, 0.0)
    for a in _ALPHAS:
        sse, As = 0.0, []
        for S, L in usable:
            L0, A = _fit_l0_a(S, L, a, None)
            sse += float(np.sum((L0 + A * S ** (-a) - L) ** 2))
            As.append(A)
        if sse < best[0]:
            best = (sse, float(a), float(np.median(As)))
    return best[1], best[2]


def stable_loss(curve: Curve, cal: Calibration, step: int) -> float:
    """The run's stable-phase loss extrapolated to ``step`` (LR area of its schedule)."""
    S, L = curve.stable_points()
    if len(L) == 0:
        return float(curve.losses[-1])
    L0, A = _fit_l0_a(lr_area(curve.lrs, S), L, cal.alpha, cal.A)
    return float(L0 + A * lr_area(curve.lrs, np.array([step]))[0] ** (-cal.alpha))


# ---- the three predictors ------------------------------------------------------------------


def branch_gain(cal: Calibration, d_eta: float, tokens: float) -> float:
    """g = k·Δη^p·D^q: the decay gain measured on WSD branches (0 without a decay)."""
    if d_eta <= 0:
        return 0.0
    logk, p, q = cal.gain
    return float(math.exp(logk + p * math.log(d_eta) + q * math.log(max(tokens, 1.0))))


def predict_final(curve: Curve, cal: Calibration, method: str) -> float:
    """The loss ``curve`` will reach at its last step after its decay, from its evals so far.
    A run that has reached its last step predicts its own final loss."""
    final = curve.final_loss
    if final is not None:
        return float(final)
    T = curve.total
    if method == "ratio":
        a, b, fmin = cal.ratio
        f = max(curve.steps[-1] / T, fmin)
        return float(curve.losses[-1] * math.exp(a + b * math.log(f)))
    if method == "branch_gain":
        base = stable_loss(curve, cal, curve.decay_start)
        return base - branch_gain(cal, decay_drop(curve.lrs, curve.decay_start),
                                  T * curve.tokens_per_step)
    if method == "multi_power":
        B, C, beta, gamma = cal.mpl
        return stable_loss(curve, cal, T) - loss_drop(curve.lrs, T, B, C, beta, gamma)
    raise ValueError(f"unknown prediction method {method!r}; use one of {', '.join(METHODS)}")


# ---- calibration on finished curves ----------------------------------------------------------


def _decayed(curves: Sequence[Curve]) -> list[Curve]:
    return [c for c in curves if c.final_loss is not None and c.decay_start < c.total]


def fit_branch_gain(curves: Sequence[Curve], cal: Calibration) -> tuple[float, float, float]:
    """(log k, p, q) of g = k·Δη^p·D^q from decayed curves: g = extrapolated stable loss at the
    decay start minus the post-decay loss. p (q) is fixed at 1 (0) when the calibration has a
    single Δη (a single D)."""
    rows = []
    for c in _decayed(curves):
        if len(c.stable_points()[1]) == 0:
            continue
        g = stable_loss(c, cal, c.decay_start) - c.final_loss
        if g > 0:
            rows.append((math.log(decay_drop(c.lrs, c.decay_start)),
                         math.log(c.total * c.tokens_per_step), math.log(g)))
    if not rows:
        return (-math.inf, 1.0, 0.0)
    X = np.array(rows)
    free_p, free_q = np.ptp(X[:, 0]) > 1e-9, np.ptp(X[:, 1]) > 1e-9
    y = X[:, 2] - (0.0 if free_p else X[:, 0])
    cols = [np.ones(len(X))] + ([X[:, 0]] if free_p else []) + ([X[:, 1]] if free_q else [])
    coef = np.linalg.lstsq(np.stack(cols, 1), y, rcond=None)[0]
    logk, i = float(coef[0]), 1
    p = float(coef[i]) if free_p else 1.0
    i += free_p
    q = float(coef[i]) if free_q else 0.0
    return (logk, p, q)


def fit_multi_power(curves: Sequence[Curve], cal: Calibration
                    ) -> tuple[float, float, float, float]:
    """(B, C, β, γ) of the multi-power law's loss drop (Luo et al. 2025, Eq. 7), fitted on the
    decay-phase evals of decayed curves against each curve's own stable extrapolation."""
    pts = []
    for c in _decayed(curves):
        if len(c.stable_points()[1]) == 0:
            continue
        for s, v in zip(c.steps, c.losses):
            if s > c.decay_start:
                pts.append((c, s, stable_loss(c, cal, s) - v))
    if not pts:
        return (0.0, 1.0, 0.5, 0.5)

    def resid(theta: np.ndarray) -> np.ndarray:
        B, C, beta, gamma = np.exp(theta)
        return np.array([loss_drop(c.lrs, s, B, C, beta, gamma) - d for c, s, d in pts])

    eta = float(np.median([c.lrs[c.decay_start - 1] for c, _, _ in pts]))
    x0 = np.log([1.0 / eta, 1.0, 0.5, 0.5])
    from scipy.optimize import least_squares  # noqa: PLC0415 (0.7 s: not for a spec check)

    sol = least_squares(resid, x0, bounds=(np.log([1e-6, 1e-4, 0.05, 0.05]),
                                           np.log([1e9, 1e4, 5.0, 1.5])))
    return tuple(float(v) for v in np.exp(sol.x))


def fit_ratio(curves: Sequence[Curve]) -> tuple[float, float, float]:
    """(a, b, f_min) of log(L_T / L_s) = a + b·log(s/T) over every stable eval (s > 0) of
    finished curves."""
    rows = []
    for c in curves:
        final = c.final_loss
        if final is None:
            continue
        for s, v in zip(c.steps, c.losses):
            if 0 < s <= c.decay_start and s < c.total:
                rows.append((math.log(s / c.total), math.log(final / v)))
    if not rows:
        return (0.0, 0.0, 1.0)
    X = np.array(rows)
    fmin = float(np.exp(X[:, 0].min()))
    if np.ptp(X[:, 0]) < 1e-9:
        return (float(X[:, 1].mean()), 0.0, fmin)
    b, a = np.polyfit(X[:, 0], X[:, 1], 1)
    return (float(a), float(b), fmin)


def calibrate(curves: Sequence[Curve]) -> Calibration:
    """Fit every predictor's shared parameters on finished curves (see the module doc)."""
    curves = list(curves)
    alpha, A = fit_alpha(curves)
    cal = Calibration(alpha=alpha, A=A, curves=len(curves))
    gain = fit_branch_gain(curves, cal)
    mpl = fit_multi_power(curves, cal)
    return Calibration(alpha=alpha, A=A, gain=gain, mpl=mpl, ratio=fit_ratio(curves),
                       curves=len(curves))

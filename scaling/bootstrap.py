"""Bootstraps that keep the noise structure of a sweep's trials, and the shared fit's bootstrap
by trial (split from :mod:`scaling.fit`, whose fits they refit).

- :func:`group_noise_bootstrap` / :func:`group_noise_bootstrap_shared`: parametric resamples
  ln L* = ln L̂ + u + e with u shared by a group's trials (a parent, or a WSD stable run),
  equicorrelated or fading along D2 (:func:`kernel_matrix`), its variance components from the
  fit's residuals (:func:`noise_components`; docs/intervals.md);
- :func:`bootstrap_shared`: :func:`scaling.fit.fit_shared` refitted on resamples of trials.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from moe_core.errors import FitError
from scaling.fit import (
    _H,
    DEFAULT_DELTA,
    FitResult,
    _Block,
    _free_params,
    _make_block,
    _predict_log,
    _run,
    fit_shared,
    resample_units,
)
from scaling.laws import Law, Points, get_law


@dataclass(frozen=True)
class NoiseComponents:
    """ln L = law + u_group + e: the variance of the part a group's trials share (``shared``,
    τ²) and of each trial's own (``own``, s²), estimated from a fit's residuals."""

    own: float
    shared: float
    groups: int
    """Groups with two or more trials (the ones that inform ``shared``)."""
    icc_given: float | None = None
    length: float | None = None
    """Octaves (of D2) over which the shared part fades, correlation exp(−d²/2ℓ²) between two
    trials of a group d octaves apart (:func:`kernel_matrix`); None: the same for the whole
    group (equicorrelated)."""

    @property
    def total(self) -> float:
        return self.own + self.shared

    @property
    def icc(self) -> float:
        return self.shared / self.total if self.total > 0 else 0.0


def _jacobian_log(block: _Block, v: np.ndarray) -> np.ndarray:
    """∂ ln L̂_i / ∂θ_j of a block's points at the fit-space parameters ``v`` (central
    differences) → [n, P]; the columns of parameters the block does not use are 0."""
    J = np.empty((len(block.pts), len(v)))
    for j in range(len(v)):
        e = np.zeros(len(v))
        e[j] = _H
        J[:, j] = (_predict_log(block, v + e) - _predict_log(block, v - e)) / (2 * _H)
    return J


def group_matrix(groups: Sequence[str | None]) -> np.ndarray:
    """K[i, j] = 1 where trials i and j share a group (a trial without one: only itself)."""
    g = [f"\0{i}" if k is None else str(k) for i, k in enumerate(groups)]
    return np.array([[a == b for b in g] for a in g], dtype=float)


def kernel_matrix(groups: Sequence[str | None], t: np.ndarray | None = None,
                  length: float | None = None) -> np.ndarray:
    """K[i, j] = exp(−(t_i − t_j)²/2ℓ²) where trials i and j share a group, else 0 (t: each
    trial's position in octaves, log2 D2; the squared-exponential kernel ``sweeps.testing.simulate``
    draws a group's fading effect from). ``length`` None or inf: :func:`group_matrix`."""
    K = group_matrix(groups)
    if length is None or math.isinf(length):
        return K
    if not length > 0:
        raise FitError(f"noise length {length} must be > 0 octaves (or inf: equicorrelated)")
    t = np.asarray(t, dtype=float)
    return K * np.exp(-(t[:, None] - t[None, :]) ** 2 / (2.0 * length ** 2))


def log2_axis(pts: Points, axis: str | None = None) -> np.ndarray | None:
    """The positions a fading group effect moves along: log2 of ``axis`` (default D2, else D,
    the budget a branch of a stable run decays at); None when the points have neither."""
    for a in ([axis] if axis else ["D2", "D"]):
        if a in pts.x:
            return np.log2(np.asarray(pts.x[a], dtype=float))
    return None


def noise_components(law: Law, pts: Points, result: FitResult, groups: Sequence[str | None],
                     icc: float | None = None, length: float | None = None
                     ) -> NoiseComponents:
    """Method-of-moments variance components of a fit's residuals r under Σ = s²·I + τ²·K
    (K: :func:`group_matrix`), with the fit linearised (M = I − H, H the hat matrix of
    ∂ ln L̂/∂θ): E[rᵀr] = s²·tr M + τ²·tr(MKM) and E[rᵀ(K − I)r] = s²·tr((K − I)M) +
    τ²·tr((K − I)MKM). Solved for (s², τ²), each kept ≥ 0. With ``icc`` given (e.g. measured
    by ``python -m analysis.noise`` on a replicated sweep), only the total is estimated:
    σ² = rᵀr / tr(M((1 − icc)·I + icc·K)M). With ``length`` ℓ the shared part fades along D2:
    K is :func:`kernel_matrix` (exp(−d²/2ℓ²) within a group, d in octaves of D2), the same
    equations; ℓ = inf is the equicorrelated K, τ² = 0 independent trials."""
    J = _jacobian_log(_make_block(law, pts, result.fixed)[0],
                      np.asarray(result.theta, dtype=float))
    K = kernel_matrix(groups, log2_axis(pts), length)
    return _components(np.asarray(result.residuals, dtype=float), J, groups, icc, K, length)


def _components(r: np.ndarray, J: np.ndarray, groups: Sequence[str | None],
                icc: float | None, K: np.ndarray | None = None,
                length: float | None = None) -> NoiseComponents:
    """:func:`noise_components` from residuals ``r`` and the Jacobian ``J`` of ln L̂ (``K``:
    the shared part's correlation, default :func:`group_matrix`)."""
    n = len(r)
    H = J @ np.linalg.pinv(J)
    M = np.eye(n) - H
    K = group_matrix(groups) if K is None else K
    multi = len({k for k in groups if k is not None and list(groups).count(k) > 1})
    rr = float(r @ r)
    if icc is not None:
        t = float(np.trace(M @ ((1 - icc) * np.eye(n) + icc * K) @ M))
        var = rr / max(t, 1e-12)
        return NoiseComponents((1 - icc) * var, icc * var, multi, icc, length)
    KI = K - np.eye(n)
    w = float(r @ KI @ r)
    A = np.array([[np.trace(M), np.trace(M @ K @ M)],
                  [np.trace(KI @ M), np.trace(KI @ M @ K @ M)]])
    own, shared = rr / max(np.trace(M), 1e-12), 0.0
    if multi and abs(np.linalg.det(A)) > 1e-12:
        a, b = np.linalg.solve(A, [rr, w])
        if b > 0 and a >= 0:
            own, shared = float(a), float(b)
        elif b > 0:  # all shared
            own, shared = 0.0, rr / max(float(np.trace(M @ K @ M)), 1e-12)
    return NoiseComponents(own, shared, multi, None, length)


def group_noise_bootstrap(law: Law | str, pts: Points, result: FitResult,
                          groups: Sequence[str | None], n_boot: int, *, seed: int = 0,
                          icc: float | None = None, delta: float = DEFAULT_DELTA,
                          length: float | None = None) -> tuple[np.ndarray, NoiseComponents]:
    """Natural free parameters refitted on ``n_boot`` parametric resamples that keep the noise
    structure: ln L* = ln L̂ + u_g + e, u_g ~ N(0, τ²) shared by the trials of a group (the
    WSD stable run or parent they branch from), e ~ N(0, s²) (:func:`noise_components`).

    A bootstrap by trial treats the trials of one stable run as independent evidence. Measured
    on this project's own runs they are not (``analysis.noise``: ICC 0.69 on the D1 × D2 grid),
    and on simulated studies with that structure the law searcher's 90 % D* intervals then held
    the truth in 25 % of studies (studies/law_search.py --sigma-group).

    With ``length`` ℓ (octaves of D2) the group's part fades along D2 as measured on them
    (findings §10): u ~ N(0, τ²·K_ℓ) within a group, K_ℓ = :func:`kernel_matrix`, so
    branches far apart share less than branches close together."""
    law = get_law(law) if isinstance(law, str) else law
    comp = noise_components(law, pts, result, groups, icc, length)
    root = _kernel_root(groups, log2_axis(pts), length)
    block, bounds, _ = _make_block(law, pts, result.fixed)
    v0 = np.asarray(result.theta, dtype=float)
    pred = _predict_log(block, v0)
    free = _free_params(law, result.fixed)
    out = np.full((n_boot, len(v0)), np.nan)
    for b in range(n_boot):
        y = _resample_log(pred, comp, groups, np.random.default_rng(seed * 1_000_003 + b + 1),
                          root)
        bb, _, _ = _make_block(law, Points(pts.x, np.exp(y)), result.fixed)
        try:
            v, _, _ = _run([bb], bounds, v0[None, :], delta)
        except FitError:
            continue
        out[b] = [p.to_natural(v[bb.index[p.key]]) for p in free]
    return out, comp


def _kernel_root(groups: Sequence[str | None], t: np.ndarray | None,
                 length: float | None) -> np.ndarray | None:
    """R with R·Rᵀ = K_ℓ (:func:`kernel_matrix`, by its eigendecomposition: K_ℓ is only
    positive semi-definite when branches sit close); None for the equicorrelated K."""
    if length is None or math.isinf(length):
        return None
    if t is None:
        raise FitError("a noise length needs a budget axis (D2, or D) to fade along")
    lam, V = np.linalg.eigh(kernel_matrix(groups, t, length))
    return V * np.sqrt(np.clip(lam, 0.0, None))


def _resample_log(pred: np.ndarray, comp: NoiseComponents, groups: Sequence[str | None],
                  rng: np.random.Generator, root: np.ndarray | None = None) -> np.ndarray:
    """ln L̂ + u + e: one parametric resample with the groups' shared noise (u_g one number
    per group, or with ``root`` (:func:`_kernel_root`) u = τ·R·z, fading along D2)."""
    if root is not None:
        return pred + math.sqrt(comp.shared) * (root @ rng.standard_normal(root.shape[1])) + \
            math.sqrt(comp.own) * rng.standard_normal(len(pred))
    keys = [f"\0{i}" if k is None else str(k) for i, k in enumerate(groups)]
    gi = np.unique(keys, return_inverse=True)[1]
    return pred + math.sqrt(comp.shared) * rng.standard_normal(gi.max() + 1)[gi] + \
        math.sqrt(comp.own) * rng.standard_normal(len(pred))


def group_noise_bootstrap_shared(items: Sequence[tuple[Law | str, Points]], n_boot: int, *,
                                 warm: Sequence[FitResult],
                                 groups: Sequence[Sequence[str | None]],
                                 shared: Sequence[str] = ("E",),
                                 fixed: Mapping[str, float] | None = None,
                                 icc: float | None = None, delta: float = DEFAULT_DELTA,
                                 seed: int = 0, length: float | None = None
                                 ) -> tuple[list[list[dict[str, float]]], list[NoiseComponents]]:
    """:func:`bootstrap_shared` with :func:`group_noise_bootstrap`'s parametric resamples: each
    data set's noise components come from its own residuals under the joint fit ``warm`` (its
    Jacobian in the joint parameters), and each resample draws every data set's noise with its
    groups (``groups[k]``: each point's group in data set k, None alone). ``length``: the
    groups' part fades along each data set's budget axis (D2, or D for from-scratch branches),
    as in :func:`group_noise_bootstrap`."""
    fixed = dict(fixed or {})
    laws = [(get_law(lw) if isinstance(lw, str) else lw, pts) for lw, pts in items]
    shared_index = {s_: i for i, s_ in enumerate(shared)}
    blocks, offset = [], len(shared)
    for law, pts in laws:
        b, _, offset = _make_block(law, pts, fixed, offset, shared_index)
        blocks.append(b)
    v = np.asarray(warm[0].theta, dtype=float)
    preds, comps, roots = [], [], []
    for b, (_, pts), g in zip(blocks, laws, groups):
        pred = _predict_log(b, v)
        J = _jacobian_log(b, v)
        J = J[:, np.any(J != 0, axis=0)]  # this data set's parameters (and the shared ones)
        preds.append(pred)
        t = log2_axis(pts)
        ell = length if t is not None else None
        comps.append(_components(pred - np.log(pts.L), J, g, icc, kernel_matrix(g, t, ell),
                                 ell))
        roots.append(_kernel_root(g, t, ell))
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_boot):
        resampled = [(law, Points(pts.x, np.exp(_resample_log(p, c, g, rng, root))))
                     for (law, pts), p, c, g, root in zip(laws, preds, comps, groups, roots)]
        try:
            fits = fit_shared(resampled, shared=shared, fixed=fixed, delta=delta, start=v)
        except FitError:
            continue
        out.append([f.params for f in fits])
    return out, comps


def bootstrap_shared(items: Sequence[tuple[Law | str, Points]], n_boot: int, *,
                     warm: Sequence[FitResult], shared: Sequence[str] = ("E",),
                     fixed: Mapping[str, float] | None = None, delta: float = DEFAULT_DELTA,
                     seed: int = 0) -> list[list[dict[str, float]]]:
    """Refit :func:`fit_shared` on ``n_boot`` resamples, each data set's units (trials,
    parents) drawn on their own, warm-started from the full fit ``warm``; returns per resample
    the natural parameters of each law (resamples whose fit failed are left out)."""
    fixed = dict(fixed or {})
    laws = [(get_law(lw) if isinstance(lw, str) else lw, pts) for lw, pts in items]
    units = [pts.units() for _, pts in laws]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_boot):
        resampled = [(law, pts.take(resample_units(u, rng))) for (law, pts), u in
                     zip(laws, units)]
        try:
            fits = fit_shared(resampled, shared=shared, fixed=fixed, delta=delta,
                              start=warm[0].theta)
        except FitError:
            continue
        out.append([f.params for f in fits])
    return out

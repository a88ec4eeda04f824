"""Fit the seeds' scaling laws: Huber loss on ln L via LogSumExp, L-BFGS from a grid (000 §4.1, §5).

- objective: Σ_i Huber_δ(LSE_k t_k(x_i; θ) − ln L_i) with δ = 1e-3 (000 §4.1), minimised with
  scipy's L-BFGS-B (bounds keep exponents ≥ 0) from every point of an initialisation grid; the
  best optimum wins (Hoffmann et al.'s procedure, as 000 uses it);
- parameters can be fixed (``fixed={"E": 0.165}``) or shared across several laws fitted together
  (:func:`fit_shared`, 000 §5: E from a joint dense + MoE fit, then fixed for the upcycled law);
- leave-one-out RMS in nats and in ln-loss (000 Table 1's metric), residuals, and bootstrap
  percentile intervals on every parameter (resampled by trial, or by parent where trials share
  one — never by row; parallel over cores); for shared fits, and the parametric bootstraps
  that keep the noise groups, see :mod:`scaling.bootstrap`.

The pure fitting math lives here, below ``sweeps`` (whose law-driven searcher refits after
every batch); ``analysis.fit`` re-exports it with the command line.

Points come from :func:`analysis.data.load_points`. CLI (:mod:`analysis.cli`, run by
``analysis/fit/__main__``):
``python -m analysis.fit DATA --law NAME [--fix E=0.165] [--loo] [--bootstrap N] [--json]``.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import minimize
from threadpoolctl import ThreadpoolController

from moe_core.errors import FitError
from scaling.laws import Law, Points, get_law

DEFAULT_DELTA = 1e-3


@functools.cache
def _threadpools() -> ThreadpoolController:
    """The BLAS/OpenMP pools loaded (numpy's and scipy's, imported above), found once: a
    ``threadpool_limits()`` per fit scans every loaded library again (~10 % of a refit)."""
    return ThreadpoolController()


def _one_thread():
    """One BLAS thread inside: tiny problems, where threads only contend."""
    return _threadpools().limit(limits=1)


# ---- the objective --------------------------------------------------------------------------


@dataclass
class _Block:
    """One law on one data set inside a (possibly shared) fit; ``index`` maps its fit-space keys
    to positions in the global parameter vector (or to a fixed value)."""

    law: Law
    pts: Points
    index: dict[str, int]
    fixed: dict[str, float]


def _huber(r: np.ndarray, delta: float) -> tuple[float, np.ndarray]:
    """Σ Huber_δ(r)/δ and its derivative in r (dividing by δ only rescales: same argmin)."""
    a = np.abs(r)
    quad = a <= delta
    val = np.where(quad, 0.5 * r * r, delta * (a - 0.5 * delta)).sum() / delta
    return float(val), np.clip(r, -delta, delta) / delta


def _block_terms(b: _Block, theta: np.ndarray) -> np.ndarray:
    """Terms t_k for parameter vectors ``theta`` of shape [m, P] → array [m, K, n]."""
    m = theta.shape[0]
    p: dict[str, Any] = {k: np.full((m, 1), v) for k, v in b.fixed.items()}
    for k, j in b.index.items():
        p[k] = theta[:, j:j + 1]
    terms = b.law.log_terms(p, b.pts.x)
    out = np.empty((m, len(terms), len(b.pts)))
    for k, t in enumerate(terms):  # broadcast into place: the values np.stack gave, less overhead
        out[:, k, :] = t
    return out


def _lse(terms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """LogSumExp over the term axis (1) and the softmax weights."""
    mx = terms.max(axis=1, keepdims=True)
    e = np.exp(terms - mx)
    s = e.sum(axis=1, keepdims=True)
    return (mx + np.log(s))[:, 0, :], e / s


_H = 1e-6


def _objective(v: np.ndarray, blocks: list[_Block], ylog: list[np.ndarray],
               delta: float) -> tuple[float, np.ndarray]:
    """Objective and gradient. d t_k/dθ comes from central differences of the terms evaluated
    in one vectorised call (exact for the seeds' laws, which are linear in the fit-space θ)."""
    P = len(v)
    thetas = np.repeat(v[None, :], 2 * P + 1, axis=0)
    idx = np.arange(P)
    thetas[1 + idx, idx] += _H
    thetas[1 + P + idx, idx] -= _H
    total, grad = 0.0, np.zeros(P)
    for b, y in zip(blocks, ylog):
        T = _block_terms(b, thetas)                      # [2P+1, K, n]
        lse, w = _lse(T[:1])
        r = lse[0] - y
        val, dr = _huber(r, delta)
        total += val
        dT = (T[1:1 + P] - T[1 + P:]) / (2 * _H)         # [P, K, n]
        dlse = (w * dT).sum(axis=1)                      # [P, n]
        grad += (dlse * dr).sum(axis=1)  # not a BLAS gemv: no BLAS threads in workers
    return total, grad


def _predict_log(b: _Block, v: np.ndarray) -> np.ndarray:
    return _lse(_block_terms(b, v[None, :]))[0][0]


def _rms(pred_log: np.ndarray, L: np.ndarray) -> tuple[float, float]:
    """RMS error of ln-predictions against losses L: (in ln-loss, in nats)."""
    return (float(np.sqrt(np.mean((pred_log - np.log(L)) ** 2))),
            float(np.sqrt(np.mean((np.exp(pred_log) - L) ** 2))))


# ---- fit ------------------------------------------------------------------------------------


@dataclass
class FitResult:
    """A fitted law. ``params`` are natural (A, not ln A) and include fixed ones."""

    law: str
    params: dict[str, float]
    fixed: dict[str, float]
    n: int
    objective: float
    residuals: np.ndarray
    """ln L̂ − ln L at each point."""
    rms_ln: float
    rms_nats: float
    starts: int
    fit_s: float
    converged: bool
    theta: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    loo: dict[str, Any] | None = None
    ci: dict[str, tuple[float, float]] | None = None
    bootstrap: np.ndarray | None = field(repr=False, default=None)

    @property
    def at_bounds(self) -> list[str]:
        """Free parameters that ended on a bound: the data do not identify them (fix them)."""
        law = get_law(self.law)
        out = []
        for p in law.params:
            if p.name in self.fixed:
                continue
            v = p.to_fit(self.params[p.name])
            if any(b is not None and abs(v - b) < 1e-6 * max(1.0, abs(b)) for b in p.bounds):
                out.append(p.name)
        return out

    def to_dict(self) -> dict[str, Any]:
        law = get_law(self.law)
        out: dict[str, Any] = {
            "law": self.law, "equation": law.equation, "source": law.source,
            "variables": list(law.variables),
            "convention": "as in seed 000: D in tokens, N in parameters (raw counts), natural "
                          "logs; each exponent belongs to the variable it is written on",
            "n": self.n, "params": self.params, "fixed": self.fixed,
            "rms": {"nats": self.rms_nats, "ln": self.rms_ln}, "objective": self.objective,
            "starts": self.starts, "converged": self.converged, "fit_s": round(self.fit_s, 4),
            "loo_rms": None, "ci": None, "at_bounds": self.at_bounds,
        }
        if self.loo is not None:
            out["loo_rms"] = {"nats": self.loo["rms_nats"], "ln": self.loo["rms_ln"]}
            out["loo_residuals_ln"] = [float(r) for r in self.loo["residuals_ln"]]
        if self.ci is not None:
            out["ci"] = {k: [lo, hi] for k, (lo, hi) in self.ci.items()}
            out["bootstrap_n"] = int(len(self.bootstrap)) if self.bootstrap is not None else 0
        return out


def _free_params(law: Law, fixed: Mapping[str, float]) -> list:
    unknown = [k for k in fixed if k not in law.param_names]
    if unknown:
        raise FitError(f"--fix {unknown[0]}=…: law {law.name!r} has no parameter {unknown[0]!r}; "
                       f"it has {', '.join(law.param_names)}")
    return [p for p in law.params if p.name not in fixed]


def _grid(params: list, init_grid: Mapping[str, Sequence[float]] | None, max_starts: int,
          seed: int) -> np.ndarray:
    """Initial points (fit space). ``init_grid`` overrides a parameter's values, given as natural
    values (A = 10, not ln 10). Larger products are subsampled deterministically."""
    axes = []
    for p in params:
        if init_grid and p.name in init_grid:
            axes.append([p.to_fit(float(v)) for v in init_grid[p.name]])
        else:
            axes.append(list(p.init))
    total = math.prod(len(a) for a in axes)
    if total <= max_starts:
        return np.array(list(itertools.product(*axes)), dtype=np.float64).reshape(total, len(axes))
    rng = np.random.default_rng(seed)
    picks = rng.choice(total, size=max_starts, replace=False)
    pts = []
    for flat in sorted(picks):
        coords, rem = [], int(flat)
        for a in reversed(axes):
            coords.append(a[rem % len(a)])
            rem //= len(a)
        pts.append(coords[::-1])
    return np.array(pts, dtype=np.float64)


def _run(blocks: list[_Block], bounds: list, starts: np.ndarray, delta: float,
         refine: int | None = None) -> tuple[np.ndarray, float, bool]:
    """Best L-BFGS-B optimum over ``starts``; with ``refine``, only the ``refine`` grid points of
    lowest objective are optimised (the rest of the grid only ranks starting points)."""
    ylog = [np.log(b.pts.L) for b in blocks]
    if refine is not None and len(starts) > refine:
        lo = np.array([b[0] if b[0] is not None else -np.inf for b in bounds])
        hi = np.array([b[1] if b[1] is not None else np.inf for b in bounds])
        starts = np.clip(starts, lo, hi)
        with np.errstate(all="ignore"):
            f0 = np.array([_objective(s, blocks, ylog, delta)[0] for s in starts])
        f0 = np.where(np.isfinite(f0), f0, np.inf)
        starts = starts[np.argsort(f0, kind="stable")[:refine]]
    with _one_thread():  # tiny problems: BLAS threads only contend (40× slower on a busy machine)
        return _best_start(blocks, bounds, starts, delta, ylog)


def _best_start(blocks: list[_Block], bounds: list, starts: np.ndarray, delta: float,
                ylog: list[np.ndarray]) -> tuple[np.ndarray, float, bool]:
    best_v, best_f, ok = None, math.inf, False
    for s in starts:
        try:
            res = minimize(_objective, s, args=(blocks, ylog, delta), jac=True,
                           method="L-BFGS-B", bounds=bounds,
                           options={"maxiter": 3000, "ftol": 1e-13, "gtol": 1e-10})
        except (FloatingPointError, ValueError):
            continue
        if np.isfinite(res.fun) and res.fun < best_f:
            best_v, best_f, ok = res.x, float(res.fun), bool(res.success)
    if best_v is None:
        raise FitError("no initialisation converged to a finite objective; check the data "
                       "(positive L and variables) or pass another init grid")
    return best_v, best_f, ok


def _check_points(law: Law, pts: Points) -> None:
    missing = [v for v in law.variables if v not in pts.x]
    if missing:
        raise FitError(f"law {law.name!r} needs variables {missing}; the data has "
                       f"{sorted(pts.x)} (map columns with --columns {missing[0]}=<column>)")
    bad = ~np.isfinite(pts.L) | (pts.L <= 0)
    for v in law.variables:
        bad |= ~np.isfinite(pts.x[v]) | (pts.x[v] <= 0)
    if bad.any():
        raise FitError(f"{int(bad.sum())} points have non-positive or non-finite values; "
                       "drop them before fitting (load_points does)")


def _make_block(law: Law, pts: Points, fixed: Mapping[str, float], offset: int = 0,
                shared_index: Mapping[str, int] | None = None) -> tuple[_Block, list, int]:
    free = _free_params(law, fixed)
    index, bounds, j = {}, [], offset
    for p in free:
        if shared_index and p.name in shared_index:
            index[p.key] = shared_index[p.name]
            continue
        index[p.key] = j
        bounds.append(p.bounds)
        j += 1
    fx = {law.param(k).key: law.param(k).to_fit(float(v)) for k, v in fixed.items()}
    return _Block(law, pts, index, fx), bounds, j


def _natural(law: Law, v: np.ndarray, block: _Block, fixed: Mapping[str, float]) -> dict:
    out = {}
    for p in law.params:
        if p.name in fixed:
            out[p.name] = float(fixed[p.name])
        else:
            out[p.name] = p.to_natural(v[block.index[p.key]])
    return out


def fit(law: Law | str, pts: Points, *, fixed: Mapping[str, float] | None = None,
        delta: float = DEFAULT_DELTA, init_grid: Mapping[str, Sequence[float]] | None = None,
        max_starts: int = 128, refine: int | None = 8, seed: int = 0, loo: bool = False,
        bootstrap: int = 0,
        ci_level: float = 0.95, n_jobs: int | None = None) -> FitResult:
    """Fit ``law`` to ``pts``; optionally leave-one-out and bootstrap intervals."""
    law = get_law(law) if isinstance(law, str) else law
    fixed = dict(fixed or {})
    _check_points(law, pts)
    free = _free_params(law, fixed)
    if len(pts) < len(free) + 1:
        raise FitError(f"law {law.name!r} has {len(free)} free parameters but only {len(pts)} "
                       "points; add points or fix parameters (--fix E=...)")
    t0 = time.perf_counter()
    block, bounds, _ = _make_block(law, pts, fixed)
    starts = _grid(free, init_grid, max_starts, seed)
    v, f, ok = _run([block], bounds, starts, delta, refine)
    pred = _predict_log(block, v)
    rms_ln, rms_nats = _rms(pred, pts.L)
    result = FitResult(
        law=law.name, params=_natural(law, v, block, fixed), fixed=fixed, n=len(pts),
        objective=f, residuals=pred - np.log(pts.L), rms_ln=rms_ln, rms_nats=rms_nats,
        starts=len(starts), fit_s=0.0, converged=ok, theta=v,
    )
    if loo:
        result.loo = leave_one_out(law, pts, fixed=fixed, delta=delta, warm=v, bounds=bounds)
    if bootstrap:
        samples = bootstrap_params(law, pts, bootstrap, fixed=fixed, delta=delta, warm=v,
                                   bounds=bounds, seed=seed, n_jobs=n_jobs)
        result.bootstrap = samples
        lo_q, hi_q = 50 * (1 - ci_level), 50 * (1 + ci_level)
        names = [p.name for p in free]
        result.ci = {k: (float(result.params[k]), float(result.params[k])) for k in fixed}
        for i, k in enumerate(names):
            col = samples[:, i]
            col = col[np.isfinite(col)]
            result.ci[k] = (float(np.percentile(col, lo_q)), float(np.percentile(col, hi_q)))
    result.fit_s = time.perf_counter() - t0
    return result


def leave_one_out(law: Law, pts: Points, *, fixed: Mapping[str, float], delta: float,
                  warm: np.ndarray, bounds: list) -> dict[str, Any]:
    """Refit without each point (warm-started from the full fit) and predict it (000 Table 1)."""
    n = len(pts)
    pred = np.empty(n)
    for i in range(n):
        keep = np.delete(np.arange(n), i)
        block, _, _ = _make_block(law, pts.take(keep), fixed)
        v, _, _ = _run([block], bounds, warm[None, :], delta)
        one, _, _ = _make_block(law, pts.take(np.array([i])), fixed)
        pred[i] = _predict_log(one, v)[0]
    rms_ln, rms_nats = _rms(pred, pts.L)
    return {"rms_ln": rms_ln, "rms_nats": rms_nats, "residuals_ln": pred - np.log(pts.L),
            "predicted": np.exp(pred)}


def resample_units(units: Sequence[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """Row indices of one bootstrap resample: as many units (trials, or the trials of one
    parent) as there are, drawn with replacement, each with all its rows. Resampling rows
    instead treats a trial's correlated evals as independent points and gives intervals that
    are too narrow (tests/analysis/test_bootstrap.py)."""
    pick = rng.integers(0, len(units), len(units))
    return np.concatenate([units[i] for i in pick])


def _boot_chunk(args) -> np.ndarray:
    law, pts, fixed, delta, warm, bounds, seeds, one_thread = args
    if one_thread:  # a worker process: one BLAS thread each, or the cores are oversubscribed
        with _one_thread():
            return _boot_chunk((law, pts, fixed, delta, warm, bounds, seeds, False))
    out = np.full((len(seeds), len(warm)), np.nan)
    units = pts.units()
    free = _free_params(law, fixed)
    for r, s in enumerate(seeds):
        idx = resample_units(units, np.random.default_rng(s))
        block, _, _ = _make_block(law, pts.take(idx), fixed)
        try:
            v, _, _ = _run([block], bounds, warm[None, :], delta)
        except FitError:
            continue
        out[r] = [p.to_natural(v[block.index[p.key]]) for p in free]
    return out


def bootstrap_params(law: Law, pts: Points, n_boot: int, *, fixed: Mapping[str, float],
                     delta: float, warm: np.ndarray, bounds: list, seed: int = 0,
                     n_jobs: int | None = None) -> np.ndarray:
    """Natural free parameters refitted on ``n_boot`` resamples of ``pts``' bootstrap units
    (:meth:`Points.units`: trials, or parents' groups of trials; never single rows of a
    curve), in parallel over cores."""
    seeds = [seed * 1_000_003 + i + 1 for i in range(n_boot)]
    # one process per core when there is enough work to pay for the workers
    jobs = max(1, min(n_jobs or os.cpu_count() or 1, n_boot // 25 if n_jobs is None else n_boot))
    chunks = [seeds[i::jobs] for i in range(jobs)]
    tasks = [(law, pts, dict(fixed), delta, warm, bounds, c, jobs > 1) for c in chunks]
    parts = None
    if jobs > 1:
        import pickle

        try:
            pickle.dumps(law)
        except (pickle.PicklingError, AttributeError, TypeError):
            jobs = 1  # a law defined in a lambda or a closure: stay in this process
            tasks = [(law, pts, dict(fixed), delta, warm, bounds, seeds, False)]
    if jobs > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as ex:
            parts = list(ex.map(_boot_chunk, tasks))
    if parts is None:
        parts = [_boot_chunk(t) for t in tasks]
    # restore the seed order so results do not depend on the number of workers
    out = np.empty((n_boot, len(warm)))
    for j, part in enumerate(parts):
        out[j::jobs] = part
    return out


def fit_shared(items: Sequence[tuple[Law | str, Points]], *, shared: Sequence[str] = ("E",),
               fixed: Mapping[str, float] | None = None, delta: float = DEFAULT_DELTA,
               max_starts: int = 128, refine: int | None = 8, seed: int = 0,
               start: np.ndarray | None = None) -> list[FitResult]:
    """Fit several laws at once with the parameters in ``shared`` common to all of them
    (000 §5: E from a joint fit of the dense and the MoE Chinchilla laws)."""
    fixed = dict(fixed or {})
    laws = [(get_law(lw) if isinstance(lw, str) else lw, pts) for lw, pts in items]
    for law, pts in laws:
        _check_points(law, pts)
        for s in shared:
            law.param(s)
    t0 = time.perf_counter()
    first = laws[0][0]
    shared_index = {s: i for i, s in enumerate(shared)}
    bounds = [first.param(s).bounds for s in shared]
    axes_params = [first.param(s) for s in shared]
    blocks, offset = [], len(shared)
    for law, pts in laws:
        b, bnd, offset = _make_block(law, pts, fixed, offset, shared_index)
        blocks.append(b)
        bounds += bnd
        axes_params += [p for p in _free_params(law, fixed) if p.name not in shared_index]
    starts = _grid(axes_params, None, max_starts, seed) if start is None else start[None, :]
    v, f, ok = _run(blocks, bounds, starts, delta, refine)
    out = []
    for (law, pts), b in zip(laws, blocks):
        pred = _predict_log(b, v)
        rms_ln, rms_nats = _rms(pred, pts.L)
        out.append(FitResult(
            law=law.name, params=_natural(law, v, b, fixed), fixed=fixed, n=len(pts),
            objective=f, residuals=pred - np.log(pts.L), rms_ln=rms_ln, rms_nats=rms_nats,
            starts=len(starts), fit_s=time.perf_counter() - t0, converged=ok, theta=v))
    return out

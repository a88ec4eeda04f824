"""Decisions the fitted laws imply: D* crossover, compute-optimal upcycling, efficiency η, cost.

Pure functions of fitted parameters (natural units: tokens, parameters, nats; natural logs).
``python -m analysis.derived {dstar,optimal,advice,cost} ...``: :mod:`analysis.cli`, via __main__.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from moe_core.errors import FitError
from scaling.crossing import DStar, sign_changes
from scaling.laws import get_law

# 000 §5.2 / App. F.3: Mixtral-like 8×top-2 MoE has N2 ≈ 1.75·N1 active parameters.
ACTIVE_RATIO_8X2 = 1.75


# ---- D* crossover (000 Eq. 13, Eq. 2) -------------------------------------------------------


def loss_moe_scratch(moe: Mapping[str, float], D: float | np.ndarray, N1: float) -> np.ndarray:
    """From-scratch MoE loss, 000 Eq. 3 fitted against N1 (000 Table 2's MoE row)."""
    return get_law("chinchilla").predict(moe, {"N": np.full(np.shape(D), N1, dtype=float),
                                               "D": np.asarray(D, dtype=float)})


def loss_upcycled(upc: Mapping[str, float], D1, D2, N1) -> np.ndarray:
    """Upcycled MoE loss, 000 Eq. 12."""
    D1, D2, N1 = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (D1, D2, N1)))
    return get_law("joint_upcycled").predict(
        upc, {"D1": D1.ravel(), "D2": D2.ravel(), "N1": N1.ravel()}).reshape(D1.shape)


def d_star_solve(moe: Mapping[str, float], upc: Mapping[str, float], N1: float,
                 lo: float = 1e3, hi: float = 1e17) -> DStar:
    """000 Eq. 13, L_MoE(D*) = L_Upc(D1 = D*, D2 = D*), for 000 Table 2-style parameters
    (Eq. 3 against N1 and Eq. 12), with every crossing in [lo, hi]."""
    def gap(lnd: float) -> float:
        d = math.exp(lnd)
        return float(loss_moe_scratch(moe, np.array([d]), N1)[0]
                     - loss_upcycled(upc, d, d, N1))

    return sign_changes(gap, lo, hi)


def d_star(moe: Mapping[str, float], upc: Mapping[str, float], N1: float,
           lo: float = 1e3, hi: float = 1e17) -> float:
    """D*: tokens at which from-scratch MoE training catches up with upcycling with the same sunk
    cost (000 Eq. 13), solved numerically on ln D: the first + → − crossing of the gap.

    Returns ``inf`` when upcycling stays ahead on [lo, hi] and ``0.0`` when from-scratch leads
    from ``lo`` on and never falls behind (see :func:`d_star_solve` for every crossing).
    """
    r = d_star_solve(moe, upc, N1, lo, hi)
    if r.value is not None:
        return r.value
    return math.inf if r.winner_everywhere == "upcycled" or r.crossings else 0.0


def d_star_approx(N1: float) -> float:
    """000 Eq. 2: D* ≃ 4·(N1/1e9)^(−0.7 + 0.04·ln(N1/1e9)) billion tokens."""
    r = N1 / 1e9
    return 4e9 * r ** (-0.7 + 0.04 * math.log(r))


# ---- compute-optimal upcycling (000 Eq. 14, App. F.3) ---------------------------------------


@dataclass(frozen=True)
class ComputeOptimal:
    D2_opt: float
    N1_opt: float
    a: float
    """D2_opt ∝ C2^a, a = β/(α_eff + β)."""
    b: float
    """N1_opt ∝ C2^b, b = α_eff/(α_eff + β)."""
    alpha_eff: float
    """α_eff = α2 − α3·ln D1."""
    G: float
    exponent_D2_N1: float
    """x in D2_opt ∝ N1_opt^x, x = a/b = β/α_eff."""


def compute_optimal(upc: Mapping[str, float], D1: float, C2: float,
                    active_ratio: float = ACTIVE_RATIO_8X2) -> ComputeOptimal:
    """Optimal D2 and N1 for upcycling compute C2 = 6·N2·D2 with N2 = r·N1 (000 App. F.3)."""
    A, a1, a2, a3 = upc["A"], upc["alpha1"], upc["alpha2"], upc["alpha3"]
    B, beta = upc["B"], upc["beta"]
    alpha_eff = a2 - a3 * math.log(D1)
    if alpha_eff <= 0:
        raise FitError(f"α_eff = α2 − α3·ln D1 = {alpha_eff:.4g} ≤ 0 at D1 = {D1:.3g}: the law "
                       "predicts no gain from upcycled tokens, so no optimum exists")
    A_eff = A * D1 ** (-a1)
    G = (A_eff * alpha_eff / (B * beta)) ** (1 / (alpha_eff + beta))
    a = beta / (alpha_eff + beta)
    b = alpha_eff / (alpha_eff + beta)
    k = C2 / (6 * active_ratio)  # 000 App. F.3: C2/10.5 for r = 1.75
    return ComputeOptimal(D2_opt=G * k ** a, N1_opt=k ** b / G, a=a, b=b, alpha_eff=alpha_eff,
                          G=G, exponent_D2_N1=beta / alpha_eff)


# ---- expert upcycling efficiency and cost (003 Eq. 1, 2, 4) ---------------------------------


def upcycling_efficiency(L_fixed_E: float, L_upcycled: float, L_fixed_mE: float) -> float:
    """η = (L(Fixed-E) − L(Upcycled)) / (L(Fixed-E) − L(Fixed-mE)) (003 Eq. 4); 1 = gap closed."""
    gap = L_fixed_E - L_fixed_mE
    if gap == 0:
        raise FitError("L(Fixed-E) equals L(Fixed-mE): the efficiency is undefined")
    return (L_fixed_E - L_upcycled) / gap


def eta_interval(L_fixed_E, L_upcycled, L_fixed_mE, *, n_boot: int = 2000, ci: float = 0.9,
                 seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap interval of η (003 Eq. 4) over trials: each group's runs (seeds)
    resampled on their own, η of the three means per resample (resamples where the Fixed-E and
    Fixed-mE means tie are left out)."""
    groups = [np.asarray(g, dtype=float) for g in (L_fixed_E, L_upcycled, L_fixed_mE)]
    if any(len(g) == 0 for g in groups):
        raise FitError("η needs at least one run in each of Fixed-E, upcycled and Fixed-mE")
    # not scipy.stats.bootstrap: it refuses a one-run group (the upcycled trial always is one),
    # keeps tied resamples as NaN, and its quantile differs from np.percentile in the last bit
    rng = np.random.default_rng(seed)
    means = [g[rng.integers(0, len(g), (n_boot, len(g)))].mean(axis=1) for g in groups]
    gap = means[0] - means[2]
    ok = gap != 0
    eta = (means[0][ok] - means[1][ok]) / gap[ok]  # 003 Eq. 4 per resample
    if len(eta) == 0:
        raise FitError("L(Fixed-E) equals L(Fixed-mE) in every resample: η is undefined")
    lo, hi = np.percentile(eta, [50 * (1 - ci), 50 * (1 + ci)])
    return float(lo), float(hi)


@dataclass(frozen=True)
class ExpertUpcyclingCost:
    from_scratch: float
    """C_fs = T·s_mE (003 Eq. 1)."""
    upcycled: float
    """C_up = τ·s_E + (T − τ)·s_mE (003 Eq. 1)."""
    saving: float
    """C_fs − C_up = τ·(s_mE − s_E) (003 Eq. 2)."""

    @property
    def saving_frac(self) -> float:
        return self.saving / self.from_scratch


def expert_upcycling_cost(T: float, tau: float, s_E: float, s_mE: float,
                          gpus: int = 1) -> ExpertUpcyclingCost:
    """GPU-hours (or any unit of ``s``) of expert upcycling at step τ vs training the m·E model
    from scratch for T steps; ``s_*`` are seconds per step on ``gpus`` GPUs (003 Eq. 1–2)."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise FitError(f"--gpus {gpus}: must be an integer >= 1")
    if not (T > 0 and s_E > 0 and s_mE > 0):
        raise FitError(f"--T {T}, --s-e {s_E}, --s-me {s_mE}: steps and seconds per step must "
                       "be > 0")
    if not 0 <= tau <= T:
        raise FitError(f"the transition step tau={tau} must lie in [0, T={T}]")
    scale = gpus / 3600.0
    fs = T * s_mE * scale
    up = (tau * s_E + (T - tau) * s_mE) * scale
    return ExpertUpcyclingCost(fs, up, fs - up)


def flops_6nd(N: float, D: float) -> float:
    """Training FLOPs ≈ 6·N·D (N active non-embedding parameters, D tokens; 000 App. A)."""
    return 6.0 * N * D


def gpu_hours(flops: float, tflops_per_gpu: float = 400.0) -> float:
    """GPU-hours at a sustained ``tflops_per_gpu`` (000 App. A assumes 400 TFLOP/s)."""
    return flops / (tflops_per_gpu * 1e12) / 3600.0


# ---- Skywork rules of thumb (002 §3.3) ------------------------------------------------------


@dataclass(frozen=True)
class Advice:
    verdict: str
    """"upcycle", "from_scratch" or "borderline"."""
    ratio: float
    """C_MoE / C_dense."""
    reason: str


def skywork_advice(C_moe: float, C_dense: float, upcycle_below: float = 1 / 3,
                   scratch_at: float = 2.0) -> Advice:
    """002 §3.3: C_MoE ≪ C_dense → upcycle; C_MoE ≥ 2·C_dense → from scratch; no dense checkpoint
    (C_dense = 0) → from scratch. "≪" is ``upcycle_below`` (our reading: Skywork saw the two
    tie at C_MoE = ⅔·C_dense, so clearly below that); in between is borderline."""
    if C_moe <= 0:
        raise FitError(f"C_moe={C_moe} must be > 0")
    if C_dense <= 0:
        return Advice("from_scratch", math.inf,
                      "no dense checkpoint to upcycle (C_dense = 0): train the MoE from scratch")
    r = C_moe / C_dense
    if r >= scratch_at:
        return Advice("from_scratch", r, f"C_MoE ≥ {scratch_at:g}·C_dense: upcycling's head start "
                      "cannot make up for the uniform experts' slow diversification")
    if r < upcycle_below:
        return Advice("upcycle", r, f"C_MoE < {upcycle_below:.2g}·C_dense: upcycle to exploit "
                      "the sunk cost of the dense model")
    return Advice("borderline", r, "between the rules (Skywork: from scratch matched upcycling "
                  "at C_MoE = ⅔·C_dense); fit the laws to decide (see d_star)")


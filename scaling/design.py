"""Optimal-design maths for D* studies: how cheap can any design be that pins D* (000 Eq. 13) as
narrowly as the full D1 × D2 grid? (pure numpy / scipy; the CLI is ``studies/law_design_bound.py``)

Linearised at a law's parameters, the variance of ln D* from trials with noise σ in ln L is
gᵀF⁻¹g, F = Σ j_i j_iᵀ/σ² (j_i = ∂ ln L(D1_i, D2_i)/∂θ from the law itself, :func:`jacobian`;
g = ∂ ln D*/∂θ by implicit differentiation of the crossing, :func:`dstar_gradient`).

- Replicates allowed: Elfving's theorem, a linear programme (:func:`elfving_cost`).
- Each candidate at most once: the convex relaxation min Σ c_i·w_i s.t. gᵀ(Σ w_i j_i j_iᵀ/σ²)⁻¹g
  ≤ v, w ∈ [0, 1] (:func:`once_each`), a lower bound on every once-each design.
- Branches of one stable run sharing a noise u_g ~ N(0, σ_g²): latent effects appended to the
  parameters with prior precision 1/σ_g² (:func:`augmented`), exactly the GLS variance under
  σ²I + σ_g²ZZᵀ for 0/1 weights, and convex in w.
- Any number of stable runs of any type (:func:`cheapest_stable_runs`): Frank–Wolfe with a
  Cauchy–Schwarz certificate, a lower bound on every design's cost whether or not it converged.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from scipy.optimize import linprog, minimize, minimize_scalar

from scaling.laws import Law, log_predict_fit

_H = 1e-6


def jacobian(law: Law, theta: Mapping[str, float], free: Sequence[str], x: Mapping[str, np.ndarray]
             ) -> np.ndarray:
    """∂ ln L/∂θ_k of ``law`` at the points ``x`` for the fit-space parameters ``free`` (keys of
    ``theta``, e.g. ``ln_A``, ``alpha1``; the others held), by central differences → [n, k]."""
    x = {k: np.atleast_1d(np.asarray(v, dtype=float)) for k, v in x.items()}
    cols = []
    for k in free:
        up, dn = dict(theta), dict(theta)
        up[k] += _H
        dn[k] -= _H
        cols.append((log_predict_fit(law, up, x) - log_predict_fit(law, dn, x)) / (2 * _H))
    return np.stack(cols, axis=1)


def dstar_gradient(law: Law, theta: Mapping[str, float], free: Sequence[str],
                   scratch: Callable[[np.ndarray], np.ndarray], ln_dstar: float) -> np.ndarray:
    """g = ∂ ln D*/∂θ for the crossing on the diagonal D1 = D2 = D of ``law`` (upcycled) with the
    from-scratch curve ``scratch`` (ln D → ln L): gap(l) = ln L_scratch(l) − ln L_upc(l, l) = 0,
    so dl*/dθ = (∂ ln L_upc/∂θ)/gap'(l*) (000 Eq. 13, implicit differentiation)."""
    def gap(lnd: float) -> float:
        d = np.array([np.exp(lnd)])
        return float(scratch(np.array([lnd]))[0] - log_predict_fit(law, theta,
                                                                   {"D1": d, "D2": d})[0])

    h = 1e-4
    slope = (gap(ln_dstar + h) - gap(ln_dstar - h)) / (2 * h)
    d = np.exp(ln_dstar)
    return jacobian(law, theta, free, {"D1": d, "D2": d})[0] / slope


def augmented(rows: np.ndarray, sizes: list[int], g: np.ndarray, sigma: float,
              sigma_group: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows j̃_i/σ, prior precision P, g̃) of a design whose Jacobian ``rows`` come in groups of
    ``sizes`` consecutive branches of one stable run: without shared noise (J/σ, 0, g); with it,
    each row extended by its group's indicator and P = diag(0, I/σ_g²) on the latent effects, so
    that g̃ᵀ(J̃ᵀJ̃ + P)⁻¹g̃ is the GLS variance under σ²I + σ_g²ZZᵀ (one effect per stable run)."""
    J = np.asarray(rows, dtype=float) / sigma
    p = J.shape[1]
    if sigma_group == 0:
        return J, np.zeros((p, p)), g
    G = len(sizes)
    Z = np.zeros((len(J), G))
    Z[np.arange(len(J)), np.repeat(np.arange(G), sizes)] = 1.0
    P = np.zeros((p + G, p + G))
    P[p:, p:] = np.eye(G) / sigma_group ** 2
    return np.hstack([J, Z / sigma]), P, np.concatenate([g, np.zeros(G)])


def elfving_cost(J: np.ndarray, cost: np.ndarray, g: np.ndarray, v: float) -> float | None:
    """Smallest budget Σ c_i·n_i (counts real, replicates with fresh noise) reaching variance v:
    (min Σ|u_i| s.t. Σ u_i·j_i/√c_i = g)² / v (Elfving's theorem; ``J``: rows j_i/σ); None when
    the rows cannot estimate g."""
    Bm = J.T / np.sqrt(cost)
    n = Bm.shape[1]
    r = linprog(np.ones(2 * n), A_eq=np.hstack([Bm, -Bm]), b_eq=g, bounds=(0, None),
                method="highs")
    return None if r.status != 0 else float(r.fun ** 2 / v)


def once_each(J: np.ndarray, cost: np.ndarray, g: np.ndarray, v: float,
              prior: np.ndarray | None = None) -> tuple[float, float] | None:
    """(relaxed optimum, cost of its rounded-up design) of the cheapest branch weights
    w ∈ [0, 1]ⁿ with gᵀ(Jᵀ diag(w) J + P)⁻¹g ≤ v (J: rows j_i/σ; P: ``prior``, the precision
    of latent group effects appended to the parameters, or 0); None when even every branch
    (w = 1) falls short."""
    P = np.zeros((len(g), len(g))) if prior is None else prior
    ridge = 1e-9 * np.trace(J.T @ J) / len(g) * np.eye(len(g))  # w → 0 keeps M invertible

    def info_inv_g(w):
        return np.linalg.solve(J.T @ (w[:, None] * J) + P + ridge, g)

    def var(w):
        return float(g @ info_inv_g(w))

    one = np.ones(len(cost))
    if np.linalg.matrix_rank(J.T @ J + P) < len(g) or var(one) > v:
        return None

    def slack(w):  # >= 0 when the width is reached (in log: well scaled)
        return np.log(v) - np.log(var(w))

    def slack_grad(w):
        return (J @ info_inv_g(w)) ** 2 / var(w)

    r = minimize(lambda w: cost @ w, one, jac=lambda w: cost, method="SLSQP",
                 bounds=[(0.0, 1.0)] * len(cost),
                 constraints=[{"type": "ineq", "fun": slack, "jac": slack_grad}],
                 options={"maxiter": 300, "ftol": 1e-12})
    w = np.clip(r.x, 0.0, 1.0)
    if slack(w) < -1e-6:  # not converged to a feasible point: the all-ones design is
        w = one
    chosen = (w > 0.01).astype(float)
    if var(chosen) > v:  # rounding up can only add information; guard anyway
        chosen = one
    return float(cost @ w), float(cost @ chosen)


def group_information(rows: np.ndarray, member: np.ndarray, sigma: float,
                      sigma_group: float, octaves: np.ndarray | None = None,
                      length: float | None = None) -> np.ndarray:
    """Information on the parameters of each group type t (``member[t]``: which of the Jacobian
    ``rows`` its stable run's branches are), its shared effect integrated out: J_Sᵀ Σ_S⁻¹ J_S
    with Σ_S⁻¹ = (I − σ_g²/(σ² + |S|σ_g²)·11ᵀ)/σ². With ``length`` (in octaves of D2; the
    rows' positions in ``octaves``) the shared part fades with distance instead:
    Σ_S = σ²I + σ_g²·exp(−Δ²/2ℓ²) (a smooth effect of the parent along D2, findings §10)."""
    if length is not None:
        K = sigma_group ** 2 * np.exp(-np.subtract.outer(octaves, octaves) ** 2
                                      / (2 * length ** 2)) + sigma ** 2 * np.eye(len(octaves))
        out = np.empty((len(member), rows.shape[1], rows.shape[1]))
        for t, m in enumerate(member):
            J = rows[m]
            out[t] = J.T @ np.linalg.solve(K[np.ix_(m, m)], J)
        return out
    B = member.astype(float)
    JJ = np.einsum("tb,bi,bj->tij", B, rows, rows)
    s1 = B @ rows  # J_Sᵀ1
    shrink = sigma_group ** 2 / (sigma ** 2 + B.sum(axis=1) * sigma_group ** 2)
    return (JJ - shrink[:, None, None] * np.einsum("ti,tj->tij", s1, s1)) / sigma ** 2


def cheapest_stable_runs(infos: np.ndarray, cost: np.ndarray, g: np.ndarray, v: float,
                         iters: int = 4000) -> dict:
    """The cheapest design of stable runs of any types, each as many times as wanted with a
    fresh seed (its noise its own), whose gᵀ(Σ n_t I_t)⁻¹g ≤ v; counts relaxed to reals.

    On cost shares ξ (n_t = ξ_t/c_t, Σ ξ = 1 unit of cost), φ(ξ) = gᵀM(ξ)⁻¹g with
    M = Σ ξ_t I_t/c_t; the cost for width v is φ/v, φ being −1-homogeneous. Frank–Wolfe with a
    line search (Wynn's algorithm) lowers φ; for any ξ and x = M(ξ)⁻¹g, Cauchy–Schwarz gives
    every design of unit cost φ ≥ (gᵀx)²/max_t xᵀI_t x/c_t, so ``lower`` is a certified bound
    on every design's cost, converged or not, and ``upper`` the cost of the best ξ found."""
    A = infos / cost[:, None, None]
    xi = np.full(len(cost), 1.0 / len(cost))
    M = np.einsum("t,tij->ij", xi, A)
    lower = 0.0
    for _ in range(iters):
        x = np.linalg.solve(M, g)
        phi = float(g @ x)
        d = np.einsum("i,tij,j->t", x, A, x)
        t = int(np.argmax(d))
        lower = max(lower, phi ** 2 / d[t] / v)
        if phi / v - lower <= 1e-4 * lower:
            break

        def along(gam, M=M, At=A[t]):  # φ on the segment towards type t
            return float(g @ np.linalg.solve((1 - gam) * M + gam * At, g))

        gam = float(minimize_scalar(along, bounds=(0.0, 1.0), method="bounded",
                                    options={"xatol": 1e-10}).x)
        xi *= 1 - gam
        xi[t] += gam
        M = (1 - gam) * M + gam * A[t]
    phi = float(g @ np.linalg.solve(M, g))
    return {"upper": phi / v, "lower": lower, "shares": xi}


def branch_sets(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every non-empty set of branches on an n-point D2 axis (a boolean row each) and its
    longest branch's index (the stable run's end)."""
    masks = np.arange(1, 2 ** n)
    member = ((masks[:, None] >> np.arange(n)) & 1).astype(bool)
    top = n - 1 - np.argmax(member[:, ::-1], axis=1)
    return member, top


def best_group_design(vals: np.ndarray, groups: int, stable: np.ndarray, parent: np.ndarray,
                      branch_cost: Callable[[tuple[int, ...], Sequence[int]],
                                            tuple[float, float] | None]) -> tuple | None:
    """Branch and bound over designs of at most ``groups`` stable runs (D1 indices, each with a
    stable run to a D2 index): (cost, D1 indices, stable ends, rounded cost) of the cheapest, or
    None. ``stable[m]``/``parent[d]``: costs of a stable run to index m / a parent at index d;
    ``branch_cost(d1s, ms)``: (relaxed, rounded) branch budget or None. A longer stable run only
    adds candidates, so the budget with every run at the top bounds every shorter choice, and
    stable-run choices are visited cheapest first."""
    top = len(vals) - 1
    best = None
    for k in range(1, groups + 1):
        ms_all = np.array(list(itertools.product(range(len(vals)), repeat=k)))
        ms_all = ms_all[np.argsort(stable[ms_all].sum(axis=1), kind="stable")]
        for d1s in itertools.combinations(range(len(vals)), k):
            parents = float(sum(parent[d] for d in d1s))
            if best is not None and parents >= best[0]:
                continue
            lb = branch_cost(d1s, [top] * k)
            if lb is None:  # even every branch of every group falls short
                continue
            for ms in ms_all:
                fixed = parents + float(stable[ms].sum())
                if best is not None and fixed + lb[0] >= best[0]:
                    break
                r = branch_cost(d1s, ms)
                if r is not None and (best is None or fixed + r[0] < best[0]):
                    best = (fixed + r[0], d1s, tuple(int(m) for m in ms), fixed + r[1])
    return best

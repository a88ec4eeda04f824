"""How cheap can any design be? The c-optimal (Elfving) bound on the token cost of a D* interval
as narrow as the full grid's, under the true law (an oracle's design; no training).

Linearised at 000 Table 2's parameters (N1 = 1e9, E fixed as in bench/law_search.py), the
variance of ln D* from trials with independent noise σ in ln L is g·F⁻¹·g, with F = Σ j_i j_iᵀ/σ²,
j_i = ∂ ln L(D1_i, D2_i)/∂θ and g = ∂ ln D*/∂θ (000 Eq. 13 by implicit differentiation). For a
design that opens WSD branch groups at some D1 values (each: its parent 6·N1·D1 and a stable run
up to the decay start of its longest budget M, 0.9·6·N2·M) and then buys branches at any D2 ≤ M
for their decay alone (0.1·6·N2·D2 each, any number of times: replicates with fresh noise, which
favours the bound), Elfving's theorem gives the smallest branch budget B reaching variance V as
(min Σ|u_i| s.t. Σ u_i·j_i/(σ·√c_i) = g)² / V, a linear programme (scipy's HiGHS). The bound is
the cheapest (groups, B) over up to ``--groups`` groups on the candidates' D1 × D2 log grid.

No adaptive searcher can beat this without knowing the truth in advance; it prints the bound's
cost as a share of the full 5 × 5 grid's (with WSD branches), and the linearised grid width.

``--once``: each candidate at most once, as the driver runs them (a repeated WSD branch is the
same deterministic run: it adds no information). Then the branch budget is the convex programme
min Σ c_i·w_i s.t. g·(Σ w_i j_i j_iᵀ/σ²)⁻¹·g ≤ V, 0 ≤ w_i ≤ 1 (scipy's SLSQP, exact gradients);
its optimum is a lower bound on any once-each design with those groups (``bound_cost_ratio``),
and the design that runs every candidate with w_i > 0.01 is one such design, whose cost is
checked and reported as ``rounded_cost_ratio`` (what an oracle can actually achieve).

    python bench/law_design_bound.py [--points 9] [--groups 3] [--once]
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import numpy as np
from scipy.optimize import linprog, minimize

from sweeps.simulate import SimulatedStudy

N1, N2, DECAY = 1e9, 1.75e9, 0.1


def jacobian(th: np.ndarray, E: float, l1, l2) -> np.ndarray:
    """∂ ln L/∂(ln A, α1, α2, α3) of 000 Eq. 8 at log tokens (l1, l2)."""
    t = np.exp(th[0] - th[1] * l1 - th[2] * l2 + th[3] * l1 * l2)
    return (t / (t + E)) * np.array([np.ones_like(l1), -l1, -l2, l1 * l2])


def once_each(J: np.ndarray, cost: np.ndarray, g: np.ndarray, v: float
              ) -> tuple[float, float] | None:
    """(relaxed optimum, cost of its rounded-up design) of the cheapest branch weights
    w ∈ [0, 1]ⁿ with gᵀ(Jᵀ diag(w) J)⁻¹g ≤ v (J: rows j_i/σ); None when even every branch
    (w = 1) falls short."""
    ridge = 1e-9 * np.trace(J.T @ J) / len(g) * np.eye(len(g))  # w → 0 keeps M invertible

    def info_inv_g(w):
        return np.linalg.solve(J.T @ (w[:, None] * J) + ridge, g)

    def var(w):
        return float(g @ info_inv_g(w))

    one = np.ones(len(cost))
    if np.linalg.matrix_rank(J) < len(g) or var(one) > v:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=9, help="log-grid values per axis")
    ap.add_argument("--sigma", type=float, default=0.003,
                    help="noise sd in ln L (sets the widths; the cost ratio does not depend on it)")
    ap.add_argument("--groups", type=int, default=2, help="most WSD branch groups (D1 values)")
    ap.add_argument("--once", action="store_true",
                    help="each candidate at most once (no replicates), as the driver runs them")
    args = ap.parse_args()
    t0 = time.time()
    sigma = args.sigma
    st = SimulatedStudy(N1=N1)
    u, s = st.upcycled, st.scratch
    th = np.array([np.log(u["A"]), u["alpha1"], u["alpha2"], u["alpha3"]])
    ls = np.log(st.true_d_star())

    def gap(l):  # ln L_MoE − ln L_Upc on the diagonal
        up = np.exp(th[0] - (th[1] + th[2]) * l + th[3] * l * l) + u["E"]
        return np.log(s["A"] * np.exp(-s["alpha"] * l) + s["E"]) - np.log(up)

    h = 1e-4
    g = jacobian(th, u["E"], ls, ls) / ((gap(ls + h) - gap(ls - h)) / (2 * h))

    def variance(points) -> float:
        F = sum(np.outer(j, j) for j in (jacobian(th, u["E"], a, b) for a, b in points))
        return float(g @ np.linalg.solve(F / sigma ** 2, g))

    grid_vals = np.log(np.geomspace(0.5e9, 8e9, 5))
    v_grid = variance([(a, b) for a in grid_vals for b in grid_vals])
    D = np.exp(grid_vals)
    grid_cost = 6 * N1 * D.sum() + len(D) * 6 * N2 * ((1 - DECAY) * D.max() + DECAY * D.sum())

    vals = np.log(np.geomspace(0.5e9, 8e9, args.points))
    best = None
    for k in range(1, args.groups + 1):
        for d1s in itertools.combinations(range(len(vals)), k):
            for ms in itertools.product(range(len(vals)), repeat=k):
                fixed = sum(6 * N1 * np.exp(vals[d]) + (1 - DECAY) * 6 * N2 * np.exp(vals[m])
                            for d, m in zip(d1s, ms)) / grid_cost  # in grid costs (LP scaling)
                if best is not None and fixed >= best[0]:
                    continue
                pts = [(vals[d], vals[b]) for d, m in zip(d1s, ms) for b in range(m + 1)]
                cost = np.array([DECAY * 6 * N2 * np.exp(b) for _, b in pts]) / grid_cost
                J = np.array([jacobian(th, u["E"], a, b) for a, b in pts])
                if args.once:
                    r = once_each(J / sigma, cost, g, v_grid)
                    if r is None:
                        continue
                    branch, rounded = r
                else:
                    Bm = J.T / (sigma * np.sqrt(cost))
                    n = Bm.shape[1]
                    r = linprog(np.ones(2 * n), A_eq=np.hstack([Bm, -Bm]), b_eq=g,
                                bounds=(0, None), method="highs")
                    if r.status != 0:
                        continue
                    branch = rounded = r.fun ** 2 / v_grid
                total = fixed + branch
                if best is None or total < best[0]:
                    best = (total, [float(np.exp(vals[d])) for d in d1s],
                            [float(np.exp(vals[m])) for m in ms], fixed + rounded)
    if best is None:
        print(f"no design with at most {args.groups} branch groups reaches the grid's width "
              f"(each candidate {'once' if args.once else 'any number of times'}); try --groups "
              f"{args.groups + 1}")
        print(json.dumps({"bound_cost_ratio": None, "once": args.once, "groups": args.groups,
                          "points": args.points, "sigma_ln_loss": sigma}))
        return
    sd = np.sqrt(v_grid)
    out = {"grid_cost_flops": grid_cost, "grid_width_linearised": float(np.exp(1.645 * sd)
                                                                        - np.exp(-1.645 * sd)),
           "bound_cost_ratio": best[0], "bound_D1": best[1], "bound_M": best[2],
           "rounded_cost_ratio": best[3], "once": args.once,
           "sigma_ln_loss": sigma, "points": args.points, "groups": args.groups,
           "wall_s": round(time.time() - t0, 1)}
    print(f"full grid: {grid_cost:.3g} FLOPs, linearised 90 % D* width "
          f"{out['grid_width_linearised']:.2f}")
    how = ("each candidate at most once: relaxed bound" if args.once else
           "replicates allowed")
    print(f"oracle c-optimal design with WSD branches ({how}): "
          f"{out['bound_cost_ratio']:.3f} of the grid's cost — groups at D1 = "
          f"{[f'{d:.3g}' for d in best[1]]}, stable runs to M = {[f'{m:.3g}' for m in best[2]]}"
          + (f"; a once-each design of those groups reaching the width: "
             f"{out['rounded_cost_ratio']:.3f}" if args.once else ""))
    print(json.dumps(out))


if __name__ == "__main__":
    main()

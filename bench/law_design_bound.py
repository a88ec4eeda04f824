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

``--sigma-group S``: the branches of one stable run also share a noise u_g ~ N(0, S²) in ln L
(the simulator's ``sigma_group``; README "Noise"), ``--sigma`` being each branch's own. The
information is then that of the parameters extended by one latent u_g per group, with prior
precision 1/S²: M(w) = Σ w_i j̃_i j̃_iᵀ/σ² + diag(0, I/S²), j̃_i = (j_i, e_g(i)). For 0/1
weights gᵀ(M⁻¹)g is exactly the generalised-least-squares variance under the equicorrelated
covariance σ²I + S²ZZᵀ (the Schur complement of the u block), the grid's width included, and
for w ∈ [0, 1] it is convex in w, so the relaxed optimum is again a lower bound (``--once`` is
implied: a repeated branch shares its group's noise, and w > 1 would count its own noise as
fresh).

``--any-groups``: instead of searching group sets, a certified lower bound over every design:
any number of stable runs of any D1, each a fresh seed (its noise its own), each with any set
of branches on the axes (every (D1, branch set) a type; counts relaxed to reals; see
:func:`cheapest_stable_runs`). ``--kernel-octaves L`` (with it and ``--sigma-group``): the
shared noise fades along D2, correlation exp(−d²/2L²) between branches d octaves apart.

    python bench/law_design_bound.py [--points 9] [--groups 3] [--once] [--sigma-group S]
    python bench/law_design_bound.py --any-groups [--points 9] [--sigma-group S]
                                     [--kernel-octaves L]
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import numpy as np
from scipy.optimize import linprog, minimize, minimize_scalar

from sweeps.simulate import SimulatedStudy

N1, N2, DECAY = 1e9, 1.75e9, 0.1


def jacobian(th: np.ndarray, E: float, l1, l2) -> np.ndarray:
    """∂ ln L/∂(ln A, α1, α2, α3) of 000 Eq. 8 at log tokens (l1, l2)."""
    t = np.exp(th[0] - th[1] * l1 - th[2] * l2 + th[3] * l1 * l2)
    return (t / (t + E)) * np.array([np.ones_like(l1), -l1, -l2, l1 * l2])


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

        r = minimize_scalar(along, bounds=(0.0, 1.0), method="bounded",
                            options={"xatol": 1e-10})
        gam = float(r.x)
        xi *= 1 - gam
        xi[t] += gam
        M = (1 - gam) * M + gam * A[t]
    phi = float(g @ np.linalg.solve(M, g))
    return {"upper": phi / v, "lower": lower, "shares": xi}


def _any_groups(args, th, E, g, vals, v_grid, grid_cost, t0) -> None:
    """--any-groups: every (D1, branch set) is a type of stable run; the certified bound."""
    n = len(vals)
    masks = np.arange(1, 2 ** n)
    member = ((masks[:, None] >> np.arange(n)) & 1).astype(bool)  # branch set by D2 index
    top = n - 1 - np.argmax(member[:, ::-1], axis=1)  # its longest branch: the stable run's M
    decay = DECAY * 6 * N2 * np.exp(vals)
    stable = (1 - DECAY) * 6 * N2 * np.exp(vals[top]) + member @ decay
    infos, parent = [], []
    for a in vals:
        rows = jacobian(th, E, np.full(n, a), vals).T
        infos.append(group_information(rows, member, args.sigma, args.sigma_group,
                                       vals / np.log(2), args.kernel_octaves))
        parent.append(np.full(len(masks), 6 * N1 * np.exp(a)))
    infos = np.concatenate(infos)
    with_parent = (np.concatenate(parent) + np.tile(stable, n)) / grid_cost
    own = cheapest_stable_runs(infos, with_parent, g, v_grid)
    shared = cheapest_stable_runs(infos, np.tile(stable, n) / grid_cost, g, v_grid)
    order = np.argsort(own["shares"])[::-1][:6]
    used = [{"D1": float(np.exp(vals[t // len(masks)])),
             "D2": [float(np.exp(b)) for b in vals[member[t % len(masks)]]],
             "cost_share": round(float(own["shares"][t]), 3)}
            for t in order if own["shares"][t] > 0.01]
    out = {"bound_cost_ratio": own["lower"], "any_groups": True,
           "kernel_octaves": args.kernel_octaves,
           "relaxed_design_cost_ratio": own["upper"], "design": used,
           "bound_cost_ratio_parents_free": shared["lower"],
           "sigma_ln_loss": args.sigma, "sigma_group": args.sigma_group,
           "points": args.points, "types": int(len(with_parent)),
           "wall_s": round(time.time() - t0, 1)}
    sd = np.sqrt(v_grid)
    print(f"full grid: {grid_cost:.3g} FLOPs, linearised 90 % D* width "
          f"{np.exp(1.645 * sd) - np.exp(-1.645 * sd):.2f}")
    print(f"any number of stable runs (fresh seeds), any branch sets on the {args.points}-point "
          f"axes: no design reaches the grid's width below {own['lower']:.3f} of its cost "
          f"(certified; the best relaxed design found costs {own['upper']:.3f}); with parents "
          f"free (shared at no cost): {shared['lower']:.3f}")
    for d in used:
        print(f"  {d['cost_share']:.0%} of the cost: stable runs off D1 = {d['D1']:.3g}, "
              f"branches at D2 = {[f'{b:.3g}' for b in d['D2']]}")
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=9, help="log-grid values per axis")
    ap.add_argument("--sigma", type=float, default=0.003,
                    help="noise sd in ln L (sets the widths; the cost ratio does not depend on it)")
    ap.add_argument("--groups", type=int, default=2, help="most WSD branch groups (D1 values)")
    ap.add_argument("--once", action="store_true",
                    help="each candidate at most once (no replicates), as the driver runs them")
    ap.add_argument("--sigma-group", type=float, default=0.0,
                    help="noise sd in ln L shared by the branches of one stable run (implies "
                         "--once); --sigma is then each branch's own")
    ap.add_argument("--kernel-octaves", type=float, default=None,
                    help="with --any-groups: the shared noise fades with the distance of two "
                         "branches along D2, correlation exp(-d^2/2L^2) at d octaves (findings "
                         "§10 fits L = 2.7); default: the same for every pair")
    ap.add_argument("--any-groups", action="store_true",
                    help="instead: the certified lower bound over designs of any number of "
                         "stable runs, each a fresh seed, with any set of branches (counts "
                         "relaxed; at most 14 --points)")
    args = ap.parse_args()
    t0 = time.time()
    sigma, sg = args.sigma, args.sigma_group
    if sg < 0 or sigma <= 0:
        ap.error("--sigma must be > 0 and --sigma-group >= 0")
    once = args.once or sg > 0
    if args.kernel_octaves is not None and (not args.any_groups or sg <= 0
                                            or args.kernel_octaves <= 0):
        ap.error("--kernel-octaves L (L > 0) goes with --any-groups and --sigma-group")
    st = SimulatedStudy(N1=N1)
    u, s = st.upcycled, st.scratch
    th = np.array([np.log(u["A"]), u["alpha1"], u["alpha2"], u["alpha3"]])
    ls = np.log(st.true_d_star())

    def gap(l):  # ln L_MoE − ln L_Upc on the diagonal
        up = np.exp(th[0] - (th[1] + th[2]) * l + th[3] * l * l) + u["E"]
        return np.log(s["A"] * np.exp(-s["alpha"] * l) + s["E"]) - np.log(up)

    h = 1e-4
    g = jacobian(th, u["E"], ls, ls) / ((gap(ls + h) - gap(ls - h)) / (2 * h))

    def design(groups: list[list[float]], l1s) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rows = np.array([jacobian(th, u["E"], a, b) for a, bs in zip(l1s, groups) for b in bs])
        return augmented(rows, [len(bs) for bs in groups], g, sigma, sg)

    grid_vals = np.log(np.geomspace(0.5e9, 8e9, 5))
    every = np.ones((1, len(grid_vals)), bool)  # the grid: 5 groups, every D2 of its axis each
    v_grid = float(g @ np.linalg.solve(sum(
        group_information(jacobian(th, u["E"], np.full(len(grid_vals), a), grid_vals).T, every,
                          sigma, sg, grid_vals / np.log(2), args.kernel_octaves)[0]
        for a in grid_vals), g))
    D = np.exp(grid_vals)
    grid_cost = 6 * N1 * D.sum() + len(D) * 6 * N2 * ((1 - DECAY) * D.max() + DECAY * D.sum())

    vals = np.log(np.geomspace(0.5e9, 8e9, args.points))
    top = len(vals) - 1
    if args.any_groups:
        if args.points > 14:
            ap.error("--any-groups enumerates every branch set of a stable run: at most 14 "
                     "--points")
        _any_groups(args, th, u["E"], g, vals, v_grid, grid_cost, t0)
        return

    def branch_cost(d1s, ms) -> tuple[float, float] | None:
        """(relaxed, rounded) cheapest branch budget, in grid costs, of groups at D1 indices
        ``d1s`` with stable runs to D2 indices ``ms``; None when no branch set reaches v."""
        pts = [vals[b] for m in ms for b in range(m + 1)]
        cost = np.array([DECAY * 6 * N2 * np.exp(b) for b in pts]) / grid_cost
        J, P, gt = design([[vals[b] for b in range(m + 1)] for m in ms], [vals[d] for d in d1s])
        if once:
            return once_each(J, cost, gt, v_grid, P)
        Bm = J.T / np.sqrt(cost)
        n = Bm.shape[1]
        r = linprog(np.ones(2 * n), A_eq=np.hstack([Bm, -Bm]), b_eq=g, bounds=(0, None),
                    method="highs")
        return None if r.status != 0 else (r.fun ** 2 / v_grid,) * 2

    # Branch and bound: a longer stable run only adds candidates, so a group set's branch budget
    # with every stable run at the top (lb) bounds it below for every shorter choice, and the
    # stable runs' choices are visited cheapest first (in grid costs: the LP's scaling).
    stable = (1 - DECAY) * 6 * N2 * np.exp(vals) / grid_cost
    best = None
    for k in range(1, args.groups + 1):
        ms_all = np.array(list(itertools.product(range(len(vals)), repeat=k)))
        ms_all = ms_all[np.argsort(stable[ms_all].sum(axis=1), kind="stable")]
        for d1s in itertools.combinations(range(len(vals)), k):
            parents = sum(6 * N1 * np.exp(vals[d]) for d in d1s) / grid_cost
            if best is not None and parents >= best[0]:
                continue
            lb = branch_cost(d1s, [top] * k)
            if lb is None:  # even every branch of every group falls short
                continue
            for ms in ms_all:
                fixed = parents + stable[ms].sum()
                if best is not None and fixed + lb[0] >= best[0]:
                    break
                r = branch_cost(d1s, ms)
                if r is None:
                    continue
                branch, rounded = r
                if best is None or fixed + branch < best[0]:
                    best = (fixed + branch, [float(np.exp(vals[d])) for d in d1s],
                            [float(np.exp(vals[m])) for m in ms], fixed + rounded)
    if best is None:
        print(f"no design with at most {args.groups} branch groups reaches the grid's width "
              f"(each candidate {'once' if once else 'any number of times'}); try --groups "
              f"{args.groups + 1}")
        print(json.dumps({"bound_cost_ratio": None, "once": once, "groups": args.groups,
                          "points": args.points, "sigma_ln_loss": sigma, "sigma_group": sg}))
        return
    sd = np.sqrt(v_grid)
    out = {"grid_cost_flops": grid_cost, "grid_width_linearised": float(np.exp(1.645 * sd)
                                                                        - np.exp(-1.645 * sd)),
           "bound_cost_ratio": best[0], "bound_D1": best[1], "bound_M": best[2],
           "rounded_cost_ratio": best[3], "once": once,
           "sigma_ln_loss": sigma, "sigma_group": sg, "points": args.points,
           "groups": args.groups,
           "wall_s": round(time.time() - t0, 1)}
    print(f"full grid: {grid_cost:.3g} FLOPs, linearised 90 % D* width "
          f"{out['grid_width_linearised']:.2f}")
    how = ("each candidate at most once: relaxed bound" if once else
           "replicates allowed") + (f"; branches of a stable run share noise sd {sg:g}"
                                    if sg else "")
    print(f"oracle c-optimal design with WSD branches ({how}): "
          f"{out['bound_cost_ratio']:.3f} of the grid's cost — groups at D1 = "
          f"{[f'{d:.3g}' for d in best[1]]}, stable runs to M = {[f'{m:.3g}' for m in best[2]]}"
          + (f"; a once-each design of those groups reaching the width: "
             f"{out['rounded_cost_ratio']:.3f}" if once else ""))
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""How cheap can any design be? The c-optimal (Elfving) bound on the token cost of a D* interval
as narrow as the full grid's, under the true law (an oracle's design; no training).

Linearised at 000 Table 2's parameters (N1 = 1e9, E fixed as in studies/law_search.py), the
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
(the simulator's ``sigma_group``; docs/law-search.md), ``--sigma`` being each branch's own. The
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

    python studies/law_design_bound.py [--points 9] [--groups 3] [--once] [--sigma-group S]
    python studies/law_design_bound.py --any-groups [--points 9] [--sigma-group S]
                                     [--kernel-octaves L]

The maths is :mod:`scaling.design` (tested in tests/scaling/test_design.py); this is its
command line on the simulated truth of ``sweeps.testing.simulate``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from scaling.design import (
    augmented,
    best_group_design,
    branch_sets,
    cheapest_stable_runs,
    dstar_gradient,
    elfving_cost,
    group_information,
    jacobian,
    once_each,
)
from scaling.laws import get_law
from sweeps.testing.simulate import SimulatedStudy

N1, N2, DECAY = 1e9, 1.75e9, 0.1
FREE = ("ln_A", "alpha1", "alpha2", "alpha3")  # E fixed, as studies/law_search.py fits it (000 §5)
LAW = get_law("upcycled_mul")


class Problem:
    """000 Table 2 at N1 (the simulated truth): the upcycled law's fit-space parameters, g =
    ∂ ln D*/∂θ, the full 5 × 5 grid's linearised variance and cost."""

    def __init__(self, sigma: float, sigma_group: float, length: float | None):
        st = SimulatedStudy(N1=N1)
        u, s = st.upcycled, st.scratch
        self.theta = {"ln_A": float(np.log(u["A"])), "alpha1": u["alpha1"],
                      "alpha2": u["alpha2"], "alpha3": u["alpha3"], "ln_E": float(np.log(u["E"]))}
        scratch = get_law("chinchilla_d")
        self.g = dstar_gradient(LAW, self.theta, FREE,
                                lambda l: scratch.log_predict(s, {"D": np.exp(l)}),
                                float(np.log(st.true_d_star())))
        self.sigma, self.sigma_group, self.length = sigma, sigma_group, length
        grid = np.log(np.geomspace(0.5e9, 8e9, 5))
        every = np.ones((1, len(grid)), bool)  # the grid: 5 groups, every D2 of its axis each
        self.v_grid = float(self.g @ np.linalg.solve(sum(
            group_information(self.rows(a, grid), every, sigma, sigma_group, grid / np.log(2),
                              length)[0] for a in grid), self.g))
        D = np.exp(grid)
        self.grid_cost = 6 * N1 * D.sum() + len(D) * 6 * N2 * ((1 - DECAY) * D.max()
                                                               + DECAY * D.sum())

    def rows(self, l1: float, l2s: np.ndarray) -> np.ndarray:
        """∂ ln L/∂θ at D1 = e^l1 and each D2 = e^l2 (from the law)."""
        return jacobian(LAW, self.theta, FREE, {"D1": np.exp(np.full(len(l2s), l1)),
                                                "D2": np.exp(np.asarray(l2s))})

    def width(self) -> float:
        sd = np.sqrt(self.v_grid)
        return float(np.exp(1.645 * sd) - np.exp(-1.645 * sd))


def certified_bound(sigma: float, sigma_group: float = 0.0, length: float | None = None,
                    points: int = 9) -> dict:
    """The certified lower bound (``--any-groups``) on the token cost, as a share of the full
    5 × 5 grid's, of any design reaching the grid's linearised D* width under that noise (own
    σ, shared σ_group fading over ``length`` octaves of D2, None: equicorrelated) on
    ``points``-point axes over the bench's box; studies/law_search.py judges its searcher by it."""
    pb = Problem(sigma, sigma_group, length)
    vals = np.log(np.geomspace(0.5e9, 8e9, points))
    n = len(vals)
    member, top = branch_sets(n)
    decay = DECAY * 6 * N2 * np.exp(vals)
    stable = (1 - DECAY) * 6 * N2 * np.exp(vals[top]) + member @ decay
    infos = np.concatenate([group_information(pb.rows(a, vals), member, sigma, sigma_group,
                                              vals / np.log(2), length) for a in vals])
    parent = np.repeat(6 * N1 * np.exp(vals), len(member))
    with_parent = (parent + np.tile(stable, n)) / pb.grid_cost
    own = cheapest_stable_runs(infos, with_parent, pb.g, pb.v_grid)
    shared = cheapest_stable_runs(infos, np.tile(stable, n) / pb.grid_cost, pb.g, pb.v_grid)
    order = np.argsort(own["shares"])[::-1][:6]
    used = [{"D1": float(np.exp(vals[t // len(member)])),
             "D2": [float(np.exp(b)) for b in vals[member[t % len(member)]]],
             "cost_share": round(float(own["shares"][t]), 3)}
            for t in order if own["shares"][t] > 0.01]
    return {"bound_cost_ratio": own["lower"], "any_groups": True, "kernel_octaves": length,
            "relaxed_design_cost_ratio": own["upper"], "design": used,
            "bound_cost_ratio_parents_free": shared["lower"], "sigma_ln_loss": sigma,
            "sigma_group": sigma_group, "points": points, "types": int(len(with_parent)),
            "grid_cost_flops": pb.grid_cost, "grid_width_linearised": pb.width()}


def _any_groups(args, t0: float) -> None:
    """--any-groups: every (D1, branch set) is a type of stable run; the certified bound."""
    out = certified_bound(args.sigma, args.sigma_group, args.kernel_octaves, args.points)
    out["wall_s"] = round(time.time() - t0, 1)
    print(f"full grid: {out['grid_cost_flops']:.3g} FLOPs, linearised 90 % D* width "
          f"{out['grid_width_linearised']:.2f}")
    print(f"any number of stable runs (fresh seeds), any branch sets on the {args.points}-point "
          f"axes: no design reaches the grid's width below {out['bound_cost_ratio']:.3f} of its "
          f"cost (certified; the best relaxed design found costs "
          f"{out['relaxed_design_cost_ratio']:.3f}); with parents free (shared at no cost): "
          f"{out['bound_cost_ratio_parents_free']:.3f}")
    for d in out["design"]:
        print(f"  {d['cost_share']:.0%} of the cost: stable runs off D1 = {d['D1']:.3g}, "
              f"branches at D2 = {[f'{b:.3g}' for b in d['D2']]}")
    print(json.dumps(out))


def _groups(args, pb: Problem, vals: np.ndarray, once: bool, t0: float) -> None:
    """The cheapest design of at most --groups stable runs (branch and bound)."""
    def branch_cost(d1s, ms) -> tuple[float, float] | None:
        pts = [vals[b] for m in ms for b in range(m + 1)]
        cost = np.array([DECAY * 6 * N2 * np.exp(b) for b in pts]) / pb.grid_cost
        rows = np.concatenate([pb.rows(vals[d], vals[:m + 1]) for d, m in zip(d1s, ms)])
        J, P, gt = augmented(rows, [m + 1 for m in ms], pb.g, args.sigma, args.sigma_group)
        if once:
            return once_each(J, cost, gt, pb.v_grid, P)
        c = elfving_cost(J, cost, gt, pb.v_grid)
        return None if c is None else (c, c)

    stable = (1 - DECAY) * 6 * N2 * np.exp(vals) / pb.grid_cost
    best = best_group_design(vals, args.groups, stable, 6 * N1 * np.exp(vals) / pb.grid_cost,
                             branch_cost)
    if best is None:
        print(f"no design with at most {args.groups} branch groups reaches the grid's width "
              f"(each candidate {'once' if once else 'any number of times'}); try --groups "
              f"{args.groups + 1}")
        print(json.dumps({"bound_cost_ratio": None, "once": once, "groups": args.groups,
                          "points": args.points, "sigma_ln_loss": args.sigma,
                          "sigma_group": args.sigma_group}))
        return
    d1 = [float(np.exp(vals[d])) for d in best[1]]
    m = [float(np.exp(vals[i])) for i in best[2]]
    out = {"grid_cost_flops": pb.grid_cost, "grid_width_linearised": pb.width(),
           "bound_cost_ratio": best[0], "bound_D1": d1, "bound_M": m,
           "rounded_cost_ratio": best[3], "once": once,
           "sigma_ln_loss": args.sigma, "sigma_group": args.sigma_group, "points": args.points,
           "groups": args.groups, "wall_s": round(time.time() - t0, 1)}
    print(f"full grid: {pb.grid_cost:.3g} FLOPs, linearised 90 % D* width {pb.width():.2f}")
    how = ("each candidate at most once: relaxed bound" if once else "replicates allowed") + (
        f"; branches of a stable run share noise sd {args.sigma_group:g}"
        if args.sigma_group else "")
    print(f"oracle c-optimal design with WSD branches ({how}): "
          f"{out['bound_cost_ratio']:.3f} of the grid's cost — groups at D1 = "
          f"{[f'{d:.3g}' for d in d1]}, stable runs to M = {[f'{x:.3g}' for x in m]}"
          + (f"; a once-each design of those groups reaching the width: "
             f"{out['rounded_cost_ratio']:.3f}" if once else ""))
    print(json.dumps(out))


def _parser() -> argparse.ArgumentParser:
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
    return ap


def main(argv: list[str] | None = None) -> None:
    ap = _parser()
    args = ap.parse_args(argv)
    t0 = time.time()
    if args.sigma_group < 0 or args.sigma <= 0:
        ap.error("--sigma must be > 0 and --sigma-group >= 0")
    if args.kernel_octaves is not None and (not args.any_groups or args.sigma_group <= 0
                                            or args.kernel_octaves <= 0):
        ap.error("--kernel-octaves L (L > 0) goes with --any-groups and --sigma-group")
    if args.any_groups and args.points > 14:
        ap.error("--any-groups enumerates every branch set of a stable run: at most 14 --points")
    if args.points < 2 or args.groups < 1:
        ap.error("--points must be >= 2 and --groups >= 1")
    if args.any_groups:
        _any_groups(args, t0)
        return
    pb = Problem(args.sigma, args.sigma_group, args.kernel_octaves)
    vals = np.log(np.geomspace(0.5e9, 8e9, args.points))
    _groups(args, pb, vals, args.once or args.sigma_group > 0, t0)


if __name__ == "__main__":
    main()

"""Law-driven search vs the full grid on simulated studies with a known truth (no training).

Each study draws trial losses from 000 Table 2's laws at N1 = 1e9 (sweeps.simulate: Eq. 8 with
E' = B·N1^−β + E; the from-scratch law, Eq. 3 at that size, given to both) times exp(σ·ε). Both
fit Eq. 8 with E fixed (000 §5) and bootstrap it by trial.

- the full grid: the 5 × 5 D1 × D2 grid {0.5, 1, 2, 4, 8}·1e9 (the shape of
  search_spaces/scaling_d1_d2.yaml), every trial run; its 90 % D* interval's relative width W;
- the searcher (sweeps.law_search, target dstar): candidates a 9 × 9 log grid over the same box,
  at most 25 trials, stopping when its D* interval is at most W wide.

Cost is 6·N·D FLOPs (N1 = 1e9 dense parent, N2 = 1.75·N1 active MoE): the grid's with shared
parents and WSD branches (each budget's stable phase, 90 %, trained once per D1), the searcher's
likewise (its trials are WSD branches of stable runs extended on demand, as sweeps.driver runs
them: a D1's stable run is paid up to its longest chosen D2). Prints one line per study, the
means, and a JSON line with ``token_cost_ratio`` (mean of searcher / grid cost over the studies
with a bounded grid interval) and ``coverage`` (share of studies whose searcher interval holds
the true D*).

    python bench/law_search.py [--studies 20] [--sigma 0.005] [--bootstrap 60]
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

from sweeps.law_search import Candidate, LawDesign, run_design
from sweeps.simulate import SimulatedStudy
from sweeps.spec import parse_law_block

N1 = 1e9
N2 = 1.75 * N1
DECAY = 0.1


def candidates(values, branches: bool, repeats: int = 1) -> list[Candidate]:
    out = []
    for d1 in values:
        for d2 in values:
            for rep in range(repeats):  # replicates: the same point with fresh noise
                out.append(Candidate({"D1": float(d1), "D2": float(d2)},
                                 {"parent.tokens": float(d1), "tokens": float(d2), "rep": rep},
                                 6 * N2 * d2, f"p{d1:.4g}", 6 * N1 * d1,
                                 f"b{d1:.4g}r{rep}" if branches else None,
                                 (1 - DECAY) * 6 * N2 * d2 if branches else 0.0))
    return out


def study(s: int, sigma: float, boot: int, repeats: int = 1) -> dict:
    st = SimulatedStudy(N1=N1, sigma=sigma, seed=s)
    true = st.true_d_star()

    def block(**kw):
        return parse_law_block({"law": "eq8", "target": "dstar", "scratch": st.scratch,
                                "fix": {"E": st.upcycled["E"]}, "bootstrap": boot, **kw})

    grid = LawDesign(block(ci_width=None, max_trials=25),
                     candidates(np.geomspace(0.5e9, 8e9, 5), branches=True), seed=s)
    run_design(grid, lambda c: st.loss(c.x), parallel=25)
    g = grid.estimate
    law = LawDesign(block(ci_width=g.rel_width if math.isfinite(g.rel_width) else None,
                          max_trials=25),
                    candidates(np.geomspace(0.5e9, 8e9, 9), branches=True, repeats=repeats),
                    seed=s)
    run_design(law, lambda c: st.loss(c.x, c.point["rep"]))
    e = law.estimate
    return {"study": s, "true": true, "grid": [g.lo, g.hi], "grid_width": g.rel_width,
            "grid_cost": grid.spent, "law": [e.lo, e.hi], "law_width": e.rel_width,
            "law_cost": law.spent, "law_trials": len(law.observed),
            "ratio": law.spent / grid.spent, "reached": e.rel_width <= g.rel_width,
            "bounded": math.isfinite(g.rel_width),
            "grid_covers": g.lo <= true <= g.hi, "law_covers": e.lo <= true <= e.hi}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", type=int, default=20)
    ap.add_argument("--sigma", type=float, default=0.005, help="noise sd in ln L")
    ap.add_argument("--bootstrap", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=1,
                    help="times the searcher may run one point (fresh noise each; a what-if: "
                         "the driver runs each candidate once)")
    args = ap.parse_args()
    rows = []
    t0 = time.time()
    print(f"{'study':>5} {'true D*':>9} {'grid 90% interval':>24} {'width':>6} "
          f"{'law 90% interval':>24} {'width':>6} {'trials':>6} {'cost ratio':>10}")
    for s in range(args.studies):
        r = study(s, args.sigma, args.bootstrap, args.repeats)
        rows.append(r)
        print(f"{s:>5} {r['true']:>9.3g} [{r['grid'][0]:>9.3g}, {r['grid'][1]:>9.3g}] "
              f"{r['grid_width']:>6.2f} [{r['law'][0]:>9.3g}, {r['law'][1]:>9.3g}] "
              f"{r['law_width']:>6.2f} {r['law_trials']:>6} {r['ratio']:>10.3f}", flush=True)
    bounded = [r for r in rows if r["bounded"]]
    ratio = float(np.mean([r["ratio"] for r in bounded])) if bounded else math.nan
    out = {
        "studies": len(rows), "sigma_ln_loss": args.sigma, "bootstrap": args.bootstrap,
        "repeats": args.repeats,
        "ci_level": 0.9, "token_cost_ratio": ratio,
        "token_cost_ratio_reached": float(np.mean([r["ratio"] for r in bounded if r["reached"]]))
        if any(r["reached"] for r in bounded) else None,
        "studies_bounded_grid_interval": len(bounded),
        "reached_grid_width": sum(r["reached"] for r in bounded),
        "coverage": float(np.mean([r["law_covers"] for r in rows])),
        "grid_coverage": float(np.mean([r["grid_covers"] for r in rows])),
        "law_trials_mean": float(np.mean([r["law_trials"] for r in rows])),
        "wall_s": round(time.time() - t0, 1),
    }
    print(f"searcher / grid cost (studies with a bounded grid interval, {len(bounded)}): "
          f"{ratio:.3f}; reached the grid's width in {out['reached_grid_width']}; coverage of "
          f"the true D*: searcher {out['coverage']:.2f}, grid {out['grid_coverage']:.2f}")
    print(json.dumps({k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                      for k, v in out.items()}))


if __name__ == "__main__":
    main()

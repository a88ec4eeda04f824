"""Fit time of the joint upcycling law (000 Eq. 12) with leave-one-out on 100 points.

Target (issue 6): under 10 s on 2 cores. Measured side by side in one run:
1. the default fit (128-point grid, L-BFGS-B from its 8 best points) + leave-one-out (each refit
   warm-started from the full fit);
2. the exhaustive fit (L-BFGS-B from all 128 grid points) + leave-one-out, to show what the
   grid ranking saves and that both reach the same optimum;
3. 200 bootstrap resamples, in one process vs over all cores.

    python bench/fit_speed.py [--points 100] [--repeats 3]
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

import numpy as np

from scaling.fit import fit
from scaling.laws import TABLE2, Points, get_law


def data(n: int, seed: int = 0) -> Points:
    rng = np.random.default_rng(seed)
    law = get_law("joint_upcycled")
    x = {"D1": np.exp(rng.uniform(math.log(1e9), math.log(1e12), n)),
         "D2": np.exp(rng.uniform(math.log(1e9), math.log(1e12), n)),
         "N1": np.exp(rng.uniform(math.log(1e7), math.log(1e10), n))}
    L = law.predict(TABLE2["upcycled"], x) * np.exp(rng.normal(0, 3e-3, n))
    return Points(x, L)


def timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bootstrap", type=int, default=200)
    args = ap.parse_args()
    pts = data(args.points)
    law = get_law("joint_upcycled")
    t_def, r_def = timed(lambda: fit(law, pts, loo=True), args.repeats)
    t_all, r_all = timed(lambda: fit(law, pts, loo=True, refine=None), 1)
    print(f"joint law, {args.points} points, fit + leave-one-out: default {t_def:.2f} s, "
          f"all starts {t_all:.2f} s (ratio {t_def / t_all:.3f}); objective "
          f"{r_def.objective:.6g} vs {r_all.objective:.6g}; LOO RMS {r_def.loo['rms_ln']:.4g} "
          f"vs {r_all.loo['rms_ln']:.4g} ln-loss")
    cores = os.cpu_count() or 1
    t_b1, _ = timed(lambda: fit(law, pts, fixed={"E": 0.165}, bootstrap=args.bootstrap,
                                n_jobs=1), 1)
    t_bn, rb = timed(lambda: fit(law, pts, fixed={"E": 0.165}, bootstrap=args.bootstrap,
                                 n_jobs=cores), 1)
    print(f"{args.bootstrap} bootstrap resamples (E fixed): 1 process {t_b1:.2f} s, {cores} "
          f"processes {t_bn:.2f} s (ratio {t_bn / t_b1:.3f}); α3 interval "
          f"[{rb.ci['alpha3'][0]:.3g}, {rb.ci['alpha3'][1]:.3g}]")
    print(json.dumps({
        "bench": "fit_speed", "points": args.points, "cores": cores,
        "fit_loo_s": round(t_def, 3), "fit_loo_all_starts_s": round(t_all, 3),
        "ratio_default_vs_all_starts": round(t_def / t_all, 4),
        "same_optimum": bool(abs(r_def.objective - r_all.objective)
                             <= 1e-6 * max(1.0, abs(r_all.objective))),
        "loo_rms_ln": r_def.loo["rms_ln"], "target_s": 10.0, "meets_target": t_def < 10.0,
        "bootstrap_n": args.bootstrap, "bootstrap_1proc_s": round(t_b1, 3),
        "bootstrap_nproc_s": round(t_bn, 3), "bootstrap_speedup": round(t_b1 / t_bn, 3),
    }))


if __name__ == "__main__":
    main()

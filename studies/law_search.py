"""Law-driven search vs the full grid on simulated studies with a known truth (no training).

Each study draws trial losses from 000 Table 2's laws at N1 = 1e9 (sweeps.testing.simulate: Eq. 8
with E' = B·N1^−β + E; the from-scratch law, Eq. 3 at that size, given to both) times exp(σ·ε)
(and exp(σ_g·η) shared by the trials of one WSD stable run with ``--sigma-group``; with
``--group-length`` η fades along D2 instead of being one number per stable run). Both fit
Eq. 8 with E fixed (000 §5) and bootstrap it by trial.

- the full grid: the 5 × 5 D1 × D2 grid {0.5, 1, 2, 4, 8}·1e9 (the shape of
  search_spaces/scaling_d1_d2.yaml), every trial run; its 90 % D* interval's relative width;
- the searcher (sweeps.law, target dstar): candidates a 9 × 9 log grid over the same box
  (``--d1-points``, ``--d2-points``), up to ``--max-trials`` trials. Its stopping rule is applied
  afterwards to its refit history, exactly as the live rule does (width ≤ W on ``CONFIRM``
  refits in a row, no stop before ``min_trials``; proposals do not depend on W), for two targets
  W: the grid's width in the same study (**paired**: the searcher must also beat the grid's luck
  in that noise draw) and the median grid width over all studies (**design**: the grid design's
  typical width, the issue's "the full grid's D* interval width").

Cost is 6·N·D FLOPs (N1 = 1e9 dense parent, N2 = 1.75·N1 active MoE), parents shared: the
grid's with WSD branches (each budget's stable phase, 90 %, trained once per D1); the
searcher's with branches of stable runs extended on demand (sweeps.run.driver; ``--no-branches``:
each trial trains its own budget). Prints one line per study, the means, and a JSON line with
``token_cost_ratio`` (mean searcher / grid cost to reach the design target; the cap's cost where
it never does), ``coverage`` (share of studies whose searcher interval at that stop holds the true
D*), and the same for the paired target.

The JSON line also judges the searcher's cost against the certified bound for the same noise
model and axes (``bound``: studies/law_design_bound.py ``--any-groups``, its
:func:`certified_bound`; ``ratio_to_bound``), gives ``coverage_se`` (binomial) and the grid's
coverage ± se, and, where coverage is below nominal, the factor by which widening both designs'
intervals in ln D* makes it nominal, with the cost at that width (``calibration``; docs/
intervals.md). ``--length L`` gives both designs the bootstrap whose group effect fades along
D2 (``law.length``); ``--widen F`` has both designs apply a calibrated factor live
(``law.widen``, :func:`scaling.interval.widen`, the function ``calibration`` uses); ``--out
FILE`` appends each study's row as it finishes, ``--from-rows`` summarises such files,
``--grid-only`` runs only the grid (its coverage).

    python studies/law_search.py [--studies 20] [--sigma 0.003] [--bootstrap 60] [--max-trials 40]
                                [--jobs 2] [--length L] [--widen F] [--out ROWS.jsonl]
                                [--grid-only]
    python studies/law_search.py --from-rows ROWS.jsonl [same noise flags]
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext

import numpy as np

from scaling.interval import widen
from sweeps.law.config import parse_law_block
from sweeps.law.design import CONFIRM, Candidate, LawDesign, run_design
from sweeps.testing.simulate import SimulatedStudy

N1 = 1e9
N2 = 1.75 * N1
DECAY = 0.1


def candidates(values, branches: bool, repeats: int = 1, d2_values=None) -> list[Candidate]:
    out = []
    for d1 in values:
        for d2 in (values if d2_values is None else d2_values):
            for rep in range(repeats):  # replicates: the same point with fresh noise
                out.append(Candidate({"D1": float(d1), "D2": float(d2)},
                                     {"parent.tokens": float(d1), "tokens": float(d2),
                                      "rep": rep},
                                     6 * N2 * d2, f"p{d1:.4g}", 6 * N1 * d1,
                                     f"b{d1:.4g}" if branches else None,
                                     (1 - DECAY) * 6 * N2 * d2 if branches else 0.0))
    return out


def study(s: int, args) -> dict:
    st = SimulatedStudy(N1=N1, sigma=args.sigma, seed=s, sigma_group=args.sigma_group,
                        group_length=args.group_length)

    def block(**kw):
        return parse_law_block({"law": "eq8", "target": "dstar", "scratch": st.scratch,
                                "fix": {"E": st.upcycled["E"]}, "bootstrap": args.bootstrap,
                                "ci_width": None, "noise": args.noise, "icc": args.icc,
                                "length": args.length, "widen": args.widen, **kw})

    grid = LawDesign(block(max_trials=25),
                     candidates(np.geomspace(0.5e9, 8e9, 5), branches=True), seed=s)
    run_design(grid, st.loss_of, parallel=25)
    g = grid.estimate
    row = {"study": s, "true": st.true_d_star(), "grid": [g.lo, g.hi],
           "grid_width": g.rel_width, "grid_cost": grid.spent,
           "grid_covers": bool(g.lo <= st.true_d_star() <= g.hi), "grid_value": g.value}
    if args.grid_only:
        return row
    cands = candidates(np.geomspace(0.5e9, 8e9, args.d1_points), branches=args.branches,
                       repeats=args.repeats, d2_values=np.geomspace(0.5e9, 8e9, args.d2_points))
    law = LawDesign(block(max_trials=args.max_trials), cands, seed=s)
    run_design(law, lambda c: st.loss(c.x, c.point["rep"], c.branch))
    return {**row, "history": law.history, "min_trials": law.min_trials}


def widened(value, ci, factor: float) -> list:
    """The interval ``ci`` about ``value`` with its ends moved ``factor``× as far in ln D*
    (:func:`scaling.interval.widen`, the one ``law.widen`` and ``analysis.decide --widen``
    apply: factor 1 leaves it; an end at inf stays there)."""
    return list(widen(value, ci[0], ci[1], factor))


def _rel(value, ci) -> float:
    if value is None or any(v is None for v in ci):
        return math.inf
    return (ci[1] - ci[0]) / abs(value)


def stop_at(r: dict, width: float, factor: float = 1.0) -> dict:
    """Where the searcher's live stopping rule would have stopped it for target ``width``: the
    refit that made ``CONFIRM`` narrow refits in a row (else its last refit, at the cap); its
    intervals widened by ``factor`` (:func:`widened`)."""
    narrow, hist = 0, [{**h, "ci": widened(h["value"], h["ci"], factor)} for h in r["history"]]
    for h in hist:
        w = _rel(h["value"], h["ci"])
        narrow = narrow + 1 if h["trials"] >= r["min_trials"] and w <= width else 0
        if narrow >= CONFIRM:
            return {**h, "reached": True}
    return {**hist[-1], "reached": False}


def summarise(rows: list[dict], key: str) -> dict:
    ok = [r for r in rows if math.isfinite(r[key + "_target"])]
    if not ok:
        return {"token_cost_ratio": None, "coverage": None, "reached": 0, "studies": 0}
    cov = float(np.mean([_covers(r[key], r["true"]) for r in ok]))
    return {"token_cost_ratio": float(np.mean([r[key]["flops"] / r["grid_cost"] for r in ok])),
            "coverage": cov, "coverage_se": math.sqrt(cov * (1 - cov) / len(ok)),
            "reached": sum(r[key]["reached"] for r in ok), "studies": len(ok),
            "trials_mean": float(np.mean([r[key]["trials"] for r in ok]))}


def _covers(h: dict, true: float) -> bool:
    # an end is None only when it is +inf (no crossing in that resample: upcycling wins throughout)
    lo, hi = (math.inf if v is None else v for v in h["ci"])
    return lo <= true <= hi


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", type=int, default=20)
    ap.add_argument("--sigma", type=float, default=0.003, help="noise sd in ln L")
    ap.add_argument("--sigma-group", type=float, default=0.0,
                    help="noise sd in ln L shared by the trials of one WSD stable run")
    ap.add_argument("--group-length", type=float, default=None,
                    help="octaves of D2 over which the shared noise fades "
                         "(sweeps.testing.simulate's "
                         "group_length; findings §10 fits 2.73); default: the same for the "
                         "whole group")
    ap.add_argument("--bootstrap", type=int, default=60)
    ap.add_argument("--noise", choices=("groups", "trials"), default="groups",
                    help="law.noise of both designs: the parametric bootstrap that keeps a "
                         "stable run's shared noise (default), or resampling trials")
    ap.add_argument("--icc", type=float, default=None,
                    help="law.icc of both designs (default: estimated at each refit)")
    ap.add_argument("--length", type=float, default=None,
                    help="law.length of both designs: the bootstrap's group effect fades along "
                         "D2, correlation exp(-d^2/2L^2) at d octaves (default: the same for "
                         "the whole group)")
    ap.add_argument("--widen", type=float, default=1.0,
                    help="law.widen of both designs: their intervals widened this many times in "
                         "ln D* about the estimate before the stopping rule (a calibration "
                         "factor this study printed; default 1); calibration is then on top")
    ap.add_argument("--repeats", type=int, default=1,
                    help="times the searcher may run one point (fresh noise each; a what-if: "
                         "the driver runs each candidate once)")
    ap.add_argument("--branches", action=argparse.BooleanOptionalAction, default=True,
                    help="the searcher's trials are WSD branches of stable runs extended on "
                         "demand (as sweeps.run.driver runs them)")
    ap.add_argument("--d1-points", type=int, default=9)
    ap.add_argument("--d2-points", type=int, default=9)
    ap.add_argument("--max-trials", type=int, default=40)
    ap.add_argument("--start", type=int, default=0,
                    help="index of the first study (its seed): split a long run over processes")
    ap.add_argument("--out", default=None,
                    help="append each study's row to this JSON-lines file as it finishes (a run "
                         "cut short keeps what it finished; --from-rows summarises such files)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="studies run side by side in this many processes (each study is "
                         "seeded by its index, so the rows do not depend on it)")
    ap.add_argument("--grid-only", action="store_true",
                    help="only the full grid's design (its coverage, ~1/15 of a study's cost)")
    ap.add_argument("--from-rows", nargs="+", default=None, metavar="JSONL",
                    help="summarise rows written by --out instead of running studies (give the "
                         "same noise flags: they set the bound)")
    ap.add_argument("--no-bound", action="store_true",
                    help="skip the certified bound (studies/law_design_bound.py --any-groups)")
    return ap


def main(argv: list[str] | None = None) -> dict:
    args = _parser().parse_args(argv)
    t0 = time.time()
    rows = _read_rows(args.from_rows) if args.from_rows else _run(args)
    out = report(rows, args)
    out["wall_s"] = round(time.time() - t0, 1)
    print(json.dumps(out, default=lambda v: None))
    return out


def _read_rows(paths: list[str]) -> list[dict]:
    rows = {}
    for p in paths:
        with (gzip.open(p, "rt") if p.endswith(".gz") else open(p)) as f:  # committed: .gz
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    rows.setdefault(r["study"], r)  # a study run twice counts once
    return [rows[k] for k in sorted(rows)]


def _run(args) -> list[dict]:
    rows = []
    with ProcessPoolExecutor(args.jobs) if args.jobs > 1 else nullcontext() as pool:
        seeds = range(args.start, args.start + args.studies)
        done = (pool.map(study, seeds, [args] * args.studies) if pool else
                (study(s, args) for s in seeds))
        for r in done:
            rows.append(r)
            _progress(r)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(r, default=lambda v: None) + "\n")
    return rows


def _settings(args, rows: list[dict]) -> dict:
    return {"studies": len(rows), "sigma_ln_loss": args.sigma, "sigma_group": args.sigma_group,
            "group_length": args.group_length, "bootstrap": args.bootstrap, "noise": args.noise,
            "icc": args.icc, "length": args.length, "widen": args.widen,
            "repeats": args.repeats,
            "branches": args.branches, "d1_points": args.d1_points,
            "d2_points": args.d2_points, "max_trials": args.max_trials, "ci_level": 0.9}


def report(rows: list[dict], args) -> dict:
    """The summary (printed) and the JSON line's dict: the grid's coverage, and with the
    searcher's rows its cost, the certified bound, coverage and the calibrated widening."""
    grid = _share([r["grid_covers"] for r in rows])
    out = {**_settings(args, rows), "grid_coverage": grid[0], "grid_coverage_se": grid[1],
           "grid_studies": len(rows)}
    gcal = calibrate(rows, None, searcher=False)
    out["grid_calibration"] = gcal
    print(f"grid: 90 % D* intervals held the truth in {grid[0]:.3f} ± {grid[1]:.3f} of "
          f"{len(rows)} studies" + (f"; widened ×{gcal['factor']:g} in ln D*: "
                                    f"{gcal['grid_coverage']:.3f}" if gcal["factor"] != 1 else ""))
    searched = [r for r in rows if "history" in r]
    if len(searched) < len(rows):
        out["studies"] = len(searched)
    if not searched:
        out.update(token_cost_ratio=None, bound=None, ratio_to_bound=None, coverage=None,
                   coverage_se=None)
        return out
    design_w = _table(searched, args)
    design, paired = summarise(searched, "design"), summarise(searched, "paired")
    bound, w_lin = (None, None) if args.no_bound else _bound(args)
    cal = calibrate(searched, bound)
    lin = None
    if w_lin is not None:  # the width the bound is computed for: the like-for-like judgement
        for r in searched:
            r["linearised_target"], r["linearised"] = w_lin, stop_at(r, w_lin)
        lin = {**summarise(searched, "linearised"), "width": w_lin}
        lin["ratio_to_bound"] = None if lin["token_cost_ratio"] is None or not bound else \
            lin["token_cost_ratio"] / bound
    out.update({"grid_width_median": design_w if math.isfinite(design_w) else None,
                "token_cost_ratio": design["token_cost_ratio"], "bound": bound,
                "ratio_to_bound": None if bound is None or design["token_cost_ratio"] is None
                else design["token_cost_ratio"] / bound,
                "coverage": design["coverage"], "coverage_se": design.get("coverage_se"),
                "reached_design_width": design["reached"], "design": design, "paired": paired,
                "calibration": cal, "at_linearised_width": lin})
    print(f"(* the cap of {args.max_trials} trials came first)\nsearcher / grid cost to the "
          f"grid design's median width {design_w:.2f}: {_num(design['token_cost_ratio'])} "
          f"(reached in {design['reached']} of {design['studies']}, coverage "
          f"{_num(design['coverage'])} ± {_num(design.get('coverage_se'))}); certified bound "
          f"{_num(bound)} (ratio {_num(out['ratio_to_bound'])}); to each study's own grid "
          f"width: {_num(paired['token_cost_ratio'])} (reached in {paired['reached']} of "
          f"{paired['studies']}, coverage {_num(paired['coverage'])})")
    if lin is not None:
        print(f"to the grid's linearised width {w_lin:.2f} (the bound's): "
              f"{_num(lin['token_cost_ratio'])}× the grid's cost, {_num(lin['ratio_to_bound'])}× "
              f"the bound (reached in {lin['reached']} of {lin['studies']}), coverage "
              f"{_num(lin['coverage'])} ± {_num(lin.get('coverage_se'))}")
    if cal["factor"] not in (1, None):
        print(f"coverage below nominal: intervals widened ×{cal['factor']:g} in ln D* (both "
              f"designs, calibrated on these {len(searched)} studies) hold the truth in "
              f"{cal['coverage']:.3f} ± {cal['coverage_se']:.3f} at "
              f"{_num(cal['token_cost_ratio'])}× the grid's cost (ratio to the bound "
              f"{_num(cal['ratio_to_bound'])})")
    return out


def _share(hits: list[bool]) -> tuple[float | None, float | None]:
    if not hits:
        return None, None
    p = float(np.mean(hits))
    return p, math.sqrt(p * (1 - p) / len(hits))


FACTORS = tuple(round(1 + 0.05 * i, 2) for i in range(41))
"""Widening factors tried, 1 … 3 in ln D*."""


def calibrate(rows: list[dict], bound: float | None, level: float = 0.9,
              searcher: bool = True) -> dict:
    """The smallest factor (:data:`FACTORS`) by which widening both designs' intervals in
    ln D* (:func:`widened`) brings the searcher's coverage (``searcher``; else the grid's) to
    ``level``; the searcher stops later, at the widened grid's median width, and its cost
    is recomputed. Factor 1: already nominal."""
    searched = searcher and rows and all("history" in r for r in rows)
    res = {}
    for c in FACTORS:
        g = [widened(r.get("grid_value"), r["grid"], c) for r in rows]
        gcov = _share([lo is not None and lo <= r["true"] <= (math.inf if hi is None else hi)
                       for r, (lo, hi) in zip(rows, g)])
        res = {"factor": c, "grid_coverage": gcov[0], "grid_coverage_se": gcov[1]}
        if not searched:
            if gcov[0] is not None and gcov[0] >= level:
                return res
            continue
        w = float(np.median([_rel(r.get("grid_value"), gi) for r, gi in zip(rows, g)]))
        if not math.isfinite(w):  # most grid intervals unbounded: no width to stop at
            return {**res, "factor": None, "reached": False}
        hits, cost = [], []
        for r in rows:
            h = stop_at(r, w, c)
            hits.append(_covers(h, r["true"]))
            cost.append(h["flops"] / r["grid_cost"])
        cov = _share(hits)
        res.update(coverage=cov[0], coverage_se=cov[1], token_cost_ratio=float(np.mean(cost)),
                   ratio_to_bound=None if bound is None else float(np.mean(cost)) / bound)
        if cov[0] >= level:
            return res
    return {**res, "reached": False}


def _bound(args) -> tuple[float | None, float | None]:
    """studies/law_design_bound.py's certified bound for this noise model and these axes, and
    the grid's linearised 90 % D* width it is computed for."""
    if args.d1_points != args.d2_points or args.d1_points > 14 or args.repeats != 1:
        return None, None  # the bound enumerates square axes of ≤ 14 points, each point once
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "law_design_bound", Path(__file__).with_name("law_design_bound.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    length = args.group_length if args.sigma_group > 0 else None
    b = mod.certified_bound(args.sigma, args.sigma_group, length, args.d1_points)
    return float(b["bound_cost_ratio"]), float(b["grid_width_linearised"])


def _table(rows: list[dict], args) -> float:
    design_w = float(np.median([r["grid_width"] for r in rows]))
    print(f"\n{'study':>5} {'true D*':>9} {'grid width':>10} | paired: {'interval':>22} "
          f"{'trials':>6} {'cost':>6} | design (W = {design_w:.2f}): {'interval':>22} "
          f"{'trials':>6} {'cost':>6}")
    for r in rows:
        r["paired_target"], r["design_target"] = r["grid_width"], design_w
        r["paired"], r["design"] = stop_at(r, r["grid_width"]), stop_at(r, design_w)
        p, d = r["paired"], r["design"]
        print(f"{r['study']:>5} {r['true']:>9.3g} {r['grid_width']:>10.2f} | "
              f"{_fmt(p['ci']):>30} {p['trials']:>6} {p['flops'] / r['grid_cost']:>6.3f}"
              f"{'' if p['reached'] else '*'} | {_fmt(d['ci']):>43} {d['trials']:>6} "
              f"{d['flops'] / r['grid_cost']:>6.3f}{'' if d['reached'] else '*'}")
    return design_w


def _progress(r: dict) -> None:
    widths = [None if h["rel_width"] is None else round(h["rel_width"], 2)
              for h in r.get("history", [])]
    print(f"study {r['study']:>2}: grid [{r['grid'][0]:.3g}, {r['grid'][1]:.3g}] width "
          f"{r['grid_width']:.2f}; searcher widths by refit {widths}", flush=True)


def _fmt(ci) -> str:
    return "[" + ", ".join("inf" if v is None else f"{v:.3g}" for v in ci) + "]"


def _num(v) -> str:
    return "n/a" if v is None else f"{v:.3f}"


if __name__ == "__main__":
    main()

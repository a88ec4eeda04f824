"""Command lines of the analysis package and their shared error contract.

- ``python -m analysis.fit DATA --law NAME ...``: :func:`fit_main`;
- ``python -m analysis.derived {dstar,optimal,advice,cost} ...``: :func:`derived_main`;
- ``python -m analysis.decide RESULTS ...``: :func:`decide_main`;
- ``python -m analysis.report`` (:func:`analysis.report.main`) uses the same contract.

Every one of them turns a :class:`~moe_core.errors.FitError` (bad data, a bad flag, a fit that
cannot run) into one line ``error: ...`` on stderr and exit status 2 (:func:`one_line_errors`);
argparse's own usage errors exit 2 as well.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from analysis.data import load_points
from analysis.decide import (
    DEFAULT_TFLOPS,
    check_interval_args,
    decide,
    load_decision_data,
)
from analysis.decide.plan import add_plan_args, plan_main
from analysis.derived import (
    compute_optimal,
    d_star_approx,
    d_star_solve,
    expert_upcycling_cost,
    skywork_advice,
)
from analysis.noise import format_noise, read_noise
from moe_core.errors import FitError, cli_boundary
from scaling.fit import DEFAULT_DELTA, FitResult, fit
from scaling.laws import TABLE2, get_law
from sweeps.law.limits import MAX_BOOTSTRAP

ERROR_EXIT = 2


def error_line(e: BaseException | str) -> str:
    """``error: <message>`` on one line (a multi-line message is joined with spaces)."""
    return "error: " + " ".join(str(e).splitlines())


one_line_errors: Callable[[Callable[..., int]], Callable[..., int]] = cli_boundary(
    kept="the inputs are unchanged")
"""Wrap a command's ``main``: a FitError (and any input error: ValueError, KeyError,
OSError) becomes one line on stderr and exit status 2 (``moe_core.errors.cli_boundary``)."""


def check_numbers(args: argparse.Namespace, names: Sequence[str]) -> None:
    """Numeric flags are finite, and ``--bootstrap`` at most the cap (one line naming it)."""
    for n in names:
        v = getattr(args, n, None)
        if isinstance(v, float) and not math.isfinite(v):
            raise FitError(f"--{n.replace('_', '-')} {v}: not finite; give a number")
    b = getattr(args, "bootstrap", None)
    if b is not None and not 0 <= b <= MAX_BOOTSTRAP:
        raise FitError(f"--bootstrap {b}: must lie in [0, {MAX_BOOTSTRAP:,}] (the cap; 200 to "
                       "1,000 resamples give stable intervals)")


def _kv(items: Sequence[str], flag: str, numeric: bool) -> dict[str, Any]:
    """``NAME=VALUE`` flags (repeated or comma-separated) as a dict, numbers when ``numeric``."""
    out: dict[str, Any] = {}
    for item in items:
        for part in item.split(","):
            if not part:
                continue
            if "=" not in part:
                raise FitError(f"{flag} {part!r}: expected NAME=VALUE")
            k, v = part.split("=", 1)
            if numeric:
                try:
                    out[k.strip()] = float(v)
                except ValueError:
                    raise FitError(f"{flag} {part!r}: {v!r} is not a number") from None
                if not math.isfinite(out[k.strip()]):
                    raise FitError(f"{flag} {part!r}: {v!r} is not finite; give a number")
            else:
                out[k.strip()] = v.strip()
    return out


# ---- python -m analysis.fit -----------------------------------------------------------------


def _fit_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m analysis.fit",
        description="Fit a scaling law of the seeds to sweep results or any CSV/Parquet.")
    ap.add_argument("data", help="results directory, results.parquet, or a CSV/Parquet file")
    ap.add_argument("--law", required=True,
                    help="law name, or several separated by commas to compare them")
    ap.add_argument("--fix", action="append", default=[], metavar="NAME=VALUE",
                    help="hold a parameter fixed, e.g. --fix E=0.165 (000 §5)")
    ap.add_argument("--columns", action="append", default=[], metavar="VAR=COLUMN",
                    help="map law variables and L to columns, e.g. N=params,D=tokens,L=loss")
    ap.add_argument("--where", action="append", default=[], metavar="COLUMN=VALUE",
                    help="keep only rows with this value, e.g. --where kind=upcycled")
    ap.add_argument("--curves", action="store_true",
                    help="fit every eval of every trial instead of each trial's final eval")
    ap.add_argument("--include-pruned", action="store_true",
                    help="fit pruned trials too (a health rule stopped them; left out by default)")
    ap.add_argument("--loo", action="store_true", help="leave-one-out RMS (000 Table 1)")
    ap.add_argument("--bootstrap", type=int, default=0, metavar="N",
                    help="bootstrap N resamples for confidence intervals")
    ap.add_argument("--ci", type=float, default=0.95, help="interval level (default 0.95)")
    ap.add_argument("--delta", type=float, default=DEFAULT_DELTA, help="Huber δ (default 1e-3)")
    ap.add_argument("--max-starts", type=int, default=128, help="initialisation grid size cap")
    ap.add_argument("--refine", type=int, default=8,
                    help="optimise from this many best grid points (0: from all of them)")
    ap.add_argument("--jobs", type=int, default=None, help="bootstrap processes (default: cores)")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    return ap


def _fit_all(args: argparse.Namespace) -> list[FitResult]:
    fixed = _kv(args.fix, "--fix", True)
    columns = _kv(args.columns, "--columns", False)
    where = _kv(args.where, "--where", False)
    results = []
    for name in [n.strip() for n in args.law.split(",") if n.strip()]:
        law = get_law(name)
        pts = load_points(args.data, law, columns=columns, curves=args.curves, where=where,
                          include_pruned=args.include_pruned)
        fx = {k: v for k, v in fixed.items() if k in law.param_names}
        results.append(fit(law, pts, fixed=fx, delta=args.delta, loo=args.loo,
                           bootstrap=args.bootstrap, ci_level=args.ci,
                           max_starts=args.max_starts, refine=args.refine or None,
                           n_jobs=args.jobs))
    return results


@one_line_errors
def fit_main(argv: Sequence[str] | None = None) -> int:
    """``python -m analysis.fit``."""
    args = _fit_parser().parse_args(argv)
    check_numbers(args, ("ci", "delta"))
    results = _fit_all(args)
    if not args.json:
        _print_fits(results, args)
    elif len(results) == 1:
        print(json.dumps(results[0].to_dict()))
    else:
        key = (lambda r: r.loo["rms_ln"]) if args.loo else (lambda r: r.rms_ln)
        print(json.dumps({"fits": {r.law: r.to_dict() for r in results},
                          "best": min(results, key=key).law,
                          "by": "loo_rms" if args.loo else "rms"}))
    return 0


def _fit_table(r: FitResult, ci: float):
    from rich.table import Table

    law = get_law(r.law)
    t = Table(title=f"{r.law}: {law.equation}   ({law.source}; {r.n} points, "
                    f"{r.starts} starts, {r.fit_s:.2f} s)")
    t.add_column("param")
    t.add_column("value", justify="right")
    if r.ci:
        t.add_column(f"{ci:.0%} interval", justify="right")
    for k, v in r.params.items():
        row = [k + (" (fixed)" if k in r.fixed else ""), f"{v:.5g}"]
        if r.ci:
            lo, hi = r.ci[k]
            row.append(f"[{lo:.5g}, {hi:.5g}]")
        t.add_row(*row)
    return t


def _comparison_table(results: list[FitResult]):
    from rich.table import Table

    t = Table(title="comparison (000 Table 1)")
    for c in ("law", "params", "RMS (ln)", "LOO RMS (nats)", "LOO RMS (ln)"):
        t.add_column(c)
    best = min(results, key=lambda r: r.loo["rms_ln"] if r.loo else r.rms_ln)
    for r in results:
        t.add_row(r.law + (" *" if r is best else ""), str(len(r.params) - len(r.fixed)),
                  f"{r.rms_ln:.4g}",
                  f"{r.loo['rms_nats']:.4g}" if r.loo else "—",
                  f"{r.loo['rms_ln']:.4g}" if r.loo else "—")
    return t


def _print_fits(results: list[FitResult], args: argparse.Namespace) -> None:
    from rich.console import Console

    con = Console()
    for r in results:
        con.print(_fit_table(r, args.ci))
        if r.at_bounds:
            con.print(f"[yellow]on a bound of the fit (not identified by these data; fix with "
                      f"--fix): {', '.join(r.at_bounds)}[/yellow]")
        line = f"RMS: {r.rms_nats:.4g} nats, {r.rms_ln:.4g} ln-loss"
        if r.loo:
            line += (f"   leave-one-out RMS: {r.loo['rms_nats']:.4g} nats, "
                     f"{r.loo['rms_ln']:.4g} ln-loss")
        con.print(line)
    if len(results) > 1:
        con.print(_comparison_table(results))


# ---- python -m analysis.derived -------------------------------------------------------------


def _params(path: str | None, default: dict[str, float]) -> dict[str, float]:
    """Parameters from ``python -m analysis.fit ... --json`` output (or 000 Table 2)."""
    if path is None:
        return dict(default)
    d = json.loads(Path(path).read_text())
    return dict(d.get("params", d))


def _derived_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m analysis.derived",
        description="Decisions from fitted laws (default: 000 Table 2's published parameters; "
                    "pass your own with --upcycled/--moe FILE, the JSON of analysis.fit --json).")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("dstar", help="D*: where from-scratch MoE catches up (000 Eq. 13, Eq. 2)")
    p.add_argument("--n1", type=float, required=True, help="dense non-embedding parameters")
    p.add_argument("--upcycled", help="joint_upcycled fit (JSON)")
    p.add_argument("--moe", help="chinchilla fit of from-scratch MoE vs N1 (JSON)")
    p = sub.add_parser("optimal", help="compute-optimal D2 and N1 (000 Eq. 14, App. F.3)")
    p.add_argument("--d1", type=float, required=True, help="dense tokens already spent")
    p.add_argument("--c2", type=float, required=True, help="upcycling FLOPs budget")
    p.add_argument("--upcycled", help="joint_upcycled fit (JSON)")
    p = sub.add_parser("advice", help="Skywork rules of thumb (002 §3.3)")
    p.add_argument("--c-moe", type=float, required=True, help="MoE training budget")
    p.add_argument("--c-dense", type=float, required=True, help="the dense checkpoint's cost")
    p = sub.add_parser("cost", help="GPU-hours of expert upcycling at τ (003 Eq. 1–2)")
    p.add_argument("--T", dest="T", type=float, required=True, help="total steps")
    p.add_argument("--tau", type=float, required=True, help="transition step")
    p.add_argument("--s-e", dest="s_E", type=float, required=True, help="s/step, E experts")
    p.add_argument("--s-me", dest="s_mE", type=float, required=True, help="s/step, mE experts")
    p.add_argument("--gpus", type=int, default=1)
    return ap


@one_line_errors
def derived_main(argv: Sequence[str] | None = None) -> int:
    """``python -m analysis.derived``."""
    args = _derived_parser().parse_args(argv)
    check_numbers(args, ("n1", "d1", "c2", "c_moe", "c_dense", "T", "tau", "s_E", "s_mE"))
    if args.cmd == "dstar":
        upc = _params(args.upcycled, TABLE2["upcycled"])
        moe = _params(args.moe, TABLE2["moe"])
        # every crossing, or which path wins on the whole range: never Infinity (not JSON)
        out = {"N1": args.n1, **d_star_solve(moe, upc, args.n1).to_dict(),
               "d_star_eq2": d_star_approx(args.n1)}
    elif args.cmd == "optimal":
        c = compute_optimal(_params(args.upcycled, TABLE2["upcycled"]), args.d1, args.c2)
        out = {"D1": args.d1, "C2": args.c2, **c.__dict__}
    elif args.cmd == "advice":
        out = skywork_advice(args.c_moe, args.c_dense).__dict__
    else:
        c = expert_upcycling_cost(args.T, args.tau, args.s_E, args.s_mE, args.gpus)
        out = {**c.__dict__, "saving_frac": c.saving_frac}
    print(json.dumps(out, default=float, allow_nan=False))
    return 0


# ---- python -m analysis.decide --------------------------------------------------------------


def _decide_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m analysis.decide",
        description="Should I upcycle? Upcycling vs training the MoE from scratch, with "
                    "bootstrap intervals, from a D1 × D2 sweep and from-scratch runs (000 §5).")
    ap.add_argument("results", nargs="?", default=None,
                    help="the D1 × D2 sweep's results (directory, Parquet or CSV)")
    ap.add_argument("--baseline", default=None,
                    help="from-scratch MoE runs (default: rows of kind moe in RESULTS)")
    add_plan_args(ap)
    ap.add_argument("--n1", type=float, default=None, help="dense parameters (default: data's)")
    ap.add_argument("--d1", type=float, default=None,
                    help="dense tokens already spent (default: the data's largest D1)")
    b = ap.add_mutually_exclusive_group()
    b.add_argument("--budget-tokens", type=float, default=None, metavar="D2",
                   help="tokens to spend on the MoE (default: the data's largest D2)")
    b.add_argument("--budget-flops", type=float, default=None, metavar="C",
                   help="FLOPs to spend on the MoE (D2 = C / (6·N2))")
    ap.add_argument("--gpu-tflops", type=float, default=None,
                    help="sustained TFLOP/s per GPU (default: sweeps/plan/throughput.json's "
                         "measured entries for --gpu, else 35%% of its bf16 peak; 000 App. A "
                         f"assumed {DEFAULT_TFLOPS:g})")
    ap.add_argument("--gpu", default="h100", help="GPU type of the cost (h100, h200, a100, l4...)")
    ap.add_argument("--price", type=float, default=None, metavar="$/GPU-h",
                    help="price of a GPU-hour, for the cost of each path")
    ap.add_argument("--bootstrap", type=int, default=200, help="bootstrap fits")
    ap.add_argument("--noise", choices=("trials", "groups", "fading"), default="trials",
                    help="trials: resample trials (default); groups: parametric resamples in "
                         "which a parent's / WSD stable run's trials share part of their noise; "
                         "fading: that shared part fades along D2 over --length octaves")
    ap.add_argument("--length", type=float, default=None,
                    help="with --noise fading: octaves of D2 over which the shared noise fades "
                         "(python -m analysis.noise fits it)")
    ap.add_argument("--icc", type=float, default=None,
                    help="with --noise groups: the shared share of a trial's noise variance "
                         "(python -m analysis.noise measures it); default: estimated")
    ap.add_argument("--widen", type=_widen_arg, default="auto", metavar="F",
                    help="widen the D* interval F times about D* in ln D* (a calibrated factor: "
                         "studies/law_search.py's calibration); default auto: the committed "
                         "studies' factor for --noise (trials 1, groups 1.55, fading 1.35)")
    ap.add_argument("--ci", type=float, default=0.9, help="interval level (default 0.9)")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    return ap


def _widen_arg(v: str) -> float | str:
    """``--widen``: ``auto`` or a number."""
    if v == "auto":
        return v
    try:
        return float(v)
    except ValueError:
        raise FitError(f"--widen {v}: use auto or a number >= 1") from None


@one_line_errors
def decide_main(argv: Sequence[str] | None = None) -> int:
    """``python -m analysis.decide``."""
    args = _decide_parser().parse_args(argv)
    check_numbers(args, ("n1", "d1", "budget_tokens", "budget_flops", "gpu_tflops", "price",
                         "ci", "icc", "widen"))
    if args.plan:
        return plan_main(args)
    if args.results is None:
        raise FitError("give RESULTS (a D1 × D2 sweep), or --plan --from-pretrained DIR "
                       "--budget-tokens D2 for the proxy experiment that makes one")
    if not 0 < args.ci < 1:
        raise FitError(f"--ci {args.ci}: must lie in (0, 1)")
    if args.icc is not None and (args.noise == "trials" or not 0 <= args.icc <= 1):
        raise FitError(f"--icc {args.icc}: give it with --noise groups or fading, in [0, 1]")
    check_interval_args(args.noise, args.length, args.widen)  # before the data is read
    if args.price is not None and args.price < 0:
        raise FitError(f"--price {args.price}: must be >= 0 (per GPU-hour)")
    if args.gpu_tflops is not None and not args.gpu_tflops > 0:
        raise FitError(f"--gpu-tflops {args.gpu_tflops}: must be > 0")
    data = load_decision_data(args.results, args.baseline)
    r = decide(data, n1=args.n1, d1=args.d1, budget_tokens=args.budget_tokens,
               budget_flops=args.budget_flops, gpu_tflops=args.gpu_tflops, price=args.price,
               gpu=args.gpu,
               bootstrap=args.bootstrap, ci=args.ci, noise=args.noise, icc=args.icc,
               length=args.length, measured=_measured_noise(args.results), widen=args.widen)
    if args.json:
        print(json.dumps(r.to_dict(), allow_nan=False))
    else:
        print("\n".join(r.lines()))
    return 0


def _measured_noise(results):
    """The results' noise structure from their seed replicates (None: none to measure)."""
    try:
        return read_noise(results)
    except FitError:
        return None


# ---- python -m analysis.noise ---------------------------------------------------------------


def _noise_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m analysis.noise",
        description="Seed-to-seed noise of ln L in a sweep run with several seeds, and the share "
                    "of it that trials of one parent / WSD stable run have in common.")
    ap.add_argument("results", help="a sweep's results (directory, Parquet or CSV) with 2+ seeds")
    ap.add_argument("--point", default="D1,D2",
                    help="columns that identify a configuration apart from its seed "
                         "(default D1,D2)")
    ap.add_argument("--group", default="parent_key",
                    help="column whose equal values share noise (default parent_key: one "
                         "parent and its WSD stable run per D1 and seed)")
    ap.add_argument("--axis", default="D2",
                    help="column along which to report correlation by distance, in octaves "
                         "(default D2)")
    ap.add_argument("--metric", default="val_loss")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    return ap


@one_line_errors
def noise_main(argv: Sequence[str] | None = None) -> int:
    """``python -m analysis.noise``."""
    args = _noise_parser().parse_args(argv)
    point = tuple(p.strip() for p in args.point.split(",") if p.strip())
    n = read_noise(args.results, point=point, group=args.group, axis=args.axis,
                   metric=args.metric)
    if args.json:
        print(json.dumps(n.to_dict(), allow_nan=False))
    else:
        print("\n".join(format_noise(n)))
    return 0

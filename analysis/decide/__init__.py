"""Should I upcycle? The decision the fitted laws imply, with bootstrap intervals (000 §5).

From a D1 × D2 sweep of upcycled trials (the upcycled law) and from-scratch MoE runs (the
from-scratch law), fitted together with E shared (000 §5, :func:`scaling.fit.fit_shared`):

- the predicted loss of upcycling a dense model of N1 parameters trained on D1 tokens for D2 more
  tokens, and of training the same MoE from scratch on the same D2 tokens, each with an interval;
- D* (000 Eq. 13) with an interval, every crossing of the two laws, or which path wins on the
  whole range when they do not cross;
- the probability that upcycling wins: the share of bootstrap fits in which it does;
- the compute-optimal split of an upcycling budget C2 between D2 and N1 (000 Eq. 14, App. F.3;
  it needs Eq. 12, so data over several dense sizes);
- GPU-hours and cost of each path (000 App. A: 6·N·D FLOPs at a sustained TFLOP/s), and the
  from-scratch tokens that match the upcycled loss;
- which inputs lie beyond the data (extrapolated).

Intervals resample trials (each data set's on its own), never rows. Data: one model size gives
Eq. 8 in (D1, D2) and Eq. 3 at that size (``chinchilla_d``); several dense sizes give Eq. 12 and
Eq. 3 against N1. The baseline runs come from ``--baseline RESULTS`` or, without it, from the
rows of kind ``moe`` (no parent) in RESULTS itself.

``python -m analysis.decide RESULTS [--baseline B] [--json] [--n1 N] [--d1 D]
[--budget-tokens D2 | --budget-flops C] [--gpu-tflops X --price $/GPU-h]``
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.data import final_evals, load_points, read_table
from analysis.decide.extrapolation import describe_outside, outside_factor
from analysis.decide.labels import MAX_EXTRAPOLATION, format_decision  # noqa: F401
from analysis.decide.result import Decision
from analysis.derived import compute_optimal, flops_6nd, gpu_hours
from moe_core.errors import FitError
from scaling.bootstrap import bootstrap_shared, group_noise_bootstrap_shared
from scaling.crossing import sign_changes
from scaling.fit import fit_shared
from scaling.interval import AUTO, MAX_WIDEN, noise_model_name, resolve_widen
from scaling.interval import widen as widen_interval
from scaling.laws import Points, get_law
from sweeps.plan.cost import sustained_tflops

D_RANGE = (1e3, 1e17)
"""Tokens over which D* is searched (000 Eq. 13)."""
DEFAULT_TFLOPS = 400.0
"""000 App. A's sustained TFLOP/s per GPU (no longer the default: see :func:`_rate`)."""
DEFAULT_GPU = "h100"
"""How far beyond its data (a factor on any input, ``analysis.decide.extrapolation``) a fitted
law's prediction is still printed as a number: the laws are fitted over about one decade of
tokens, and past another decade the 90 % interval spans orders of magnitude (1e11 tokens on a
6.6e5-token proxy grid: "152.2 [0.0067, 4915]" nats). Beyond it the text says "not meaningful
beyond 10×"; ``--json`` keeps the numbers, flagged in ``limits``."""


def _rate(gpu_tflops: float | None, gpu: str) -> tuple[float, str]:
    """Sustained TFLOP/s of one GPU and where it comes from: the caller's ``--gpu-tflops``, else
    the throughput table's measured entries for ``gpu`` or its stated MFU assumption
    (``sweeps.plan.cost.sustained_tflops``, the same table ``--dry-run``'s forecast uses)."""
    if gpu_tflops is not None:
        return float(gpu_tflops), "given (--gpu-tflops)"
    return sustained_tflops(gpu)


@dataclass(frozen=True)
class DecisionData:
    """The points of both laws and what the data cover."""

    upcycled: Points
    scratch: Points
    joint: bool
    """Several dense sizes: Eq. 12 and Eq. 3 against N1; otherwise one size."""
    N1: float
    N2: float
    ranges: dict[str, tuple[float, float]]
    groups: tuple[tuple[str | None, ...], tuple[str | None, ...]] = ((), ())
    """Each point's noise group in (upcycled, scratch): an upcycled trial's parent (with its
    WSD stable run), a from-scratch trial's stable run (branched trials of one seed); None:
    on its own. Used by ``noise="groups"``."""

    @property
    def laws(self) -> tuple[str, str]:
        return ("joint_upcycled", "chinchilla") if self.joint else ("upcycled_mul",
                                                                     "chinchilla_d")


def _num(df, col: str) -> np.ndarray:
    import pandas as pd

    return pd.to_numeric(df[col], errors="coerce").to_numpy(float)


def _name(data: Any, default: str) -> str:
    """A path's name for a message; ``default`` for a DataFrame."""
    return default if hasattr(data, "columns") else str(data)


def _refuse_non_finite(df, cols: tuple[str, ...], where: Any) -> None:
    """A decision extrapolates to the data's ranges: one infinite or NaN D2 (or loss) would
    answer with confidence from nothing. Refused in one line."""
    for c in cols:
        if c not in df.columns:
            continue
        v = _num(df, c)
        bad = int((~np.isfinite(v)).sum())
        if bad:
            raise FitError(f"{where}: {bad} trial(s) have a non-finite {c} "
                           f"({v[~np.isfinite(v)][0]}); fix or remove them before deciding")


def load_decision_data(results, baseline=None) -> DecisionData:
    """Upcycled (dense → MoE) trials' final evals from ``results``; from-scratch MoE runs from
    ``baseline``, or the rows of kind ``moe`` without a parent in ``results``."""
    df = final_evals(read_table(results) if not hasattr(results, "columns") else results)
    up = df[(df.get("kind") == "upcycled")] if "kind" in df.columns else df.iloc[:0]
    if "upcycle.method" in up.columns:
        up = up[up["upcycle.method"].astype(str) == "dense_to_moe"]
    if baseline is not None:
        bdf = final_evals(read_table(baseline) if not hasattr(baseline, "columns") else baseline)
    else:
        bdf = df
    sc = bdf[bdf["kind"] == "moe"] if "kind" in bdf.columns else bdf.iloc[:0]
    if "parent_key" in sc.columns:
        sc = sc[sc["parent_key"].fillna("").astype(str) == ""]
    _refuse_non_finite(up, ("D1", "D2", "N1", "N2", "val_loss"), _name(results, "the results"))
    _refuse_non_finite(sc, ("tokens", "N1", "N2", "val_loss"),
                       _name(results, "the results") if baseline is None else
                       _name(baseline, "the baseline"))
    if len(up) < 6 or up["D1"].nunique() < 2 or up["D2"].nunique() < 2:
        raise FitError(f"{results}: need upcycled (dense_to_moe) trials over at least 2 D1 and "
                       f"2 D2 values (a D1 × D2 sweep such as search_spaces/scaling_d1_d2.yaml);"
                       f" found {len(up)} trials")
    if len(sc) < 3 or sc["tokens"].nunique() < 3:
        raise FitError("need from-scratch MoE runs (kind moe, no parent) at 3 or more token "
                       "budgets: pass --baseline RESULTS (e.g. search_spaces/"
                       "scaling_d1_d2_baseline.yaml's results)")
    n1s = np.unique(_num(up, "N1"))
    n2_up, n2_sc = np.unique(_num(up, "N2")), np.unique(_num(sc, "N2"))
    joint = len(n1s) >= 3
    if not joint and (len(n2_sc) != 1 or not np.isclose(n2_sc[0], n2_up[0], rtol=1e-3)):
        raise FitError(f"the from-scratch runs' MoE (N2 = {n2_sc.tolist()} active parameters) "
                       f"is not the upcycled one (N2 = {n2_up.tolist()}); compare like with like")
    if joint:
        up_pts = load_points(up, "joint_upcycled")
        sc_pts = load_points(sc, "chinchilla", columns={"N": "N1", "D": "tokens"})
    else:
        up_pts = load_points(up, "upcycled_mul")
        sc_pts = load_points(sc, "chinchilla_d", columns={"D": "tokens"})
    ranges = {"D1": (float(up["D1"].min()), float(up["D1"].max())),
              "D2": (float(up["D2"].min()), float(up["D2"].max())),
              "D_scratch": (float(sc["tokens"].min()), float(sc["tokens"].max())),
              "N1": (float(n1s.min()), float(n1s.max()))}
    groups = (_noise_groups(up, up_pts, "parent_key"), _noise_groups(sc, sc_pts, None))
    return DecisionData(up_pts, sc_pts, joint, float(np.median(n1s)), float(n2_up[0]), ranges,
                        groups)


def _noise_groups(df, pts: Points, column: str | None) -> tuple[str | None, ...]:
    """Each point's noise group (see :attr:`DecisionData.groups`), by its trial id."""
    if "trial_id" not in df.columns or not pts.labels:
        return (None,) * len(pts)
    by_trial = {}
    for _, row in df.iterrows():
        key = None
        if column is not None and column in df.columns and isinstance(row.get(column), str) \
                and row[column]:
            key = f"{column}:{row[column]}"
        elif column is None and "branch_from_step" in df.columns and \
                np.isfinite(_as_float(row.get("branch_from_step"))):
            key = f"stable:seed={row.get('seed', 0)}"
        by_trial[str(row["trial_id"])] = key
    return tuple(by_trial.get(t) for t in pts.labels)


def _as_float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


# ---- the two laws at one parameter draw ----------------------------------------------------


def _losses(data: DecisionData, upc: Mapping[str, float], scr: Mapping[str, float],
            N1: float, D1: float, D2: float) -> tuple[float, float]:
    """(L upcycled at (N1, D1, D2), L from scratch at (N1, D2))."""
    ul, sl = (get_law(n) for n in data.laws)
    xu = {"D1": np.array([D1]), "D2": np.array([D2])}
    xs = {"D": np.array([D2])}
    if data.joint:
        xu["N1"], xs["N"] = np.array([N1]), np.array([N1])
    return float(ul.predict(upc, xu)[0]), float(sl.predict(scr, xs)[0])


def _dstar(data: DecisionData, upc, scr, N1: float):
    """000 Eq. 13 at N1 for one parameter draw."""
    ul, sl = (get_law(n) for n in data.laws)

    def gaps(lnd):
        d = np.exp(np.atleast_1d(lnd))
        xu, xs = {"D1": d, "D2": d}, {"D": d}
        if data.joint:
            xu["N1"], xs["N"] = np.full_like(d, N1), np.full_like(d, N1)
        return sl.predict(scr, xs) - ul.predict(upc, xu)

    return sign_changes(lambda g: float(gaps(np.array([g]))[0]), *D_RANGE, vectorized=gaps)


def _match_tokens(data: DecisionData, scr, N1: float, target: float) -> float:
    """From-scratch tokens whose predicted loss equals ``target`` (inf: never within range)."""
    sl = get_law(data.laws[1])

    def g(lnd):
        d = np.exp(np.atleast_1d(lnd))
        xs = {"D": d, **({"N": np.full_like(d, N1)} if data.joint else {})}
        return sl.predict(scr, xs) - target

    r = sign_changes(lambda v: float(g(np.array([v]))[0]), *D_RANGE, n=200, vectorized=g)
    return r.crossings[0].D if r.crossings else math.inf


# ---- the decision ---------------------------------------------------------------------------


def _interval(vals: list[float], level: float) -> list[float | None]:
    """Percentile interval as order statistics (±inf stays ±inf: one path wins everywhere)."""
    v = np.sort(np.asarray(vals, dtype=float))
    if len(v) == 0:
        return [None, None]
    n = len(v)
    lo, hi = v[int(math.floor((1 - level) / 2 * (n - 1)))], v[int(math.ceil((1 + level) / 2 *
                                                                              (n - 1)))]
    return [_finite(lo), _finite(hi)]


def _finite(v: Any) -> Any:
    """JSON-safe: NaN and ±inf become None, recursively."""
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    if isinstance(v, (float, np.floating)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, np.integer):
        return int(v)
    return v


def _outside(data: DecisionData, N1: float, D1: float, D2: float
             ) -> dict[str, tuple[float, float, float]]:
    """Each input the laws are evaluated at: (value, data's lo, data's hi)."""
    out = {"D1": (D1, *data.ranges["D1"]), "D2": (D2, *data.ranges["D2"]),
           "D2 (from scratch)": (D2, *data.ranges["D_scratch"])}
    if data.joint:
        out["N1"] = (N1, *data.ranges["N1"])
    return out


def _extrapolated(data: DecisionData, N1: float, D1: float, D2: float) -> list[str]:
    """One line per input outside the data, with how far (``40x the largest fitted D1``)."""
    lines = (describe_outside(k, *v) for k, v in _outside(data, N1, D1, D2).items())
    return [ln for ln in lines if ln]


def _factors(data: DecisionData, N1: float, D1: float, D2: float) -> dict[str, float]:
    """How far outside the data each law is evaluated (1: inside), per predicted quantity."""
    f = {k: outside_factor(*v) for k, v in _outside(data, N1, D1, D2).items()}
    up = [f["D1"], f["D2"], f.get("N1", 1.0)]
    return {"upcycled": max(up), "scratch": max(f["D2 (from scratch)"], f.get("N1", 1.0))}


def _dstar_note(data: DecisionData, value: float | None) -> list[str]:
    lo, hi = data.ranges["D1"][0], min(data.ranges["D2"][1], data.ranges["D1"][1])
    if value is None or lo <= value <= hi:
        return []
    return [f"D* = {value:.4g} lies outside the D1 = D2 diagonal the data cover ({lo:.4g} … "
            f"{hi:.4g}): the laws extrapolate it"]


def _cost(tokens: float, N: float, tflops: float, price: float | None) -> dict[str, Any]:
    fl = flops_6nd(N, tokens)
    gh = gpu_hours(fl, tflops)
    return {"tokens": tokens, "flops": fl, "gpu_hours": gh,
            "cost": gh * price if price is not None and math.isfinite(gh) else None}


def _budget(data: DecisionData, budget_tokens, budget_flops) -> float:
    if budget_tokens is not None and budget_flops is not None:
        raise FitError("give --budget-tokens or --budget-flops, not both")
    if budget_flops is not None:
        return float(budget_flops) / (6.0 * data.N2)  # 000 App. A: C = 6·N2·D2
    return float(budget_tokens) if budget_tokens is not None else data.ranges["D2"][1]


def _draw(data, upc, scr, N1, D1, D2) -> dict[str, float]:
    lu, ls = _losses(data, upc, scr, N1, D1, D2)
    ds = _dstar(data, upc, scr, N1)
    dv = ds.value if ds.value is not None else (
        math.inf if ds.winner_everywhere == "upcycled" or ds.crossings else 0.0)
    return {"L_up": lu, "L_sc": ls, "dstar": dv, "match": _match_tokens(data, scr, N1, lu)}


def _optimal(data, upc, D1: float, C2: float) -> dict[str, Any]:
    if not data.joint:
        return {"available": False, "reason": "the data hold one dense size (N1 = "
                f"{data.N1:.4g}): 000 Eq. 14's split of C2 between D2 and N1 needs Eq. 12 "
                "fitted over several N1"}
    try:
        c = compute_optimal(upc, D1, C2, active_ratio=data.N2 / data.N1)
    except FitError as e:
        return {"available": False, "reason": str(e)}
    return {"available": True, "C2": C2, "D2_opt": c.D2_opt, "N1_opt": c.N1_opt}


def decide(data: DecisionData, *, n1: float | None = None, d1: float | None = None,
           budget_tokens: float | None = None, budget_flops: float | None = None,
           gpu_tflops: float | None = None, price: float | None = None, gpu: str = DEFAULT_GPU,
           bootstrap: int = 200, ci: float = 0.9, seed: int = 0, noise: str = "trials",
           icc: float | None = None, length: float | None = None,
           measured: Any = "unexamined", widen: float | str = AUTO) -> Decision:
    """The decision (see the module's docstring; ``Decision.to_dict``: as JSON). ``noise="groups"``:
    parametric resamples that keep the noise a parent's (stable run's) trials share
    (:func:`scaling.bootstrap.group_noise_bootstrap_shared`, ``icc`` as in a law search's
    ``law.icc``); ``"fading"``: the same with the shared part fading along D2 over ``length``
    octaves (``law.length``); ``"trials"``: resample trials. ``measured``: the results'
    :class:`analysis.noise.NoiseStructure` (None: they have no replicates; left out: not
    examined), for ``noise_model``, which says what the intervals assume and why. ``widen``:
    the D* interval's ends moved that many times as far from D̂* in ln D*
    (:func:`scaling.interval.widen`; a calibrated factor, docs/intervals.md), said in
    ``widen`` (``auto``, the default: the calibrated factor for ``noise``,
    :data:`scaling.interval.CALIBRATED`; an explicit number wins)."""
    check_interval_args(noise, length, widen)
    widen, widen_source = resolve_widen(widen, noise_model_name(noise, length))
    N1 = float(n1) if n1 is not None else data.N1
    if not data.joint and not math.isclose(N1, data.N1, rel_tol=1e-2):
        raise FitError(f"--n1 {N1:g}: the data hold one dense size, N1 = {data.N1:g}; the "
                       "laws of one size cannot move to another (sweep several N1 for Eq. 12)")
    D1 = float(d1) if d1 is not None else data.ranges["D1"][1]
    D2 = _budget(data, budget_tokens, budget_flops)
    N2 = data.N2 * (N1 / data.N1)
    gpu_tflops, tflops_source = _rate(gpu_tflops, gpu)
    items = [(data.laws[0], data.upcycled), (data.laws[1], data.scratch)]
    fits = fit_shared(items, shared=("E",), seed=seed)
    upc, scr = fits[0].params, fits[1].params
    point = _draw(data, upc, scr, N1, D1, D2)
    comps = None
    if noise in ("groups", "fading"):
        boot, comps = group_noise_bootstrap_shared(
            items, bootstrap, warm=fits, icc=icc, seed=seed, length=length,
            groups=[g or (None,) * len(p) for g, (_, p) in zip(data.groups, items)])
    else:
        boot = bootstrap_shared(items, bootstrap, warm=fits, seed=seed)
    draws = [_draw(data, u, s, N1, D1, D2) for u, s in boot]
    if not draws:
        raise FitError("every bootstrap fit failed; add trials")

    def iv(key: str) -> list[float | None]:
        return _interval([d[key] for d in draws], ci)

    wins = float(np.mean([d["L_up"] < d["L_sc"] for d in draws]))
    ds = _dstar(data, upc, scr, N1)
    verdict = "upcycle" if wins >= (1 + ci) / 2 else (
        "from_scratch" if wins <= (1 - ci) / 2 else "uncertain")
    C2 = flops_6nd(N2, D2)
    return Decision.from_dict(_finite({
        "verdict": verdict, "p_upcycle_wins": wins, "ci_level": ci,
        "bootstrap": {"n": len(draws), "unit": "trial (each data set resampled on its own)"}
        if comps is None else {
            "n": len(draws), "unit": "noise groups (parametric: a parent's / stable run's "
                                     "trials share part of their noise)",
            "noise": {k: {"sigma": math.sqrt(c.total), "icc": c.icc,
                          "icc_given": c.icc_given} for k, c in zip(("upcycled", "scratch"),
                                                                      comps)}},
        "noise_model": noise_model(noise, icc, length, measured),
        "inputs": {"N1": N1, "N2": N2, "D1": D1, "D2": D2, "budget_flops": C2,
                   "gpu_tflops": gpu_tflops, "gpu": gpu, "gpu_tflops_source": tflops_source,
                   "price_per_gpu_hour": price},
        "loss": {"upcycled": {"value": point["L_up"], "ci": iv("L_up")},
                 "scratch": {"value": point["L_sc"], "ci": iv("L_sc")}},
        "d_star": _widened_dstar(ds, iv("dstar"), widen),
        "widen": {**_widen_note(ds.value, widen), "source": widen_source},
        "compute_optimal": _optimal(data, upc, D1, C2),
        "cost": {"upcycled": _cost(D2, N2, gpu_tflops, price),
                 "scratch": _cost(D2, N2, gpu_tflops, price),
                 "scratch_to_match": {**_cost(point["match"], N2, gpu_tflops, price),
                                      "tokens_ci": iv("match")},
                 "sunk_dense": _cost(D1, N1, gpu_tflops, price)},
        "laws": {"upcycled": {"law": data.laws[0], "params": upc, "n": data.upcycled.L.size},
                 "scratch": {"law": data.laws[1], "params": scr, "n": data.scratch.L.size},
                 "shared": ["E"]},
        "extrapolated": _extrapolated(data, N1, D1, D2) + _dstar_note(data, ds.value),
        "extrapolation_factor": _factors(data, N1, D1, D2),
        "limits": _limits(data, N1, D1, D2, ds.value, point["match"]),
    }))


def _limits(data: DecisionData, N1: float, D1: float, D2: float, dstar: float | None,
            match: float) -> dict[str, Any]:
    """Which predictions lie beyond :data:`MAX_EXTRAPOLATION` times the data (their numbers are
    then not meaningful), and the model size every cost is priced at."""
    f = _factors(data, N1, D1, D2)
    lo, hi = data.ranges["D1"][0], min(data.ranges["D2"][1], data.ranges["D1"][1])
    sc_lo, sc_hi = data.ranges["D_scratch"]
    far = {"loss.upcycled": f["upcycled"], "loss.scratch": f["scratch"],
           "d_star": outside_factor(dstar, lo, hi) if dstar else 1.0,
           "cost.scratch_to_match": max(f["scratch"], outside_factor(match, sc_lo, sc_hi)
                                        if math.isfinite(match) else math.inf)}
    return {"max_extrapolation": MAX_EXTRAPOLATION,
            "beyond": sorted(k for k, v in far.items() if v > MAX_EXTRAPOLATION),
            "priced_at": {"N2_active": data.N2 * (N1 / data.N1), "N1_dense": N1,
                          "fitted_N1": data.N1}}


NOISE_MODELS = ("trials", "groups", "fading")


def check_interval_args(noise: str, length: float | None, widen: float) -> None:
    """The interval options, refused in one line each."""
    if widen == AUTO:
        pass
    elif isinstance(widen, (bool, str)) or not widen >= 1:
        raise FitError(f"--widen {widen}: must be >= 1 (a calibrated widening of the D* "
                       "interval; 1: none)")
    elif not widen <= MAX_WIDEN:
        raise FitError(f"--widen {widen:g}: must be at most {MAX_WIDEN:g} (a calibrated "
                       "widening is a few)")
    if noise not in NOISE_MODELS:
        raise FitError(f"--noise {noise}: use {', '.join(NOISE_MODELS)}")
    if (noise == "fading") != (length is not None) or (length is not None and not length > 0):
        raise FitError("--noise fading needs --length L (> 0 octaves of D2; python -m "
                       "analysis.noise fits it), and --length goes only with --noise fading")


def _widened_dstar(ds, ci: list[float | None], factor: float) -> dict[str, Any]:
    """The D* entry with its interval widened by ``factor`` about D̂* in ln D*
    (:func:`scaling.interval.widen`; ``ci_unwidened``: the bootstrap's own, when F ≠ 1)."""
    out = {"value": ds.value, "ci": list(widen_interval(ds.value, *ci, factor)),
           **ds.to_dict()}
    if factor != 1:
        out["ci_unwidened"] = ci
    return out


def _widen_note(value: float | None, factor: float) -> dict[str, Any]:
    """``widen`` in the JSON: the factor and what it did."""
    if factor == 1:
        how = "none: the D* interval is the bootstrap's percentile interval"
    elif value is None:
        how = (f"×{factor:g} asked, not applied: no D* estimate to widen about (the laws do "
               "not cross once)")
    else:
        how = (f"the D* interval's ends moved ×{factor:g} as far from D* = {value:.3g} in "
               "ln D* (a calibrated factor: studies/law_search.py's calibration, "
               "docs/intervals.md)")
    return {"factor": factor, "applies_to": "d_star", "how": how}


def noise_model(noise: str, icc: float | None, length: float | None,
                measured: Any = "unexamined") -> dict[str, Any]:
    """What the intervals assume about the noise, and why: the model asked for, and what the
    results' own seed replicates (``measured``, an :class:`analysis.noise.NoiseStructure`)
    say about it; without replicates, that the structure was assumed, not estimated."""
    given = f"{icc:g} given" if icc is not None else "estimated from the residuals"
    if noise == "trials":
        assumes = "independent trials (each resampled trial is independent evidence)"
    elif noise == "groups":
        assumes = ("a parent's / stable run's trials share one noise effect (equicorrelated, "
                   f"ICC {given})")
    else:
        assumes = ("a parent's / stable run's trials share a noise effect that fades along D2, "
                   f"correlation exp(-d²/2·{length:g}²) at d octaves (share {given})")
    out: dict[str, Any] = {"model": noise, "icc": icc, "length": length, "assumes": assumes}
    if isinstance(measured, str):
        out["why"] = (f"noise {noise} as given; the results' seed replicates were not examined "
                      "here (python -m analysis.decide examines them)")
        out["measured"] = None
        return out
    if measured is None:
        out["why"] = (f"--noise {noise} as given; the results have no point run with two or "
                      "more seeds, so their noise structure cannot be estimated: this is an "
                      "assumption (run with seeds: [0, 1, 2] and python -m analysis.noise to "
                      "measure it)")
        out["measured"] = None
        return out
    m = {"sigma": measured.sigma, "icc": measured.icc, "share": measured.share,
         "length": measured.length, "group_fixed": measured.group_fixed,
         "pairs": measured.pairs}
    out["measured"] = m
    shared = measured.pairs > 0 and math.isfinite(measured.icc) and measured.icc > 0.1
    if not shared:
        fits = "matches" if noise == "trials" or icc == 0 else "is more cautious than"
        seen = "no shared part" if measured.pairs else "no pairs of points sharing a group"
        out["why"] = f"--noise {noise} as given; the replicates show {seen}: it {fits} them"
    elif measured.length is not None:
        fits = "matches" if noise == "fading" else "misses"
        out["why"] = (f"--noise {noise} as given; the replicates' shared part fades (ICC "
                      f"{measured.icc:.2f}, share {measured.share:.2f}, length "
                      f"{measured.length:.2f} octaves): it {fits} that (--noise fading --icc "
                      f"{measured.share:.2f} --length {measured.length:.2f} models it)")
    else:
        fits = "misses" if noise == "trials" else "matches"
        out["why"] = (f"--noise {noise} as given; the replicates share ICC {measured.icc:.2f} "
                      f"within a group: it {fits} that")
    return out

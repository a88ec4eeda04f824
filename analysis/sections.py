"""The report's sections as data: each returns its Markdown lines and what ``report.json``
records (a :class:`Section`); no drawing here (the figures are :mod:`analysis.plots`')."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analysis.data import final_evals, load_points
from analysis.decide import decide, load_decision_data
from analysis.derived import eta_interval, upcycling_efficiency
from analysis.sweep import Sweep, format_knob, glossary_lines
from moe_core.errors import FitError
from scaling.fit import FitResult, fit
from scaling.laws import Points, get_law
from sweeps.store.provenance import describe
from sweeps.store.results import STEP0_EVAL, read_provenance

UPCYCLED_FORMS = ("upcycled_mul", "upcycled_mul_noint", "upcycled_add", "upcycled_add_noint")
CONFIG_FORMS = ("model_config_mul", "model_config_mul_noint", "model_config_add_int",
                "model_config_add")


@dataclass(frozen=True)
class LawFigure:
    """What the data-vs-fit figure of the D1 × D2 law draws (:func:`analysis.plots.plot_law_fit`):
    the upcycled trials' final evals, the best law, its parameters, points and residuals."""

    data: Any
    law: str
    params: Mapping[str, float]
    points: Points
    residuals: np.ndarray


@dataclass(frozen=True)
class Section:
    """A report section: Markdown ``lines`` (empty: the section does not apply), ``data`` for
    report.json, and the law figure to draw after it, if any."""

    lines: list[str] = field(default_factory=list)
    data: Any = None
    figure: LawFigure | None = None


def _fmt(v: Any, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    if isinstance(v, (int, np.integer)):
        return f"{int(v):,}"
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if v.is_integer() and 1 <= abs(v) < 1e12:
            return f"{int(v):,}"
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.3g}"
        return f"{v:.{digits}g}"
    return str(v)


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_fmt(c) for c in r) + " |" for r in rows]
    return out + [""]


# ---- compute ledger and configurations ------------------------------------------------------


def ledger(s: Sweep) -> dict[str, Any]:
    """Tokens trained and saved, FLOPs and wall time, from the results (and summary.json)."""
    every = final_evals(s.rows.assign(status="ok"))  # every trial, finished or not

    def total(col: str) -> float:
        return float(every[col].fillna(0).sum()) if col in every.columns else math.nan

    trial_tokens = total("tokens")
    parents: dict[str, float] = {}
    naive_parent = 0.0  # every trial training its own parent
    if {"parent_key", "parent.tokens"} <= set(every.columns):
        for key, toks in zip(every["parent_key"], every["parent.tokens"]):
            if isinstance(key, str) and toks and math.isfinite(float(toks)):
                parents[key] = float(toks)
                naive_parent += float(toks)
    summary = s.summary or {}
    branches = summary.get("tokens_saved_by_branches") or 0
    return {
        "trials": len(every), "ok": len(s.finals), "trial_tokens": trial_tokens,
        "parents": len(parents), "parent_tokens": sum(parents.values()),
        "tokens_saved_by_sharing": naive_parent - sum(parents.values()),
        "tokens_saved_by_branches": summary.get("tokens_saved_by_branches"),
        "tokens_from_scratch": trial_tokens + naive_parent,
        "tokens_spent": trial_tokens + sum(parents.values()) - branches,
        "trial_flops": total("flops"), "trial_wall_s": total("wall_s"),
        "sweep_wall_s": summary.get("wall_s"), "parent_wall_s": summary.get("parent_wall_s"),
    }


def ledger_section(s: Sweep) -> Section:
    led = ledger(s)
    rows = [["trials (finished / all)", f"{led['ok']} / {led['trials']}"],
            ["tokens trained by trials", led["trial_tokens"]],
            ["distinct parents trained (tokens)",
             f"{led['parents']} ({led['parent_tokens']:,.0f})"],
            ["tokens saved by shared parents", led["tokens_saved_by_sharing"]],
            ["tokens saved by WSD branches", led.get("tokens_saved_by_branches")],
            ["tokens if every trial trained its parent", led["tokens_from_scratch"]],
            ["trial FLOPs (6·N_active·D)", led["trial_flops"]],
            ["trial wall time, summed (s)", led["trial_wall_s"]],
            ["parents and stable runs, wall (s)", led["parent_wall_s"]],
            ["sweep wall time (s)", led["sweep_wall_s"]]]
    return Section(["## Compute ledger", "", *md_table(["", "value"], rows)], led)


def provenance_section(s: Sweep) -> Section:
    """The code, library versions and device the results came from (``summary.json``'s
    record, else the Parquet's; ``sweeps.store.provenance``)."""
    rec = (s.summary or {}).get("provenance") or read_provenance(s.path)
    return Section(["## Provenance", "", describe(rec), ""], rec or {})


def groups_section(s: Sweep) -> Section:
    """Mean ± std over seeds of each configuration's final eval and router statistics."""
    cols = s.stat_columns
    rows, data = [], []
    for g in s.groups:
        v = g.stat("val_loss")
        rows.append([g.label, v.n, f"{v.mean:.4f} ± {v.std:.4f}" if math.isfinite(v.std)
                     else f"{v.mean:.4f}", *[g.stat(c).mean for c in cols]])
        data.append({"label": g.label, "n": v.n, "val_loss": v.mean, "val_loss_std": v.std,
                     **{c: g.stat(c).mean for c in cols}})
    lines = ["## Results by configuration", "",
             f"Knobs: {', '.join(s.knobs) or '(none)'}; mean ± std over seeds of each "
             "trial's final eval, best first.", ""]
    table = md_table(["configuration", "seeds", "val_loss", *cols], rows)
    meaning = glossary_lines(cols)  # each router statistic in one line
    return Section(lines + table + (["", "Router statistics:", *meaning] if meaning else []),
                   data)


# ---- scaling laws ---------------------------------------------------------------------------


def _varies(df, col: str, k: int = 2) -> bool:
    return col in df.columns and df[col].nunique() >= k


def _fx(law: str, fixed: Mapping[str, float] | None) -> dict[str, float]:
    names = get_law(law).param_names
    return {k: v for k, v in (fixed or {}).items() if k in names}


def _upcycled_finals(s: Sweep):
    """The upcycled trials' final evals on a D1 × D2 grid (None if the sweep has none)."""
    f = s.finals[s.finals["kind"] == "upcycled"] if "kind" in s.finals else s.finals
    if not {"D1", "D2", "val_loss"} <= set(f.columns):
        return None
    f = f[(f["D1"] > 0) & (f["D2"] > 0) & np.isfinite(f["val_loss"].astype(float))]
    if not (_varies(f, "D1") and _varies(f, "D2")) or len(f) < 8:
        return None
    return f


def _fit_forms(f, fixed) -> tuple[dict[str, FitResult], list[str]]:
    """Each of Eq. 8/9 with and without interaction, with leave-one-out; failures as lines."""
    fits, failed = {}, []
    for name in UPCYCLED_FORMS:
        try:
            fits[name] = fit(name, load_points(f, name), loo=True, fixed=_fx(name, fixed))
        except FitError as e:
            failed.append(f"- {name}: fit failed ({e})")
    return fits, failed


def _forms_lines(n: int, fits: Mapping[str, FitResult], best: str) -> list[str]:
    rows = [[k + (" **(best)**" if k == best else ""), len(r.params) - len(r.fixed),
             r.rms_nats, r.loo["rms_nats"], r.loo["rms_ln"]] for k, r in fits.items()]
    return [f"{n} trials (each trial's final eval). Huber δ = 1e-3 on ln L, L-BFGS-B "
            "from a grid; leave-one-out RMS as in 000 Table 1.", "",
            *md_table(["law", "free params", "RMS (nats)", "LOO RMS (nats)", "LOO RMS (ln)"],
                      rows)]


def _eq8_lines(bf: FitResult, bootstrap: int) -> list[str]:
    """Eq. 8's parameters with their bootstrap intervals, fixed ones and ones on a bound."""
    prow = [[k, v, *(bf.ci[k] if bf.ci else ("—", "—"))] for k, v in bf.params.items()]
    lines = ["Eq. 8 (multiplicative, with interaction) fitted to all points"
             + (f", {bootstrap} bootstrap resamples (95 % percentile interval)" if bootstrap
                else "") + ":", ""]
    lines += md_table(["param", "value", "CI low", "CI high"], prow)
    if bf.fixed:
        lines += [f"Fixed: {', '.join(f'{k} = {v:g}' for k, v in bf.fixed.items())}.", ""]
    if bf.at_bounds:
        lines += [f"On a bound of the fit, so not identified by these data: "
                  f"{', '.join(bf.at_bounds)} (fix it with `--fix`, as 000 §5 fixes E).", ""]
    return lines


def per_d1_slopes(f) -> list[tuple[float, float, float, float]]:
    """Per D1 with at least three D2 (000 Eq. 7, Fig. 4): (D1, L at the smallest D2, L at the
    largest, −slope of ln L in ln D2)."""
    per = []
    for d1, sub in f.groupby("D1"):
        if sub["D2"].nunique() < 3:
            continue
        d2 = sub["D2"].to_numpy(float)
        L = sub["val_loss"].to_numpy(float)
        slope = float(np.polyfit(np.log(d2), np.log(L), 1)[0])  # local log-log slope
        per.append((float(d1), float(L[np.argmin(d2)]), float(L[np.argmax(d2)]), -slope))
    return per


def _per_d1_lines(per, mul: FitResult | None) -> list[str]:
    prow = []
    for d1, first, last, sl in per:
        eff = (mul.params["alpha2"] - mul.params["alpha3"] * math.log(d1)) if mul else math.nan
        prow.append([int(d1), first, last, sl, eff])
    return ["Per-D1 behaviour (000 §3.3, Fig. 4): the loss at the smallest D2 (the head "
            "start), at the largest, and the log-log slope −d ln L/d ln D2; the fitted "
            "effective exponent of Eq. 8 is α2 − α3·ln D1.", "",
            *md_table(["D1", "L at min D2", "L at max D2", "−slope", "α2 − α3·ln D1"], prow)]


def upcycled_law_section(s: Sweep, bootstrap: int,
                         fixed: Mapping[str, float] | None = None) -> Section:
    """000 §4.1: compare Eq. 8/9 with and without interaction on the D1 × D2 grid."""
    f = _upcycled_finals(s)
    if f is None:
        return Section([], {})
    fits, failed = _fit_forms(f, fixed)
    lines = ["## Scaling law of D1 and D2 (000 §4.1, Table 1)", "", *failed]
    if not fits:
        return Section(lines, {})
    best = min(fits, key=lambda n: fits[n].loo["rms_ln"])
    lines += _forms_lines(len(f), fits, best)
    bf = fit("upcycled_mul", load_points(f, "upcycled_mul"), bootstrap=bootstrap,
             fixed=_fx("upcycled_mul", fixed)) if bootstrap else fits.get("upcycled_mul")
    if bf is not None:
        lines += _eq8_lines(bf, bootstrap)
    per = per_d1_slopes(f)
    if per:
        lines += _per_d1_lines(per, fits.get("upcycled_mul"))
    info = {"fits": {n: r.to_dict() for n, r in fits.items()}, "best": best, "per_d1": per}
    if bf is not None and bf.ci and "upcycled_mul" in info["fits"]:
        info["fits"]["upcycled_mul"]["ci"] = {k: list(v) for k, v in bf.ci.items()}
        info["fits"]["upcycled_mul"]["bootstrap_n"] = bootstrap
    figure = LawFigure(f, best, fits[best].params, load_points(f, best), fits[best].residuals)
    return Section(lines, info, figure)


MIN_LAW_POINTS = 3
"""Distinct points per stratum below which a law the sweep was not built for is not fitted (two
points fit every form exactly: their leave-one-out errors tie and the exponents are arbitrary)."""


def _point(g) -> tuple[float, float] | None:
    r = g.rows[0] if g.rows else {}
    try:
        nt, n2 = float(r["N_total"]), float(r["N2"])
    except (KeyError, TypeError, ValueError):
        return None
    return (round(nt / n2, 6), round(n2)) if n2 else None


def sparsity_points_per_stratum(s: Sweep) -> dict[str, int]:
    """Distinct (P, N2) points in each stratum: the cells equal on every varied knob that does
    not change the model's shape (an aux coefficient, an LR), keyed by their label ("all")."""
    pts = {id(g): _point(g) for g in s.groups}
    varied = list(s.varied)

    def shapes(k: str) -> bool:  # does changing k alone change (P, N2)?
        seen: dict[tuple, set] = {}
        for g in s.groups:
            key = tuple(format_knob(g.knob(o)) for o in varied if o != k)
            seen.setdefault(key, set()).add(pts[id(g)])
        return any(len(v) > 1 for v in seen.values())

    free = [k for k in varied if not shapes(k)]
    by: dict[str, set] = {}
    for g in s.groups:
        label = ", ".join(f"{k}={format_knob(g.knob(k))}" for k in free) or "all"
        if pts[id(g)] is not None:
            by.setdefault(label, set()).add(pts[id(g)])
    return {k: len(v) for k, v in sorted(by.items())}


def model_config_section(s: Sweep) -> Section:
    """000 §4.2, App. D.1: sparsity P = N_total/N2 and active parameters N2."""
    f = s.finals
    if "N_total" not in f.columns or "N2" not in f.columns:
        return Section([], {})
    P = f["N_total"] / f["N2"]
    if P.nunique() < 2 or f["N2"].nunique() < 2:
        return Section([], {})
    lines = ["## Scaling law of sparsity and active parameters (000 §4.2, App. D.1)", ""]
    per = sparsity_points_per_stratum(s)
    worst = min(per, key=per.get) if per else "all"
    if per.get(worst, 0) < MIN_LAW_POINTS:
        return Section([*lines, f"Not fitted: {per.get(worst, 0)} distinct (P, N2) point(s) at "
                        f"{worst}; a law of P and N2 needs ≥ {MIN_LAW_POINTS} distinct points "
                        "per stratum before its forms can be told apart.", ""],
                       {"not_fitted": per})
    if len(f) < 7:
        return Section([*lines, f"Not fitted: {len(f)} trials; its four forms need ≥ 7 for a "
                        "leave-one-out comparison.", ""], {"not_fitted": per})
    fits = {}
    for name in CONFIG_FORMS:
        try:
            fits[name] = fit(name, load_points(f, name), loo=True)
        except FitError as e:
            lines.append(f"- {name}: {e}")
    if fits:
        lines += md_table(["law", "LOO RMS (nats)", "LOO RMS (ln)", "β1", "β2"],
                          [[n, r.loo["rms_nats"], r.loo["rms_ln"], r.params.get("beta1"),
                            r.params.get("beta2")] for n, r in fits.items()])
    return Section(lines, {n: r.to_dict() for n, r in fits.items()})


# ---- the transition and expert upcycling efficiency (003 Eq. 4) -----------------------------


def _baseline_loss(base, experts: Any, T: float) -> tuple[float, int]:
    """Mean final loss of the from-scratch runs with ``experts`` experts at T tokens, and n."""
    b = base[(base["moe.num_experts"] == experts) & (np.isclose(base["tokens"], T, rtol=1e-3))]
    return (float(b["val_loss"].mean()), len(b)) if len(b) else (math.nan, 0)


def _baseline_runs(base, experts: Any, T: float) -> np.ndarray:
    b = base[(base["moe.num_experts"] == experts) & (np.isclose(base["tokens"], T, rtol=1e-3))]
    return b["val_loss"].to_numpy(float)


def _efficiency_row(r: Mapping[str, Any], base) -> dict[str, Any]:
    E, mE = r.get("parent.moe.num_experts"), r.get("moe.num_experts")
    T = float(r.get("D1") or 0) + float(r.get("tokens") or 0)
    (lE, nE), (lmE, nmE) = _baseline_loss(base, E, T), _baseline_loss(base, mE, T)
    eta = upcycling_efficiency(lE, float(r["val_loss"]), lmE) \
        if nE and nmE and lE != lmE else math.nan
    try:  # over the baselines' seeds (the upcycled trial is one run)
        eta_ci = list(eta_interval(_baseline_runs(base, E, T), [float(r["val_loss"])],
                                   _baseline_runs(base, mE, T)))
    except FitError:
        eta_ci = [math.nan, math.nan]
    return {"trial_id": r["trial_id"], "tau": float(r.get("D1") or 0), "T": T,
            "cpt": float(r.get("tokens") or 0),
            "strategy": r.get("upcycle.strategy"), "L_up": float(r["val_loss"]),
            "L_fixed_E": lE, "L_fixed_mE": lmE, "n_baseline": min(nE, nmE), "eta": eta,
            "eta_ci90": eta_ci,
            "E": E, "mE": mE}


def efficiency_rows(s: Sweep, baseline: Sweep) -> list[dict[str, Any]]:
    """η per upcycled trial: Fixed-E and Fixed-mE from-scratch runs at the same total tokens."""
    base = baseline.finals
    if "moe.num_experts" not in base.columns:
        raise FitError(f"{baseline.path}: the baseline has no moe.num_experts column")
    out = [_efficiency_row(r, base) for _, r in s.finals.iterrows()
           if r.get("upcycle.method") == "expand_experts"]
    return sorted(out, key=lambda d: (d["strategy"] or "", d["tau"], d["cpt"]))


def _finite(v: Any) -> float | None:
    if v is None or not isinstance(v, (int, float, np.number)) or not math.isfinite(float(v)):
        return None
    return float(v)


def transition_rows(s: Sweep) -> list[dict[str, Any]]:
    """Per upcycled configuration: the parent's final val loss (the results' ``parent_val_loss``)
    and the loss right after upcycling (the trial's step-0 eval). Function-preserving operators
    keep the two equal (000 §3.3, 004 §2.3; 003 Def. 3.1: "gap below 1e-2"). A pretrained
    parent's loss is the step-0 eval the trial recorded (``parent_loss_source: step-0 eval``;
    older results: taken from the step-0 row here), and its jump is not measured. Results
    written before schema 2 have no ``parent_val_loss``: no rows."""
    if not {"parent_key", "step", "parent_val_loss"} <= set(s.rows.columns):
        return []
    start = s.rows[s.rows["step"] == 0].drop_duplicates("trial_id").set_index("trial_id")
    out = []
    for g in s.groups:
        jumps, loaded = [], False
        for r in g.rows:
            key, tid, lp = r.get("parent_key"), r.get("trial_id"), _finite(r.get("parent_val_loss"))
            if not (isinstance(key, str) and key) or tid not in start.index:
                continue
            l0 = _finite(start.loc[tid, "val_loss"])
            if r.get("parent_loss_source") == STEP0_EVAL:  # recorded by the trial
                loaded = True
            elif lp is None and pretrained(r):  # written before parent_loss_source: inferred
                lp, loaded = l0, True
            if l0 is not None and lp is not None:
                jumps.append((lp, l0))
        if jumps:
            lp, l0 = np.mean([j[0] for j in jumps]), np.mean([j[1] for j in jumps])
            out.append({"label": g.label, "L_parent": float(lp), "L_start": float(l0),
                        "jump": None if loaded else float(l0 - lp), "n": len(jumps),
                        "parent_loss": "step-0 eval" if loaded else "parent's final eval",
                        "method": g.rows[0].get("upcycle.method")})
    return out


def pretrained(r: Mapping[str, Any]) -> bool:
    """The trial's parent is a ``parent.from_pretrained`` checkpoint (loaded, not trained)."""
    v = r.get("parent.from_pretrained")
    return isinstance(v, str) and v != ""


def transition_section(s: Sweep) -> Section:
    rows = transition_rows(s)
    if not rows:
        return Section([], [])
    lines = ["## Loss at the transition", "",
             "The parent's final val loss against the trial's first eval right after upcycling "
             "(mean over seeds): a function-preserving operator keeps them equal.", ""]
    lines += md_table(["configuration", "parent", "after upcycling", "jump"],
                      [[r["label"], r["L_parent"], r["L_start"],
                        "—" if r["jump"] is None else f"{r['jump']:+.4f}"] for r in rows])
    if any(r["jump"] is None for r in rows):
        lines += ["—: a `parent.from_pretrained` parent is loaded, not trained, so its loss "
                  "here is the trial's step-0 eval (the freshly upcycled model), and the jump "
                  "is not measured.", ""]
    return Section(lines, rows)


def efficiency_section(s: Sweep, baseline: Sweep | None) -> Section:
    if baseline is None or "upcycle.method" not in s.finals.columns or not (
            s.finals["upcycle.method"] == "expand_experts").any():
        return Section([], [])
    rows = efficiency_rows(s, baseline)
    lines = ["## Expert upcycling efficiency η (003 Eq. 4)", "",
             f"η = (L(Fixed-E) − L(Upcycled)) / (L(Fixed-E) − L(Fixed-mE)); baselines from "
             f"`{baseline.path}` at the same total tokens T = τ + CPT (mean over their seeds).",
             ""]
    lines += md_table(["strategy", "τ", "CPT", "τ/T", "CPT/τ", "L upcycled", "L Fixed-E",
                       "L Fixed-mE", "η"],
                      [[d["strategy"], int(d["tau"]), int(d["cpt"]), d["tau"] / d["T"],
                        d["cpt"] / d["tau"] if d["tau"] else math.nan, d["L_up"],
                        d["L_fixed_E"], d["L_fixed_mE"], d["eta"]] for d in rows])
    return Section(lines, rows)


# ---- should I upcycle? (000 §5) -------------------------------------------------------------


def decision_section(s: Sweep, baseline: Sweep | None, bootstrap: int) -> Section:
    """The decision of ``python -m analysis.decide`` for a D1 × D2 sweep of dense → MoE trials
    with from-scratch MoE runs (the baseline, or rows of kind moe in the sweep); empty
    otherwise."""
    try:
        data = load_decision_data(s.rows, baseline.rows if baseline is not None else None)
        r = decide(data, bootstrap=max(bootstrap, 20))
    except FitError:
        return Section([], None)
    lines = ["## Should I upcycle? (000 §5)", "",
             "Upcycled law (Eq. 8) from this sweep, from-scratch law (Eq. 3 at this size) from "
             f"{'`' + str(baseline.path) + '`' if baseline is not None else 'its moe rows'}, "
             "E shared; at the data's largest D1 and D2 (`python -m analysis.decide` for other "
             "inputs); intervals resample trials.", "", "```",
             *r.lines(), "```", ""]
    return Section(lines, r.to_dict())

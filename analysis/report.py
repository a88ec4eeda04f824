"""Markdown report with tables and PNG plots for a sweep's results directory.

    python -m analysis.report results/upcycle_lr            # → results/upcycle_lr/report.md
    python -m analysis.report results/                      # every sweep below results/
    python -m analysis.report results/transition_tau --baseline results/expert_baselines
    python -m analysis.report results/upcycle_lr --out docs/findings/upcycle_lr

Sections: compute ledger (tokens trained, tokens saved by shared parents and WSD branches, FLOPs,
wall time); results by configuration (mean ± std over seeds of the final eval and router
statistics); loss curves; the metric and router statistics against the knob; scaling-law fits
when the sweep varies D1 and D2 (000 Table 1, Fig. 4, Eq. 10) or sparsity and active parameters
(000 §4.2); expert-upcycling efficiency η against from-scratch baselines (003 Eq. 4); and the
seeds' claims this sweep can test, each with a verdict computed from the numbers (analysis.claims).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from analysis.fit import final_evals, fit, load_points, ok_trials, read_table
from analysis.laws import TABLE2
from moe_core.errors import FitError

STATS = ["router.cos_to_parent", "router.max1_max2", "router.max2_max3",
         "router.expert_similarity", "router.max_load", "router.drop_rate", "aux_loss"]
UPCYCLED_FORMS = ("upcycled_mul", "upcycled_mul_noint", "upcycled_add", "upcycled_add_noint")
CONFIG_FORMS = ("model_config_mul", "model_config_mul_noint", "model_config_add_int",
                "model_config_add")


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


def format_knob(v: Any) -> str:
    from sweeps.results import format_knob as fk

    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "null"
    return fk(v)


# ---- loading --------------------------------------------------------------------------------


@dataclass
class Sweep:
    """One sweep's results: every row, each trial's final eval, and the configuration groups."""

    name: str
    path: Path
    rows: Any
    finals: Any
    knobs: list[str]
    summary: dict[str, Any] | None = None
    groups: list[dict[str, Any]] = field(default_factory=list)

    def group_of(self, trial_id: str) -> dict[str, Any] | None:
        for g in self.groups:
            if trial_id in g["trials"]:
                return g
        return None


def load_sweep(path: str | Path) -> Sweep:
    path = Path(path)
    rows = read_table(path)
    if rows.empty:
        raise FitError(f"{path}: the results are empty")
    summary = None
    sp = (path if path.is_dir() else path.parent) / "summary.json"
    if sp.exists():
        summary = json.loads(sp.read_text())
    finals = final_evals(rows)
    knobs = sorted(c for c in rows.columns if c.startswith("knob.") and c != "knob.seed")
    name = str(rows["sweep"].iloc[0]) if "sweep" in rows.columns else path.name
    s = Sweep(name, path, rows, finals, knobs, summary)
    s.groups = group_finals(finals, knobs)
    return s


def _short_names(knobs: list[str]) -> dict[str, str]:
    """Last segment of each knob's key, longer where two knobs would share it
    (``parent.tokens`` and ``tokens``)."""
    out = {}
    for k in knobs:
        parts = k[5:].split(".")
        n = 1
        while n < len(parts) and sum(
                o[5:].split(".")[-n:] == parts[-n:] for o in knobs) > 1:
            n += 1
        out[k] = ".".join(parts[-n:])
    return out


def _label(row, knobs: list[str]) -> str:
    if not knobs:
        return "all"
    names = _short_names(knobs)
    parts = []
    for k in knobs:
        v, short = format_knob(row.get(k)), names[k]
        parts.append(f"{short}({v})" if "=" in v else f"{short}={v}")
    return ", ".join(parts)


def group_finals(finals, knobs: list[str]) -> list[dict[str, Any]]:
    """Configurations (knob values without the seed), with mean/std/n of the final metrics."""
    groups: dict[str, dict[str, Any]] = {}
    for _, r in finals.iterrows():
        lab = _label(r, knobs)
        g = groups.setdefault(lab, {"label": lab, "trials": [], "rows": [],
                                    "knobs": {k: r.get(k) for k in knobs}})
        g["trials"].append(r["trial_id"] if "trial_id" in r else str(len(g["trials"])))
        g["rows"].append(r)
    out = []
    for g in groups.values():
        for col in ["val_loss", "train_loss", *STATS]:
            vals = np.array([float(x) for x in (r.get(col) for r in g["rows"])
                             if x is not None and isinstance(x, (int, float, np.number))
                             and math.isfinite(float(x))])
            g[col] = (float(vals.mean()) if len(vals) else math.nan,
                      float(vals.std(ddof=1)) if len(vals) > 1 else math.nan, len(vals))
        out.append(g)
    return sorted(out, key=lambda g: (g["val_loss"][0] if math.isfinite(g["val_loss"][0])
                                      else math.inf))


# ---- ledger ---------------------------------------------------------------------------------


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


# ---- plots ----------------------------------------------------------------------------------


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(s: Sweep, path: Path, metric: str = "val_loss",
                baseline: Sweep | None = None) -> Path | None:
    """The metric against tokens per trial. Expert-upcycling sweeps (MoE → MoE) are drawn
    against total tokens τ + CPT, with the from-scratch ``baseline`` runs (per expert count, the
    budget nearest the sweep's longest τ + CPT) in grey for comparison."""
    rows = ok_trials(s.rows)
    if "tokens" not in rows.columns or metric not in rows.columns or rows.empty:
        return None
    total = "upcycle.method" in rows.columns and (rows["upcycle.method"] == "expand_experts").any()
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    cmap = plt.get_cmap("tab10")
    for i, g in enumerate(s.groups):
        for j, tid in enumerate(g["trials"]):
            t = rows[rows["trial_id"] == tid].sort_values("step")
            x = t["tokens"] + (t["D1"].fillna(0) if total else 0)
            ax.plot(x, t[metric], color=cmap(i % 10), lw=1.3, alpha=0.9,
                    ls=["-", "--", ":", "-."][j % 4], label=g["label"] if j == 0 else None)
    if total and baseline is not None and "moe.num_experts" in baseline.rows.columns:
        b = ok_trials(baseline.rows)
        t_max = float((s.finals["D1"].fillna(0) + s.finals["tokens"]).max())
        for k, (e, sub) in enumerate(b.groupby("moe.num_experts")):
            if "tokens_budget" in sub.columns:  # the runs whose budget is the sweep's longest T
                budgets = sub["tokens_budget"].astype(float)
                sub = sub[budgets == budgets.iloc[int(np.argmin(np.abs(budgets - t_max)))]]
            for j, (_, t) in enumerate(sub.groupby("trial_id")):
                t = t.sort_values("step")
                ax.plot(t["tokens"], t[metric], color=["0.35", "0.65"][k % 2], lw=1.0,
                        ls=["-", "--"][j % 2], zorder=0,
                        label=f"from scratch, {int(e)} experts" if j == 0 else None)
    if total:
        ax.set_xlabel("total tokens (τ + continued pre-training)")
    else:
        ax.set_xlabel("tokens after upcycling (D2)" if (s.finals.get("D1", 0) > 0).any()
                      else "tokens")
    ax.set_ylabel(metric)
    lo = np.nanpercentile(rows[metric].astype(float), 1)
    hi = np.nanmax(rows.loc[rows["step"] > 0, metric].astype(float)) \
        if (rows["step"] > 0).any() else np.nanmax(rows[metric])
    ax.set_ylim(lo - 0.02 * (hi - lo), hi + 0.05 * (hi - lo))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title(f"{s.name}: {metric} (line style = seed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _numeric_knob(s: Sweep) -> str | None:
    """The single knob that varies and is numeric (possibly with a null), if any."""
    varying = [k for k in s.knobs if s.finals[k].astype(str).nunique() > 1]
    if len(varying) != 1:
        return None
    vals = [v for v in s.finals[varying[0]] if v is not None and not (
        isinstance(v, float) and math.isnan(v))]
    try:
        [float(v) for v in vals]
    except (TypeError, ValueError):
        return None
    return varying[0]


def plot_finals(s: Sweep, path: Path) -> Path | None:
    cols = ["val_loss"] + [c for c in STATS if any(math.isfinite(g[c][0]) for g in s.groups)]
    if not s.groups:
        return None
    plt = _plt()
    n = len(cols)
    ncol = min(n, 3)
    nrow = math.ceil(n / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.2 * nrow), squeeze=False)
    knob = _numeric_knob(s)
    groups = s.groups
    if knob:
        groups = sorted(groups, key=lambda g: -math.inf if g["knobs"][knob] is None or (
            isinstance(g["knobs"][knob], float) and math.isnan(g["knobs"][knob]))
            else float(g["knobs"][knob]))
    for ax, col in zip(axes.ravel(), cols):
        labels = [g["label"] for g in groups]
        xs = np.arange(len(groups))
        means = [g[col][0] for g in groups]
        errs = [0 if not math.isfinite(g[col][1]) else g[col][1] for g in groups]
        ax.errorbar(xs, means, yerr=errs, fmt="o-" if knob else "o", capsize=3)
        for g, x in zip(groups, xs):
            pts = [float(r.get(col)) for r in g["rows"]
                   if isinstance(r.get(col), (int, float, np.number))]
            ax.scatter([x] * len(pts), pts, s=8, color="gray", alpha=0.6, zorder=3)
        ax.set_xticks(xs)
        short = [lab.split("=", 1)[-1] if knob else lab for lab in labels]
        ax.set_xticklabels(short, rotation=30 if max(map(len, short)) > 6 else 0, ha="right",
                           fontsize=7)
        ax.set_title(col, fontsize=9)
        ax.grid(alpha=0.3)
        if knob:
            ax.set_xlabel(knob[5:], fontsize=8)
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    fig.suptitle(f"{s.name}: final eval by configuration (mean ± std over seeds; dots = seeds)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---- scaling-law sections -------------------------------------------------------------------


def _varies(df, col: str, k: int = 2) -> bool:
    return col in df.columns and df[col].nunique() >= k


def _fx(law: str, fixed: dict[str, float] | None) -> dict[str, float]:
    from analysis.laws import get_law

    names = get_law(law).param_names
    return {k: v for k, v in (fixed or {}).items() if k in names}


def upcycled_law_section(s: Sweep, out: Path, bootstrap: int,
                         fixed: dict[str, float] | None = None) -> tuple[list[str], dict]:
    """000 §4.1: compare Eq. 8/9 with and without interaction on the D1 × D2 grid."""
    f = s.finals[s.finals["kind"] == "upcycled"] if "kind" in s.finals else s.finals
    if not {"D1", "D2", "val_loss"} <= set(f.columns):
        return [], {}
    f = f[(f["D1"] > 0) & (f["D2"] > 0) & np.isfinite(f["val_loss"].astype(float))]
    if not (_varies(f, "D1") and _varies(f, "D2")) or len(f) < 8:
        return [], {}
    lines = ["## Scaling law of D1 and D2 (000 §4.1, Table 1)", ""]
    fits = {}
    for name in UPCYCLED_FORMS:
        try:
            fits[name] = fit(name, load_points(f, name), loo=True, fixed=_fx(name, fixed))
        except FitError as e:
            lines.append(f"- {name}: fit failed ({e})")
    if not fits:
        return lines, {}
    best = min(fits, key=lambda n: fits[n].loo["rms_ln"])
    rows = [[n + (" **(best)**" if n == best else ""), len(fits[n].params) - len(fits[n].fixed),
             fits[n].rms_nats, fits[n].loo["rms_nats"], fits[n].loo["rms_ln"]] for n in fits]
    lines += [f"{len(f)} trials (each trial's final eval). Huber δ = 1e-3 on ln L, L-BFGS-B "
              "from a grid; leave-one-out RMS as in 000 Table 1.", ""]
    lines += md_table(["law", "free params", "RMS (nats)", "LOO RMS (nats)", "LOO RMS (ln)"],
                      rows)
    bf = fit("upcycled_mul", load_points(f, "upcycled_mul"), bootstrap=bootstrap,
             fixed=_fx("upcycled_mul", fixed)) if bootstrap else fits.get("upcycled_mul")
    if bf is not None:
        prow = [[k, v, *(bf.ci[k] if bf.ci else ("—", "—"))] for k, v in bf.params.items()]
        lines += ["Eq. 8 (multiplicative, with interaction) fitted to all points"
                  + (f", {bootstrap} bootstrap resamples (95 % percentile interval)" if bootstrap
                     else "") + ":", ""]
        lines += md_table(["param", "value", "CI low", "CI high"], prow)
        edge = bf.at_bounds
        if bf.fixed:
            lines += [f"Fixed: {', '.join(f'{k} = {v:g}' for k, v in bf.fixed.items())}.", ""]
        if edge:
            lines += [f"On a bound of the fit, so not identified by these data: "
                      f"{', '.join(edge)} (fix it with `--fix`, as 000 §5 fixes E).", ""]
    # per-D1 power laws in D2 (000 Eq. 7, Fig. 4) and the exponent's trend (Eq. 10)
    per = []
    for d1, sub in f.groupby("D1"):
        if sub["D2"].nunique() < 3:
            continue
        d2 = sub["D2"].to_numpy(float)
        L = sub["val_loss"].to_numpy(float)
        lx, ly = np.log(d2), np.log(L)
        slope = float(np.polyfit(lx, ly, 1)[0])  # local log-log slope of L in D2
        per.append((float(d1), float(L[np.argmin(d2)]), float(L[np.argmax(d2)]), -slope))
    mul = fits.get("upcycled_mul")
    if per:
        lines += ["Per-D1 behaviour (000 §3.3, Fig. 4): the loss at the smallest D2 (the head "
                  "start), at the largest, and the log-log slope −d ln L/d ln D2; the fitted "
                  "effective exponent of Eq. 8 is α2 − α3·ln D1.", ""]
        prow = []
        for d1, first, last, sl in per:
            eff = (mul.params["alpha2"] - mul.params["alpha3"] * math.log(d1)) if mul else math.nan
            prow.append([int(d1), first, last, sl, eff])
        lines += md_table(["D1", "L at min D2", "L at max D2", "−slope", "α2 − α3·ln D1"], prow)
    info = {"fits": {n: r.to_dict() for n, r in fits.items()}, "best": best, "per_d1": per}
    if bf is not None and bf.ci and "upcycled_mul" in info["fits"]:
        info["fits"]["upcycled_mul"]["ci"] = {k: list(v) for k, v in bf.ci.items()}
        info["fits"]["upcycled_mul"]["bootstrap_n"] = bootstrap
    # plots: data vs best fit, residuals
    plt = _plt()
    law_fit = fits[best]
    from analysis.laws import get_law

    law = get_law(best)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    cmap = plt.get_cmap("viridis")
    d1s = sorted(f["D1"].unique())
    for i, d1 in enumerate(d1s):
        sub = f[f["D1"] == d1].sort_values("D2")
        c = cmap(i / max(1, len(d1s) - 1))
        ax.scatter(sub["D2"], sub["val_loss"], color=c, s=18)
        grid = np.exp(np.linspace(np.log(f["D2"].min()), np.log(f["D2"].max()), 50))
        ax.plot(grid, law.predict(law_fit.params, {"D1": np.full(50, d1), "D2": grid}),
                color=c, lw=1, label=f"D1={int(d1):,}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    from matplotlib.ticker import FormatStrFormatter

    ax.yaxis.set_major_formatter(FormatStrFormatter("%.2f"))
    ax.yaxis.set_minor_formatter(FormatStrFormatter("%.2f"))
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_xlabel("D2 (tokens after upcycling)")
    ax.set_ylabel("val loss")
    ax.set_title(f"data and {best} fit", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    pts = load_points(f, best)
    ax2.scatter(pts.x["D2"], law_fit.residuals, c=np.log(pts.x["D1"]), cmap="viridis", s=18)
    ax2.axhline(0, color="k", lw=0.8)
    ax2.set_xscale("log")
    ax2.set_xlabel("D2")
    ax2.set_ylabel("ln L̂ − ln L")
    ax2.set_title("residuals (colour = ln D1)", fontsize=9)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    p = out / "law_fit.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    lines += [f"![law fit]({p.name})", ""]
    p2 = plot_d_star(out / "d_star.png", mul.params if mul else None)
    lines += ["D* (000 Eq. 13) from 000 Table 2's published parameters, numerically and by "
              "Eq. 2; this sweep has one model size, so it cannot fit the N1 dependence.", "",
              f"![D*]({p2.name})", ""]
    return lines, info


def plot_d_star(path: Path, _fitted: dict | None = None) -> Path:
    from analysis.derived import d_star, d_star_approx

    plt = _plt()
    n1 = np.exp(np.linspace(np.log(5e8), np.log(1e11), 30))
    num = [d_star(TABLE2["moe"], TABLE2["upcycled"], float(n)) for n in n1]
    app = [d_star_approx(float(n)) for n in n1]
    fig, ax = plt.subplots(figsize=(5, 3.6))
    ax.plot(n1, num, label="Eq. 13, solved numerically")
    ax.plot(n1, app, "--", label="Eq. 2 approximation")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("N1 (dense non-embedding parameters)")
    ax.set_ylabel("D* (tokens)")
    ax.set_title("upcycling beats from-scratch MoE below D* (000 Table 2)", fontsize=8)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def model_config_section(s: Sweep) -> tuple[list[str], dict]:
    f = s.finals
    if "N_total" not in f.columns or "N2" not in f.columns:
        return [], {}
    P = f["N_total"] / f["N2"]
    if P.nunique() < 2 or f["N2"].nunique() < 2 or len(f) < 7:
        return [], {}
    lines = ["## Scaling law of sparsity and active parameters (000 §4.2, App. D.1)", ""]
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
    return lines, {n: r.to_dict() for n, r in fits.items()}


# ---- expert upcycling efficiency (003 Eq. 4) ------------------------------------------------


def efficiency_rows(s: Sweep, baseline: Sweep) -> list[dict[str, Any]]:
    """η per upcycled trial: Fixed-E and Fixed-mE from-scratch runs at the same total tokens."""
    from analysis.derived import upcycling_efficiency

    base = baseline.finals
    if "moe.num_experts" not in base.columns:
        raise FitError(f"{baseline.path}: the baseline has no moe.num_experts column")
    out = []
    for _, r in s.finals.iterrows():
        if r.get("upcycle.method") != "expand_experts":
            continue
        E, mE = r.get("parent.num_experts"), r.get("moe.num_experts")
        T = float(r.get("D1") or 0) + float(r.get("tokens") or 0)

        def loss_at(e, T=T):
            b = base[(base["moe.num_experts"] == e) & (np.isclose(base["tokens"], T, rtol=1e-3))]
            return (float(b["val_loss"].mean()), len(b)) if len(b) else (math.nan, 0)

        (lE, nE), (lmE, nmE) = loss_at(E), loss_at(mE)
        eta = upcycling_efficiency(lE, float(r["val_loss"]), lmE) \
            if nE and nmE and lE != lmE else math.nan
        out.append({"trial_id": r["trial_id"], "tau": float(r.get("D1") or 0), "T": T,
                    "cpt": float(r.get("tokens") or 0),
                    "strategy": r.get("upcycle.strategy"), "L_up": float(r["val_loss"]),
                    "L_fixed_E": lE, "L_fixed_mE": lmE, "n_baseline": min(nE, nmE), "eta": eta,
                    "E": E, "mE": mE})
    return sorted(out, key=lambda d: (d["strategy"] or "", d["tau"], d["cpt"]))


def transition_rows(s: Sweep) -> list[dict[str, Any]]:
    """Per upcycled configuration: the parent's final val loss (from the parent cache next to the
    results) and the loss right after upcycling (the trial's step-0 eval). Function-preserving
    operators keep the two equal (000 §3.3, 004 §2.3; 003 Def. 3.1: "gap below 1e-2")."""
    if "parent_key" not in s.rows.columns or "step" not in s.rows.columns:
        return []
    root = s.path if s.path.is_dir() else s.path.parent
    start = s.rows[s.rows["step"] == 0].drop_duplicates("trial_id").set_index("trial_id")
    out = []
    for g in s.groups:
        jumps = []
        for r in g["rows"]:
            key, tid = r.get("parent_key"), r.get("trial_id")
            meta = root / "parents" / str(key) / "meta.json"
            if not isinstance(key, str) or tid not in start.index or not meta.exists():
                continue
            lp = json.loads(meta.read_text()).get("val_loss")
            l0 = start.loc[tid, "val_loss"]
            if isinstance(lp, (int, float)) and l0 is not None and math.isfinite(float(l0)):
                jumps.append((float(lp), float(l0)))
        if jumps:
            lp, l0 = np.mean([j[0] for j in jumps]), np.mean([j[1] for j in jumps])
            out.append({"label": g["label"], "L_parent": float(lp), "L_start": float(l0),
                        "jump": float(l0 - lp), "n": len(jumps),
                        "method": g["rows"][0].get("upcycle.method")})
    return out


def transition_section(s: Sweep) -> tuple[list[str], list[dict]]:
    rows = transition_rows(s)
    if not rows:
        return [], []
    lines = ["## Loss at the transition", "",
             "The parent's final val loss against the trial's first eval right after upcycling "
             "(mean over seeds): a function-preserving operator keeps them equal.", ""]
    lines += md_table(["configuration", "parent", "after upcycling", "jump"],
                      [[r["label"], r["L_parent"], r["L_start"], f"{r['jump']:+.4f}"]
                       for r in rows])
    return lines, rows


def efficiency_section(s: Sweep, baseline: Sweep | None) -> tuple[list[str], list[dict]]:
    if baseline is None or "upcycle.method" not in s.finals.columns or not (
            s.finals["upcycle.method"] == "expand_experts").any():
        return [], []
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
    return lines, rows


# ---- the report -----------------------------------------------------------------------------


def report(results: str | Path, out: str | Path | None = None, *,
           baseline: str | Path | None = None, bootstrap: int = 200,
           fixed: dict[str, float] | None = None) -> Path:
    """Write ``report.md`` and its PNGs for one sweep's results directory; returns the path."""
    from analysis.claims import evaluate_claims

    s = load_sweep(results)
    out_dir = Path(out) if out else (s.path if s.path.is_dir() else s.path.parent)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = load_sweep(baseline) if baseline else None
    lines = [f"# Sweep report: {s.name}", "",
             f"Results: `{s.path}`; {len(s.finals)} finished trials; generated by "
             f"`python -m analysis.report`.", ""]
    led = ledger(s)
    lines += ["## Compute ledger", ""]
    lrows = [["trials (finished / all)", f"{led['ok']} / {led['trials']}"],
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
    lines += md_table(["", "value"], lrows)
    knob_cols = [k[5:] for k in s.knobs]
    lines += ["## Results by configuration", "",
              f"Knobs: {', '.join(knob_cols) or '(none)'}; mean ± std over seeds of each "
              "trial's final eval, best first.", ""]
    stat_cols = [c for c in STATS if any(math.isfinite(g[c][0]) for g in s.groups)]
    rows = []
    for g in s.groups:
        m, sd, n = g["val_loss"]
        rows.append([g["label"], n, f"{m:.4f} ± {sd:.4f}" if math.isfinite(sd) else f"{m:.4f}",
                     *[g[c][0] for c in stat_cols]])
    lines += md_table(["configuration", "seeds", "val_loss", *stat_cols], rows)
    p = plot_curves(s, out_dir / "curves.png", baseline=base)
    if p:
        lines += [f"![curves]({p.name})", ""]
    p = plot_finals(s, out_dir / "finals.png")
    if p:
        lines += [f"![finals]({p.name})", ""]
    law_lines, law_info = upcycled_law_section(s, out_dir, bootstrap, fixed)
    lines += law_lines
    cfg_lines, cfg_info = model_config_section(s)
    lines += cfg_lines
    tr_lines, tr_rows = transition_section(s)
    lines += tr_lines
    eff_lines, eff_rows = efficiency_section(s, base)
    lines += eff_lines
    claims = evaluate_claims(s, law_info=law_info, efficiency=eff_rows, transition=tr_rows)
    if claims:
        lines += ["## Claims from the seeds", ""]
        lines += md_table(["claim", "source", "verdict", "numbers"],
                          [[c.claim, c.source, f"**{c.verdict}**", c.numbers] for c in claims])
    md = out_dir / "report.md"
    md.write_text("\n".join(lines) + "\n")
    data = {"sweep": s.name, "ledger": led, "laws": law_info, "model_config": cfg_info,
            "efficiency": eff_rows, "transition": tr_rows,
            "claims": [c.__dict__ for c in claims],
            "groups": [{"label": g["label"], "n": g["val_loss"][2], "val_loss": g["val_loss"][0],
                        "val_loss_std": g["val_loss"][1],
                        **{c: g[c][0] for c in stat_cols}} for g in s.groups]}
    (out_dir / "report.json").write_text(json.dumps(data, indent=1, default=_json_default))
    return md


def _json_default(o):
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    return str(o)


def write_index(reports: list[Path], path: Path) -> Path:
    """One page over several sweeps: the compute ledger per sweep and every claim's verdict."""
    rows, claims = [], []
    tot = {"trials": 0, "spent": 0.0, "alone": 0.0, "flops": 0.0, "wall": 0.0}
    for md in reports:
        d = json.loads(md.with_name("report.json").read_text())
        led = d["ledger"]
        link = f"[{d['sweep']}]({md.relative_to(path.parent).as_posix()})"
        spent, alone = led["tokens_spent"], led["tokens_from_scratch"]
        rows.append([link, led["ok"], spent, alone, f"{1 - spent / alone:.0%}" if alone else "—",
                     led["trial_flops"], led.get("sweep_wall_s")])
        tot["trials"] += led["ok"]
        tot["spent"] += spent
        tot["alone"] += alone
        tot["flops"] += led["trial_flops"] if math.isfinite(led["trial_flops"]) else 0
        tot["wall"] += led.get("sweep_wall_s") or 0
        claims += [[link, c["claim"], c["source"], f"**{c['verdict']}**"] for c in d["claims"]]
    rows.append(["**total**", tot["trials"], tot["spent"], tot["alone"],
                 f"{1 - tot['spent'] / tot['alone']:.0%}" if tot["alone"] else "—",
                 tot["flops"], tot["wall"]])
    lines = ["# Sweep reports", "", "Generated by `python -m analysis.report` over a folder of "
             "results. *Tokens trained*: trials, parents and shared WSD stable runs, each once, "
             "as the sweep ran them; *alone*: had every trial trained its own parent and its "
             "whole budget from the start (no shared parents, no WSD branches).", ""]
    lines += md_table(["sweep", "trials", "tokens trained", "tokens alone", "saved",
                       "trial FLOPs (6·N·D)", "wall (s)"], rows)
    if claims:
        lines += ["## Claims", ""]
        lines += md_table(["sweep", "claim", "source", "verdict"], claims)
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.report",
                                 description="Markdown report with plots for sweep results.")
    ap.add_argument("results", help="a sweep's results directory, or a folder of them")
    ap.add_argument("--out", default=None, help="write report.md and PNGs here instead")
    ap.add_argument("--baseline", default=None,
                    help="from-scratch runs (a results directory) for 003 Eq. 4's η")
    ap.add_argument("--bootstrap", type=int, default=200,
                    help="bootstrap resamples for law-parameter intervals (0: none)")
    ap.add_argument("--fix", action="append", default=[], metavar="NAME=VALUE",
                    help="hold a law parameter fixed in the fits, e.g. --fix E=1.0 (000 §5)")
    ap.add_argument("--only", default=None,
                    help="with a folder: only these sweeps (comma-separated names)")
    args = ap.parse_args(argv)
    root = Path(args.results)
    try:
        from analysis.fit import _kv

        fixed = _kv(args.fix, "--fix", True)
        if root.is_dir() and not (root / "results.parquet").exists():
            dirs = sorted(p.parent for p in root.glob("*/results.parquet"))
            if args.only:
                keep = [x.strip() for x in args.only.split(",") if x.strip()]
                missing = [k for k in keep if k not in {d.name for d in dirs}]
                if missing:
                    print(f"warning: --only: no results for {', '.join(missing)} under {root}",
                          file=sys.stderr)
                dirs = [d for d in dirs if d.name in keep]
            if not dirs:
                raise FitError(f"{root} holds no results.parquet (run python -m sweeps.run)")
            reports = []
            for d in dirs:
                out = Path(args.out) / d.name if args.out else None
                reports.append(report(d, out, baseline=args.baseline,
                                      bootstrap=args.bootstrap, fixed=fixed))
                print(reports[-1])
            print(write_index(reports, (Path(args.out) if args.out else root) / "index.md"))
        else:
            print(report(root, args.out, baseline=args.baseline, bootstrap=args.bootstrap,
                         fixed=fixed))
    except FitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

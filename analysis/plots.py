"""Every figure of a sweep report (PNG, matplotlib's Agg backend, imported on first use)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from analysis.derived import d_star, d_star_approx
from analysis.sweep import Group, Sweep
from moe_core.fsio import atomic_write
from scaling.laws import TABLE2, Points, get_law


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    plt = _plt()
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format=path.suffix[1:] or "png"))
    plt.close(fig)
    return path


def _expert_upcycling(rows) -> bool:
    return "upcycle.method" in rows.columns and bool(
        (rows["upcycle.method"] == "expand_experts").any())


def _baseline_curves(ax, s: Sweep, baseline: Sweep, metric: str) -> None:
    """The from-scratch runs in grey, per expert count, at the budget nearest the sweep's
    longest τ + CPT."""
    b = baseline.ok_rows()
    t_max = float((s.finals["D1"].fillna(0) + s.finals["tokens"]).max())
    for k, (e, sub) in enumerate(b.groupby("moe.num_experts")):
        budgets = sub["tokens_budget"].astype(float) if "tokens_budget" in sub.columns else None
        if budgets is not None and budgets.notna().any():  # the budget nearest the longest T
            sub = sub[budgets == budgets.iloc[int(np.argmin(np.abs(budgets - t_max)))]]
        for j, (_, t) in enumerate(sub.groupby("trial_id")):
            t = t.sort_values("step")
            ax.plot(t["tokens"], t[metric], color=["0.35", "0.65"][k % 2], lw=1.0,
                    ls=["-", "--"][j % 2], zorder=0,
                    label=f"from scratch, {int(e)} experts" if j == 0 else None)


def curve_limits(rows, metric: str, total: bool = False
                 ) -> tuple[tuple[float, float], tuple[float, float]]:
    """(x, y) limits of ``curves.png`` from the sweep's own curves: every eval of an upcycled
    (or branched) trial, its transition start included (step 0 is the upcycled model, and the
    evals right after a LR reset are its transition); a from-scratch trial's step 0 (the
    random-init loss, ln V) is left out of the y range. The x range spans the sweep's own
    evals, from its first (τ for expert upcycling drawn against total tokens), so baselines
    drawn from 0 never shrink it."""
    m = rows[metric].astype(float)
    step = rows["step"].fillna(0).astype(float) if "step" in rows.columns else m * 0
    upcycled = rows["D1"].fillna(0).astype(float) > 0 if "D1" in rows.columns else m < -np.inf
    if "kind" in rows.columns:  # a pretrained parent's D1 may be unknown (0): still upcycled
        upcycled = upcycled | (rows["kind"] == "upcycled")
    keep = (upcycled | (step > 0)) & np.isfinite(m)
    if not keep.any():
        keep = np.isfinite(m)
    lo, hi = float(m[keep].min()), float(m[keep].max())
    pad = (hi - lo) or abs(hi) * 0.05 or 1.0
    x = rows["tokens"].astype(float) + (rows["D1"].fillna(0).astype(float) if total else 0)
    x0, x1 = float(x[np.isfinite(m)].min()), float(x[np.isfinite(m)].max())
    xpad = 0.02 * ((x1 - x0) or abs(x1) or 1.0)
    return (x0 - xpad, x1 + xpad), (lo - 0.03 * pad, hi + 0.05 * pad)


def plot_curves(s: Sweep, path: Path, metric: str = "val_loss",
                baseline: Sweep | None = None) -> Path | None:
    """The metric against tokens per trial. Expert-upcycling sweeps (MoE → MoE) are drawn
    against total tokens τ + CPT, with the from-scratch ``baseline`` runs (per expert count, the
    budget nearest the sweep's longest τ + CPT) in grey for comparison."""
    rows = s.ok_rows()
    if "tokens" not in rows.columns or metric not in rows.columns or rows.empty:
        return None
    total = _expert_upcycling(rows)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    cmap = plt.get_cmap("tab10")
    for i, g in enumerate(s.groups):
        for j, tid in enumerate(g.trials):
            t = rows[rows["trial_id"] == tid].sort_values("step")
            x = t["tokens"] + (t["D1"].fillna(0) if total else 0)
            ax.plot(x, t[metric], color=cmap(i % 10), lw=1.3, alpha=0.9,
                    ls=["-", "--", ":", "-."][j % 4], label=g.label if j == 0 else None)
    if total and baseline is not None and "moe.num_experts" in baseline.rows.columns:
        _baseline_curves(ax, s, baseline, metric)
    if total:
        ax.set_xlabel("total tokens (τ + continued pre-training)")
    else:
        ax.set_xlabel("tokens after upcycling (D2)" if (s.finals.get("D1", 0) > 0).any()
                      else "tokens")
    ax.set_ylabel(metric)
    (x0, x1), (y0, y1) = curve_limits(rows, metric, total)
    ax.set_xlim(x0, x1)
    ax.set_ylim(y0, y1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title(f"{s.name}: {metric} (line style = seed)")
    return _save(fig, path)


def _numeric_knob(s: Sweep) -> str | None:
    """The single knob that varies and is numeric (possibly with a null), if any."""
    varying = s.varied
    if len(varying) != 1:
        return None
    vals = [g.knobs[varying[0]] for g in s.groups if g.knobs[varying[0]] is not None]
    try:
        [float(v) for v in vals]
    except (TypeError, ValueError):
        return None
    return varying[0]


def _finals_panel(ax, groups: list[Group], col: str, knob: str | None) -> None:
    xs = np.arange(len(groups))
    means = [g.stat(col).mean for g in groups]
    errs = [0 if not math.isfinite(g.stat(col).std) else g.stat(col).std for g in groups]
    ax.errorbar(xs, means, yerr=errs, fmt="o-" if knob else "o", capsize=3)
    for g, x in zip(groups, xs):
        pts = g.values(col)
        ax.scatter([x] * len(pts), pts, s=8, color="gray", alpha=0.6, zorder=3)
    ax.set_xticks(xs)
    short = [g.label.split("=", 1)[-1] if knob else g.label for g in groups]
    ax.set_xticklabels(short, rotation=30 if max(map(len, short)) > 6 else 0, ha="right",
                       fontsize=7)
    ax.set_title(col, fontsize=9)
    ax.set_ylabel(METRIC_LABELS.get(col, col), fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_xlabel(knob or "configuration", fontsize=8)


METRIC_LABELS = {
    "val_loss": "validation loss (nats/token)",
    "router.cos_to_parent": "cosine to the dense parent",
    "router.max1_max2": "top-1 / top-2 router prob.",
    "router.max2_max3": "top-2 / top-3 router prob.",
    "router.expert_similarity": "mean expert similarity",
    "router.max_load": "largest expert's token share",
    "router.drop_rate": "share of tokens dropped",
    "aux_loss": "auxiliary balance loss",
}
"""The y label of each ``finals.png`` panel (units where there are any)."""


def finals_columns(s: Sweep) -> list[str]:
    """``finals.png``'s panels: val_loss, and each router statistic some trial has that is not
    the same in every trial (an all-zero drop rate of a dropless MoE says nothing)."""
    cols = ["val_loss"]
    for c in s.stat_columns:
        vals = [v for g in s.groups for v in g.values(c)]
        if vals and max(vals) - min(vals) > 1e-9 * max(1.0, abs(max(vals))):
            cols.append(c)
    return cols


def plot_finals(s: Sweep, path: Path) -> Path | None:
    """Each final metric by configuration: mean ± std over seeds, the seeds as dots, ordered by
    the knob when a single numeric knob varies; constant statistics get no panel
    (:func:`finals_columns`)."""
    if not s.groups:
        return None
    cols = finals_columns(s)
    plt = _plt()
    n = len(cols)
    ncol = min(n, 3)
    nrow = math.ceil(n / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.2 * nrow), squeeze=False)
    knob = _numeric_knob(s)
    groups = list(s.groups)
    if knob:
        groups.sort(key=lambda g: -math.inf if g.knobs[knob] is None else float(g.knobs[knob]))
    for ax, col in zip(axes.ravel(), cols):
        _finals_panel(ax, groups, col, knob)
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    fig.suptitle(f"{s.name}: final eval by configuration (mean ± std over seeds; dots = seeds)",
                 fontsize=9)
    return _save(fig, path)


def plot_law_fit(path: Path, data: Any, law: str, params: Mapping[str, float], points: Points,
                 residuals: np.ndarray) -> Path:
    """The D1 × D2 grid's final losses with the fitted law per D1 (log axes), and the
    residuals ln L̂ − ln L of ``points`` (coloured by ln D1)."""
    from matplotlib.ticker import FormatStrFormatter

    plt = _plt()
    lw = get_law(law)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    cmap = plt.get_cmap("viridis")
    d1s = sorted(data["D1"].unique())
    grid = np.exp(np.linspace(np.log(data["D2"].min()), np.log(data["D2"].max()), 50))
    for i, d1 in enumerate(d1s):
        sub = data[data["D1"] == d1].sort_values("D2")
        c = cmap(i / max(1, len(d1s) - 1))
        ax.scatter(sub["D2"], sub["val_loss"], color=c, s=18)
        ax.plot(grid, lw.predict(params, {"D1": np.full(50, d1), "D2": grid}),
                color=c, lw=1, label=f"D1={int(d1):,}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FormatStrFormatter("%.2f"))
    ax.yaxis.set_minor_formatter(FormatStrFormatter("%.2f"))
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_xlabel("D2 (tokens after upcycling)")
    ax.set_ylabel("val loss")
    ax.set_title(f"data and {law} fit", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    ax2.scatter(points.x["D2"], residuals, c=np.log(points.x["D1"]), cmap="viridis", s=18)
    ax2.axhline(0, color="k", lw=0.8)
    ax2.set_xscale("log")
    ax2.set_xlabel("D2")
    ax2.set_ylabel("ln L̂ − ln L")
    ax2.set_title("residuals (colour = ln D1)", fontsize=9)
    ax2.grid(alpha=0.3)
    return _save(fig, path)


def plot_d_star(path: Path) -> Path:
    """D* against N1 from 000 Table 2's **published** parameters (the paper's fit, not this
    sweep's): Eq. 13 solved numerically, and the Eq. 2 approximation. ``analysis.report`` draws
    it only when asked (``--paper-d-star``)."""
    plt = _plt()
    n1 = np.exp(np.linspace(np.log(5e8), np.log(1e11), 30))
    num = [d_star(TABLE2["moe"], TABLE2["upcycled"], float(n)) for n in n1]
    app = [d_star_approx(float(n)) for n in n1]
    fig, ax = plt.subplots(figsize=(5, 3.6))
    ax.plot(n1, num, color="0.3", label="paper's Table 2 law, Eq. 13 solved numerically")
    ax.plot(n1, app, "--", color="0.6", label="paper's Eq. 2 approximation")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("N1 (dense non-embedding parameters)")
    ax.set_ylabel("D* (tokens)")
    ax.set_title("PUBLISHED law (000 Table 2), not fitted to this sweep:\n"
                 "upcycling beats from-scratch MoE below D*", fontsize=8)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return _save(fig, path)

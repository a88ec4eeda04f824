"""A self-contained HTML page of a sweep (``analysis.report`` → ``report.html``) or of a
comparison of sweeps (``analysis.compare`` → ``compare.html``), drawn with plotly.

The page opens from the file without a server and loads nothing from a network: plotly's
JavaScript is inlined once in the page's head (``plotly.offline.get_plotlyjs``, the same bundle
``include_plotlyjs=True`` inlines). It reads the Parquet rows only (no torch, no Ray) and holds:

- parallel coordinates of the varied knobs → the final metric (one line per finished trial);
- the loss curves against total tokens (the parent's, D1, plus the trial's own), with the
  upcycling transition marked: a dashed line at each D1 and the parent's final loss as a point;
- the two-way views: the mean final metric of every cell of each pair of varied knobs
  (``analysis.twoway.joint_table``);
- the claims with their verdicts (the sweep page; ``analysis.claims`` computes them);
- per-layer MoE health heatmaps: MoE layer × eval, every trial's evals side by side, one per
  statistic recorded per layer (``router.<stat>.layer<i>``);
- parameter importance with its spread over seeds (``analysis.importance``);
- the run's provenance, when ``summary.json`` carries a ``provenance`` mapping.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from analysis.importance import ImportanceTable
from analysis.twoway import joint_table, knob_pairs, ok_finals, varied_knobs
from sweeps.store.results import KNOB_PREFIX, final_rows, format_knob

LAYER_COLUMN = re.compile(r"^router\.(?P<stat>[a-z0-9_]+)\.layer(?P<layer>\d+)$")
"""Per-MoE-layer health columns (``moe_core.train.evaluate.layer_health``)."""
HEALTH_TITLES = {
    "max_load": "largest expert's load share", "max_vio": "MaxVio (0 = balanced)",
    "dead_experts": "experts no token reached", "drop_rate": "share of tokens dropped",
    "max1_max2": "top-1 / top-2 router probability", "expert_similarity": "expert similarity",
}
_CSS = """body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;
font-size:13px;text-align:left;vertical-align:top}th{background:#f3f3f3}h2{margin-top:1.6em}
.verdict{font-weight:600}.note{color:#555;font-size:13px}"""


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and \
        math.isfinite(float(v)) else None


def _short(col: str) -> str:
    return col[len(KNOB_PREFIX):] if col.startswith(KNOB_PREFIX) else col


def _trial_label(r: Mapping[str, Any], knobs: Sequence[str]) -> str:
    parts = []
    for k in knobs:
        short, v = _short(k).rsplit(".", 1)[-1], format_knob(r.get(k))
        parts.append(f"{short}({v})" if "=" in v else f"{short}={v}")
    seed = r.get("seed")
    return ", ".join(parts + ([f"seed={seed}"] if _num(seed) is not None else [])) or \
        str(r.get("trial_id"))


def parallel_figure(sweeps: Mapping[str, Sequence[Mapping[str, Any]]], metric: str) -> Any:
    """Parallel coordinates: each varied knob (and the sweep, for several) → final ``metric``;
    text values become ticks on a categorical axis."""
    import plotly.graph_objects as go

    finals = [dict(r, _sweep=name) for name, rows in sweeps.items() for r in ok_finals(rows)
              if _num(r.get(metric)) is not None]
    cols = (["_sweep"] if len(sweeps) > 1 else []) + varied_knobs(finals)
    for r in finals:  # a knob of another sweep: the value this trial ran (its config column)
        for c in cols:
            if r.get(c) is None and c.startswith(KNOB_PREFIX):
                r[c] = r.get(_short(c))
    dims = []
    for c in cols:
        vals = [format_knob(r.get(c)) for r in finals]
        nums = [_num(r.get(c)) for r in finals]
        if all(n is not None for n in nums) and c != "_sweep":
            dims.append({"label": _short(c), "values": nums})
            continue
        cats = sorted(set(vals))
        dims.append({"label": "sweep" if c == "_sweep" else _short(c),
                     "values": [cats.index(v) for v in vals],
                     "tickvals": list(range(len(cats))), "ticktext": cats})
    ys = [float(r[metric]) for r in finals]
    dims.append({"label": f"final {metric}", "values": ys})
    fig = go.Figure(go.Parcoords(line={"color": ys, "colorscale": "Viridis_r",
                                       "showscale": True}, dimensions=dims))
    fig.update_layout(title=f"knobs → final {metric} ({len(finals)} finished trials)",
                      height=440, margin={"l": 170, "r": 80, "t": 110, "b": 30})
    return fig


def curves_figure(sweeps: Mapping[str, Sequence[Mapping[str, Any]]], metric: str) -> Any:
    """``metric`` against total tokens (D1 + the trial's tokens), one line per trial, with the
    upcycling transition (each D1 > 0) a dashed line and the parent's final loss a point."""
    import plotly.graph_objects as go

    fig = go.Figure()
    marks: dict[float, float | None] = {}
    for name, rows in sweeps.items():
        knobs = varied_knobs(ok_finals(rows))
        by_trial: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for r in rows:
            by_trial[str(r["trial_id"])].append(r)
        for trs in by_trial.values():
            trs = sorted(trs, key=lambda r: r.get("step") or 0)
            pts = [((_num(r.get("D1")) or 0.0) + (_num(r.get("tokens")) or 0.0),
                    _num(r[metric])) for r in trs if _num(r.get(metric)) is not None]
            if not pts:
                continue
            d1 = _num(trs[0].get("D1")) or 0.0
            if d1 > 0 and trs[0].get("kind") == "upcycled":
                marks.setdefault(d1, _num(trs[0].get("parent_val_loss")))
            label = _trial_label(trs[-1], knobs)
            fig.add_trace(go.Scatter(
                x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers",
                name=f"{name}: {label}" if len(sweeps) > 1 else label,
                hovertemplate="%{x:.3s} tokens<br>" + metric + " %{y:.4f}<extra>%{fullData.name}"
                              "</extra>"))
    for d1, parent in sorted(marks.items()):
        fig.add_vline(x=d1, line_dash="dash", line_color="#c0392b",
                      annotation_text=f"upcycled at D1={d1:.3g}", annotation_position="top")
        if parent is not None:
            fig.add_trace(go.Scatter(x=[d1], y=[parent], mode="markers", name="parent's final",
                                     marker={"symbol": "star", "size": 12, "color": "#c0392b"}))
    fig.update_layout(title=f"{metric} against total tokens (parent + trial)", height=460,
                      xaxis_title="tokens (D1 + D2)", yaxis_title=metric,
                      legend={"font": {"size": 10}})
    return fig


def twoway_figures(name: str, rows: Sequence[Mapping[str, Any]], metric: str) -> list[Any]:
    """One heatmap per pair of varied knobs: the mean final ``metric`` of each cell."""
    import plotly.graph_objects as go

    finals, out = ok_finals(rows), []
    for a, b in knob_pairs(finals):
        jt = joint_table(finals, a, b, metric)
        z = [[jt.mean(va, vb) for vb in jt.b_values] for va in jt.a_values]
        n = [[len(jt.cells.get((va, vb), ())) for vb in jt.b_values] for va in jt.a_values]
        text = [[f"{v:.4f} (n={k})" if v is not None else "" for v, k in zip(zr, nr)]
                for zr, nr in zip(z, n)]
        fig = go.Figure(go.Heatmap(z=z, x=list(jt.b_values), y=list(jt.a_values), text=text,
                                   texttemplate="%{text}", colorscale="Viridis_r",
                                   colorbar={"title": metric}))
        fig.update_layout(title=f"{name}: mean final {metric}, {_short(a)} × {_short(b)}",
                          xaxis_title=_short(b), yaxis_title=_short(a), height=380,
                          xaxis_type="category", yaxis_type="category")
        out.append(fig)
    return out


def health_figures(rows: Sequence[Mapping[str, Any]]) -> list[Any]:
    """One heatmap per per-layer health statistic: MoE layer × eval, each trial's evals in
    step order, trials side by side (the x labels say which). A statistic with one value
    everywhere gets a line of text instead (the last block)."""
    import plotly.graph_objects as go

    stats: dict[str, set[int]] = defaultdict(set)
    for c in {c for r in rows for c in r}:
        m = LAYER_COLUMN.match(c)
        if m:
            stats[m["stat"]].add(int(m["layer"]))
    knobs = varied_knobs(ok_finals(rows))
    evals = sorted(rows, key=lambda r: (str(r.get("trial_id")), r.get("step") or 0))
    evals = [r for r in evals if any(_num(r.get(f"router.max_load.layer{i}")) is not None
                                     for i in stats.get("max_load", ()))] or evals
    x = [f"{_trial_label(r, knobs)} · step {r.get('step')}" for r in evals]
    out: list[Any] = []
    constant = []
    for stat in [s for s in HEALTH_TITLES if s in stats] + sorted(set(stats) - set(HEALTH_TITLES)):
        layers = sorted(stats[stat])
        z = [[_num(r.get(f"router.{stat}.layer{i}")) for r in evals] for i in layers]
        seen = {v for zr in z for v in zr if v is not None}
        if len(seen) <= 1:  # nothing to see (a dropless MoE's drop rate): said in one line
            constant += [f"router.{stat} = {next(iter(seen)):.4g}"] if seen else []
            continue
        fig = go.Figure(go.Heatmap(z=z, x=list(range(len(evals))), y=[f"layer {i}" for i in layers],
                                   customdata=[x] * len(layers), colorscale="Reds",
                                   hovertemplate="%{y}<br>%{customdata}<br>%{z:.4g}<extra>"
                                                 "</extra>", colorbar={"title": stat}))
        fig.update_layout(title=f"router.{stat} per MoE layer — {HEALTH_TITLES.get(stat, stat)}",
                          height=330 + 35 * len(layers), yaxis_type="category",
                          xaxis={"tickvals": list(range(len(evals))), "ticktext": x,
                                 "tickangle": 45, "tickfont": {"size": 8}},
                          margin={"b": 160})
        out.append(fig)
    if constant:
        out.append('<p class="note">The same in every MoE layer and eval: '
                   f'{html.escape(", ".join(constant))}.</p>')
    return out


def importance_figure(tables: Mapping[str, ImportanceTable]) -> Any | None:
    """Bars of each knob's importance (all seeds), error bars the std over seeds."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for name, t in tables.items():
        if not t.knobs:
            continue
        fig.add_trace(go.Bar(
            x=[k.knob for k in t.knobs], y=[k.importance for k in t.knobs], name=name,
            error_y={"type": "data", "visible": True,
                     "array": [k.seed_std if math.isfinite(k.seed_std) else 0 for k in t.knobs]},
            hovertext=[", ".join(f"{v:.3f}" for v in k.per_seed) for k in t.knobs]))
    if not fig.data:
        return None
    t0 = next(iter(tables.values()))
    fig.update_layout(title=f"parameter importance for the final {t0.metric} ({t0.evaluator}; "
                            "error bars: std over seeds)", yaxis_title="importance (sums to 1)",
                      height=380, barmode="group")
    return fig


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "") -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f'<table class="{cls}"><tr>{head}</tr>{body}</table>'


def _flatten(d: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    out = []
    for k, v in d.items():
        if isinstance(v, Mapping) and v:
            out += _flatten(v, f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", v if isinstance(v, str) else json.dumps(v, default=str)))
    return out


def claims_html(claims: Sequence[Mapping[str, Any]]) -> str:
    if not claims:
        return ""
    rows = [[c.get("claim", "") + (f" [at {c['stratum']}]" if c.get("stratum") else ""),
             c.get("source", ""), c.get("verdict", ""), c.get("numbers", "")] for c in claims]
    return "<h2>Claims from the seeds</h2>" + _table(["claim", "source", "verdict", "numbers"],
                                                     rows, "claims")


def provenance_html(summary: Mapping[str, Any] | None) -> str:
    prov = (summary or {}).get("provenance")
    if not isinstance(prov, Mapping) or not prov:
        return ""
    return "<h2>Provenance</h2>" + _table(["key", "value"], _flatten(prov), "provenance")


def page(title: str, blocks: Sequence[Any]) -> str:
    """The page: plotly's JavaScript inlined once, then each block (a plotly figure, or HTML
    text) in order."""
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    parts = []
    for b in blocks:
        if isinstance(b, str):
            parts.append(b)
        else:
            parts.append(pio.to_html(b, full_html=False, include_plotlyjs=False,
                                     config={"displaylogo": False, "responsive": True}))
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
            f"<script type=\"text/javascript\">{get_plotlyjs()}</script></head><body>"
            f"<h1>{html.escape(title)}</h1>" + "\n".join(parts) + "</body></html>\n")


def sweep_page(name: str, rows: Sequence[Mapping[str, Any]], *, metric: str = "val_loss",
               importance: ImportanceTable | None = None,
               claims: Sequence[Mapping[str, Any]] = (),
               summary: Mapping[str, Any] | None = None) -> str:
    """One sweep's page (module docstring)."""
    ok = len([r for r in final_rows(rows) if r.get("status") == "ok"])
    blocks: list[Any] = [f'<p class="note">{ok} finished trials, {len(rows)} evals; '
                         "generated from results.parquet.</p>"]
    blocks += ["<h2>Knobs → metric</h2>", parallel_figure({name: rows}, metric),
               "<h2>Curves</h2>", curves_figure({name: rows}, metric)]
    tw = twoway_figures(name, rows, metric)
    if tw:
        blocks += ["<h2>Two knobs at a time</h2>", *tw]
    imp = importance_figure({name: importance}) if importance else None
    if imp is not None:
        blocks += ["<h2>Parameter importance</h2>", imp,
                   f'<p class="note">{html.escape(importance.spread)}.</p>']
    hf = health_figures(rows)
    if hf:
        blocks += ["<h2>MoE health per layer</h2>", *hf]
    blocks += [claims_html(claims), provenance_html(summary)]
    return page(f"Sweep: {name}", blocks)


def compare_page(sweeps: Mapping[str, Sequence[Mapping[str, Any]]], *, metric: str = "val_loss",
                 importance: Mapping[str, ImportanceTable] | None = None) -> str:
    """The comparison's page: the sweeps' knobs → metric together, their curves overlaid, each
    sweep's two-way views and per-layer health, their importances side by side."""
    blocks: list[Any] = ["<h2>Knobs → metric</h2>", parallel_figure(sweeps, metric),
                         "<h2>Curves</h2>", curves_figure(sweeps, metric)]
    imp = importance_figure(importance or {})
    if imp is not None:
        blocks += ["<h2>Parameter importance</h2>", imp]
    for name, rows in sweeps.items():
        tw, hf = twoway_figures(name, rows, metric), health_figures(rows)
        if tw or hf:
            blocks += [f"<h2>{html.escape(name)}</h2>", *tw, *hf]
    return page("Comparison: " + ", ".join(sweeps), blocks)

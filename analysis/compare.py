"""python -m analysis.compare RESULTS_A [RESULTS_B ...] [--metric val_loss] [--out DIR]

Side-by-side comparison of sweeps from their Parquet results: for every knob value (the seed is
not a knob: it is pooled), the best and median final metric and the trial count per sweep (a
rich table and ``compare.md``), and PNG plots of the curves (metric vs tokens) coloured by knob
value; for every pair of varied knobs the joint table and an interaction plot
(``analysis.twoway``); and the cells two sweeps share (the same configuration, seeds aside) in a
table and overlaid; each sweep's parameter importance (``analysis.importance``, also as
``importance.json``); and ``compare.html``, a self-contained interactive page of all of it
(``analysis.html_page``). W&B shows the same comparison as one grouping: runs carry the sweep
name as group and the knobs as config.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from analysis.html_page import compare_page
from analysis.importance import EVALUATORS, importance
from analysis.twoway import (
    SEED_KNOB,
    plot_overlay,
    shared_cells,
    shared_markdown,
    twoway_lines,
)
from analysis.twoway import colors as qualitative
from moe_core.errors import UpcycleError, cli_boundary
from moe_core.fsio import atomic_write, atomic_write_text
from moe_core.outdir import claim_out_dir, mark_out_dir
from sweeps.store.results import RESULTS_FILE, final_rows, format_knob, read_rows
from sweeps.store.storage import Location, is_url


def load(path: str) -> tuple[str, list[dict[str, Any]]]:
    """A sweep's rows from its results folder or file (a local path or a URL)."""
    p = Location.of(path)
    f = p / RESULTS_FILE if p.is_dir() else p
    if not f.exists():
        raise UpcycleError(f"{path}: no {RESULTS_FILE} (run python -m sweeps.run first)")
    rows = read_rows(f)
    if not rows:
        raise UpcycleError(f"{f} has no rows")
    return str(rows[0].get("sweep") or p.name), rows


def labelled(loaded) -> dict[str, list[dict[str, Any]]]:
    """Results keyed by sweep name; results of one spec run twice (other ``--set`` or
    ``--results``) are told apart by their folder, never merged or dropped."""
    loaded = [(name, path if is_url(path) else str(Path(path)), rows)
              for path, (name, rows) in loaded]
    names = [n for n, _, _ in loaded]
    out: dict[str, list[dict[str, Any]]] = {}
    for name, path, rows in loaded:
        label = name if names.count(name) == 1 else f"{name} ({path})"
        while label in out:  # the same folder twice
            label += "'"
        out[label] = rows
    return out


def knob_columns(rows: list[dict[str, Any]]) -> list[str]:
    """Knob columns, the seed left out (its values are replicates, pooled in every cell)."""
    return sorted({k for r in rows for k in r if k.startswith("knob.") and k != SEED_KNOB})


def summarize(sweeps: dict[str, list[dict[str, Any]]], metric: str) -> list[dict[str, Any]]:
    """One line per (sweep, knob, value): n, best and median of the final metric."""
    out = []
    for name, rows in sweeps.items():
        finals = [r for r in final_rows(rows) if r.get("status") == "ok"]
        for knob in knob_columns(rows):
            groups: dict[str, list[float]] = defaultdict(list)
            for r in finals:
                v = r.get(metric)
                if isinstance(v, (int, float)) and not math.isnan(v):
                    groups[format_knob(r.get(knob))].append(v)
            for value, vals in sorted(groups.items()):
                out.append({"sweep": name, "knob": knob[5:], "value": value, "n": len(vals),
                            "best": min(vals), "median": statistics.median(vals)})
    return out


def plot(sweeps: dict[str, list[dict[str, Any]]], metric: str, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for name, rows in sweeps.items():
        knobs = knob_columns(rows) or [None]
        for knob in knobs:
            fig, ax = plt.subplots(figsize=(6, 4))
            by_trial: dict[str, list[dict[str, Any]]] = defaultdict(list)
            for r in rows:
                by_trial[r["trial_id"]].append(r)
            values = sorted({format_knob(r.get(knob)) for r in rows}) if knob else ["all"]
            # qualitative: two values are two hues (not viridis' purple and pale yellow)
            colors = dict(zip(values, qualitative(len(values))))
            seen = set()
            for trs in by_trial.values():
                trs = sorted(trs, key=lambda r: r.get("step") or 0)
                xs = [r.get("tokens") or 0 for r in trs if r.get(metric) is not None]
                ys = [r[metric] for r in trs if r.get(metric) is not None]
                v = format_knob(trs[0].get(knob)) if knob else "all"
                ax.plot(xs, ys, color=colors[v], label=None if v in seen else v, alpha=0.8)
                seen.add(v)
            ax.set_xlabel("tokens")
            ax.set_ylabel(metric)
            ax.set_title(f"{name}: {metric} by {knob[5:] if knob else 'trial'}")
            ax.legend(fontsize=7)
            fig.tight_layout()
            stem = re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_")
            p = out / f"{stem}_{(knob or 'trials').replace('.', '_')}.png"
            atomic_write(p, lambda tmp, fig=fig: fig.savefig(tmp, dpi=110, format="png"))
            plt.close(fig)
            paths.append(p)
    return paths


@cli_boundary(kept="the inputs are unchanged")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="results directories (results/<sweep>)")
    ap.add_argument("--metric", default="val_loss")
    ap.add_argument("--out", default=None, help="output directory (default results/compare)")
    ap.add_argument("--mode", choices=("min", "max"), default="min")
    ap.add_argument("--importance", choices=EVALUATORS, default="ped_anova",
                    help="parameter importance evaluator (optuna.importance)")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    args = ap.parse_args(argv)
    # results on object storage: a local ./compare (never a folder named after a URL)
    out = Path(args.out or ("compare" if is_url(args.results[0]) else
                            Path(args.results[0]).parent / "compare"))
    # never a folder it did not write, nor an input
    claim_out_dir(out, inputs=[p for p in args.results if not is_url(p)])
    sweeps = labelled((p, load(p)) for p in args.results)
    mark_out_dir(out, "analysis.compare")
    lines = summarize(sweeps, args.metric)
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"final {args.metric} by knob value")
    for c in ("sweep", "knob", "value", "n", "best", "median"):
        t.add_column(c)
    md = [f"| sweep | knob | value | n | best {args.metric} | median |",
          "|---|---|---|---|---|---|"]
    for r in lines:
        t.add_row(r["sweep"], r["knob"], r["value"], str(r["n"]), f"{r['best']:.4f}",
                  f"{r['median']:.4f}")
        md.append(f"| {r['sweep']} | {r['knob']} | {r['value']} | {r['n']} | {r['best']:.4f} "
                  f"| {r['median']:.4f} |")
    Console().print(t)
    pngs = plot(sweeps, args.metric, out)
    md += ["", *(f"![{p.stem}]({p.name})" for p in pngs), ""]
    more, n_more = _two_way(sweeps, args.metric, out)
    imp = {name: importance(rows, args.metric, args.mode, args.importance)
           for name, rows in sweeps.items()}
    for name, tab in imp.items():
        if tab.knobs:
            more += [f"## {name}: parameter importance", "", *tab.markdown()]
            print(f"{name}: " + ", ".join(f"{k.knob} {k.importance:.3f}" for k in tab.knobs))
    atomic_write_text(out / "compare.md", "\n".join(md + more) + "\n")
    atomic_write_text(out / "compare.html", compare_page(sweeps, metric=args.metric,
                                                         importance=imp))
    atomic_write_text(out / "importance.json", json.dumps(
        {n: t.to_json() for n, t in imp.items()}, indent=1, default=str) + "\n")
    print(f"wrote {out / 'compare.md'}, {out / 'compare.html'} and {len(pngs) + n_more} plot(s)")
    return 0


def _two_way(sweeps: dict[str, list[dict[str, Any]]], metric: str,
             out: Path) -> tuple[list[str], int]:
    """Joint tables per pair of varied knobs, and the cells sweeps share (printed too)."""
    lines: list[str] = []
    n = 0
    for name, rows in sweeps.items():
        stem = re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_")
        got, pngs = twoway_lines(name, rows, metric, out, stem)
        if got:
            lines += [f"## {name}: two knobs at a time", "", *got]
            print(f"{name}:\n" + "\n".join(ln for ln in got if ln.startswith("|")
                                              or ln.startswith(metric)))
        n += len(pngs)
    cells = shared_cells(sweeps, metric)
    if cells:
        lines += ["## Cells the sweeps share (same configuration, seeds aside)", "",
                  *shared_markdown(cells, metric)]
        print("\n".join(shared_markdown(cells, metric)))
        by_pair: dict[tuple[str, str], list[Any]] = defaultdict(list)
        for c in cells:
            by_pair[c.sweeps].append(c)
        for (a, b), cs in by_pair.items():
            stem = re.sub(r"[^A-Za-z0-9_-]+", "_", f"shared_{a}_{b}").strip("_")
            p = plot_overlay(sweeps, cs, metric, out / f"{stem}.png")
            lines += [f"![{stem}]({p.name})", ""]
            n += 1
    return lines, n


if __name__ == "__main__":
    sys.exit(main())

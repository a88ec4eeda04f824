"""python -m sweeps.compare RESULTS_A [RESULTS_B ...] [--metric val_loss] [--out DIR]

Side-by-side comparison of sweeps from their Parquet results: for every knob value, the best and
median final metric and the trial count per sweep (a rich table and ``compare.md``), and PNG
plots of the curves (metric vs tokens) coloured by knob value. W&B shows the same comparison as
one grouping: runs carry the sweep name as group and the knobs as config.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from moe_core.errors import UpcycleError
from moe_core.fsio import atomic_write, atomic_write_text
from sweeps.results import RESULTS_FILE, final_rows, format_knob, read_rows
from sweeps.storage import Location, is_url


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
    return sorted({k for r in rows for k in r if k.startswith("knob.")})


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
            colors = {v: plt.cm.viridis(i / max(1, len(values) - 1)) for i, v in
                      enumerate(values)}
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sweeps.compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="results directories (results/<sweep>)")
    ap.add_argument("--metric", default="val_loss")
    ap.add_argument("--out", default=None, help="output directory (default results/compare)")
    args = ap.parse_args(argv)
    try:
        sweeps = labelled((p, load(p)) for p in args.results)
    except UpcycleError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # results on object storage: a local ./compare (never a folder named after a URL)
    out = Path(args.out or ("compare" if is_url(args.results[0]) else
                            Path(args.results[0]).parent / "compare"))
    out.mkdir(parents=True, exist_ok=True)
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
    atomic_write_text(out / "compare.md", "\n".join(md) + "\n\n" + "\n".join(
        f"![{p.stem}]({p.name})" for p in pngs) + "\n")
    print(f"wrote {out / 'compare.md'} and {len(pngs)} plot(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

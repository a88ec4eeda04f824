"""Everything the sweep prints: the plan (``--dry-run``), progress lines and the ranked table.

Progress goes to stderr, tables to stdout (rich); nothing here decides anything.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from sweeps.plan import SweepPlan
from sweeps.results import KNOB_PREFIX, format_knob
from sweeps.spec import SweepSpec


def progress(msg: str) -> None:
    print(f"[sweeps] {msg}", file=sys.stderr, flush=True)


def eta(done: int, total: int, started: float) -> str:
    if done == 0:
        return "?"
    left = (time.time() - started) / done * (total - done)
    return f"{left / 60:.1f} min" if math.isfinite(left) else "?"


def print_plan(spec: SweepSpec, plan: SweepPlan) -> None:
    con = Console()
    con.print(f"[bold]sweep[/] {spec.name}  ({spec.path})  algorithm={spec.algorithm} "
              f"scheduler={spec.scheduler} num_samples={spec.num_samples}")
    t = Table(title="trials (grid points × num_samples)")
    keys = sorted({k for tr in plan.trials for k in tr.point})
    for k in keys + ["tokens", "N_active", "parent"]:
        t.add_column(k)
    for tr in plan.trials:
        t.add_row(*[str(tr.point.get(k, "")) for k in keys],
                  f"{tr.tokens:,}", f"{tr.N_active:,}", str(tr.parent_key or "-"))
    con.print(t)
    if plan.sampled:
        con.print(f"sampled knobs: {', '.join(plan.sampled)}")
    con.print(f"trials: {plan.num_trials}   distinct parents: {len(plan.parents)}")
    con.print(f"trial tokens: {plan.trial_tokens:,}   trial FLOPs (6·N·D): "
              f"{plan.trial_flops:.3e}")
    con.print(f"parent tokens: {plan.parent_tokens:,}   parent FLOPs: "
              f"{plan.parent_flops:.3e}   tokens saved by sharing parents: "
              f"{plan.tokens_saved_by_sharing:,}")
    con.print(f"WSD stable runs shared by token-budget grids: {len(plan.branch_groups)}   "
              f"stable tokens saved by branching: {plan.tokens_saved_by_branches:,}")


def print_ranked(spec: SweepSpec, finals: Sequence[Mapping[str, Any]],
                 summary: Mapping[str, Any]) -> None:
    metric = spec.metric
    knobs = sorted({k for r in finals for k in r if k.startswith(KNOB_PREFIX)})
    sign = 1 if spec.mode == "min" else -1

    def key(r):
        v = r.get(metric)
        return (0, sign * v) if isinstance(v, (int, float)) and v == v else (1, 0)

    t = Table(title=f"{spec.name}: trials ranked by {metric} ({spec.mode})")
    for c in ["#", "trial", *[k[len(KNOB_PREFIX):] for k in knobs], metric, "tokens", "status"]:
        t.add_column(c)
    for i, r in enumerate(sorted(finals, key=key), 1):
        v = r.get(metric)
        t.add_row(str(i), str(r["trial_id"]), *[format_knob(r.get(k)) for k in knobs],
                  f"{v:.4f}" if isinstance(v, (int, float)) and v == v else "-",
                  f"{r.get('tokens') or 0:,}", str(r.get("status")))
    con = Console()
    con.print(t)
    con.print(f"results: {summary['results']}   wall {summary['wall_s']} s "
              f"(parents and stable runs {summary['parent_wall_s']} s)   tokens saved: "
              f"{summary['tokens_saved_by_sharing']:,} by shared parents, "
              f"{summary['tokens_saved_by_branches']:,} by WSD branches")

"""Everything the sweep prints: the plan (``--dry-run``), progress lines and the ranked table.

Progress goes to stderr (a line per running trial every ``PROGRESS_EVERY_S`` seconds,
:class:`Ticker`), tables to stdout (rich); nothing here decides anything.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from sweeps.plan import schedule
from sweeps.plan.build import SweepPlan, disk_estimate
from sweeps.plan.cost import forecast, jobs_from_plan, parent_rank_counts, trial_gpus
from sweeps.plan.resources import PARENT_RANKS_AUTO_CAP, describe, local_cluster, resolve
from sweeps.spec.algorithm import plugins
from sweeps.spec.sweep import SweepSpec
from sweeps.store.results import KNOB_PREFIX, format_knob

WIDE = 1000
"""Columns of a table printed when stdout is not a terminal (a log file, a pipe): wide enough
that rich never cuts a trial id or a knob name (a terminal keeps its own width)."""


def wide_width() -> int | None:
    """None (rich measures the terminal) on a terminal or with ``COLUMNS`` set; else ``WIDE``."""
    return None if sys.stdout.isatty() or os.environ.get("COLUMNS") else WIDE


def make_console() -> Console:
    """Full-width tables when not a terminal (rich would cut them to 80 columns) and lines
    never wrapped there."""
    w = wide_width()
    return Console(width=w, soft_wrap=w is not None)


def progress(msg: str) -> None:
    print(f"[sweeps] {msg}", file=sys.stderr, flush=True)


def eta(done: int, total: int, started: float) -> str:
    if done == 0:
        return "?"
    left = (time.time() - started) / done * (total - done)
    return f"{left / 60:.1f} min" if math.isfinite(left) else "?"


def print_plan(spec: SweepSpec, plan: SweepPlan) -> None:
    con = make_console()
    con.print(f"[bold]sweep[/] {spec.name}  ({spec.path})  algorithm={spec.algorithm} "
              f"scheduler={spec.scheduler} num_samples={spec.num_samples}")
    search, sched = plugins(spec)
    for line in sched.describe_plan(spec, plan):
        con.print(line, markup=False)
    if spec.prune:
        con.print("prune: " + "; ".join(
            f"{name} above {r.above:g}" + (f" for {r.for_evals} evals" if r.for_evals > 1 else "")
            + (f" after {r.after_tokens:,.0f} tokens" if r.after_tokens else "")
            for name, r in spec.prune.rules), markup=False)
    for line in search.describe_plan(spec, plan):
        con.print(line, markup=False)
    t = Table(title=search.plan_title)
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
    con.print(disk_line(spec, plan), highlight=False)
    cluster = local_cluster()  # --dry-run starts no Ray: auto resolves as on this machine
    for line in describe(spec, resolve(spec, cluster), cluster, "this machine"):
        con.print(line, markup=False, highlight=False, soft_wrap=True)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def disk_line(spec: SweepSpec, plan: SweepPlan) -> str:
    """The disk-use estimate of ``--dry-run``: checkpoints (the spec's ``checkpoint:``), the
    parents' cache and the WSD stable runs."""
    d = disk_estimate(spec, plan)
    c = spec.checkpoint
    cadence = ", ".join(x for x in (
        f"every {c.every_evals} evals" if c.every_evals else "",
        f"every {c.every_minutes:g} min" if c.every_minutes else "",
        "at the end" if c.at_end else "") if x) or "never"
    return (f"disk (estimate): checkpoint {human_bytes(d.checkpoint_bytes)} per trial "
            f"({d.params:,} params × {d.bytes_per_param} B: weights + 2 fp32 Adam moments"
            f"{' + fp32 master' if d.bytes_per_param == 14 else ''}; {cadence}); "
            f"{human_bytes(d.running_bytes)} while {d.concurrent} trials run "
            f"({d.keep} kept + 1 being saved + 1 local each); "
            f"{human_bytes(d.kept_bytes)} kept after the sweep ({d.keep} × {d.trials} trials); "
            f"parents' cache {human_bytes(d.parent_bytes)} ({len(plan.parents)}); "
            f"WSD stable runs {human_bytes(d.stable_bytes)}; object store (the parents' "
            f"payloads, memory) {human_bytes(d.object_store_bytes)}")


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
    con = make_console()
    con.print(t)
    con.print(f"results: {summary['results']}   wall {summary['wall_s']} s "
              f"(parents and stable runs {summary['parent_wall_s']} s)   tokens saved: "
              f"{summary['tokens_saved_by_sharing']:,} by shared parents, "
              f"{summary['tokens_saved_by_branches']:,} by WSD branches")


def parent_ranks_line(spec: SweepSpec, ranks: dict[str, int]) -> str:
    """How many ranks the trained parents train on (``resources.parent_ranks``)."""
    want = spec.resources.parent_ranks
    how = (f"resources.parent_ranks=auto: the GPUs its waiting trials would hold, at most "
           f"{PARENT_RANKS_AUTO_CAP}" if want == "auto" else f"resources.parent_ranks={want}")
    counts = ", ".join(f"{k[:8]} on {n} rank{'s' * (n > 1)}" for k, n in ranks.items())
    return f"  parents: {counts or 'none trained'} ({how})"


def print_forecast(spec: SweepSpec, plan: SweepPlan, *, gpu: str | None = None,
                   price: float | None = None, max_concurrent: int | None = None,
                   cluster_gpus: float | None = None) -> None:
    """The cost forecast of ``--dry-run`` (``sweeps.plan.cost``): GPU-hours (CPU trials: trial-hours
    on this machine's measured CPU), wall time at the concurrency the sweep would run with (no
    more trials at once than ``cluster_gpus``, a connected cluster's, hold: a multi-rank trial
    holds gpus × ranks), the cost at ``price`` per GPU-hour, and where each throughput figure
    comes from."""
    r = spec.resources
    device = gpu or ("cpu" if r.gpus == 0 else None)
    con = make_console()
    if device is None:
        con.print("cost forecast: pass --gpu h100|h200|a100|l4|... (and --price $/GPU-h) for "
                  "GPU-hours, wall time and cost", markup=False)
        con.print(parent_ranks_line(spec, parent_rank_counts(
            spec, plan, "gpu", max_concurrent or spec.max_concurrent)), markup=False)
        return
    conc = max_concurrent or spec.max_concurrent
    why = "max_concurrent" if conc else None
    if conc is None and device == "cpu":
        conc, why = max(1, int((os.cpu_count() or 1) // (r.cpus * r.ranks))), \
            f"{os.cpu_count()} CPUs here / resources.cpus × ranks"
    elif conc is None:
        conc, why = plan.num_trials, "no max_concurrent: every trial at once"
    conc = min(conc, plan.num_trials)
    per_trial = trial_gpus(spec, device)
    if cluster_gpus and device != "cpu" and conc * per_trial > cluster_gpus:
        conc = max(1, int(cluster_gpus // per_trial))
        why = f"{cluster_gpus:g} GPUs in the cluster / {per_trial:g} per trial"
    jobs = jobs_from_plan(spec, plan, device, conc)
    policy = schedule.policy_for(plugins(spec)[0].trains_up_front, len(plan.branch_groups),
                                 sum(j.accelerators for j in jobs if j.kind == "parent"),
                                 conc * per_trial)
    f = forecast(jobs, device, concurrency=conc, parents_parallel=max(1, conc), price=price,
                 policy=policy)
    lines = f.lines()
    lines[0] += f" ({why})"
    lines.append(parent_ranks_line(spec, parent_rank_counts(spec, plan, device, conc)))
    for line in lines:
        con.print(line, markup=False, highlight=False)


# ---- a progress line per running trial, at least every ``PROGRESS_EVERY_S`` seconds (the
# driver's Tune callback calls it at every step; ``UPCYCLE_SWEEPS_PROGRESS_S`` sets the period,
# 0 turns the lines off) ------------------------------------------------------------------------

PROGRESS_EVERY_S = 30.0
PROGRESS_ENV = "UPCYCLE_SWEEPS_PROGRESS_S"


def period() -> float:
    try:
        return float(os.environ.get(PROGRESS_ENV, PROGRESS_EVERY_S))
    except ValueError:
        return PROGRESS_EVERY_S


def tokens_per_s(rows: Mapping[int, Mapping[str, Any]]) -> float | None:
    """Tokens/s between the trial's last two rows (tokens and wall_s), or its average."""
    pts = sorted((r["tokens"], r["wall_s"]) for r in rows.values()
                 if isinstance(r.get("tokens"), (int, float)) and
                 isinstance(r.get("wall_s"), (int, float)))
    if len(pts) >= 2 and pts[-1][1] > pts[-2][1]:
        return (pts[-1][0] - pts[-2][0]) / (pts[-1][1] - pts[-2][1])
    if pts and pts[-1][1] > 0:
        return pts[-1][0] / pts[-1][1]
    return None


def _num(v: Any) -> str:
    return f"{v:.4f}" if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def line(trial_id: str, rows: Mapping[int, Mapping[str, Any]], total_steps: int | None,
         now: float, seen: float | None) -> str:
    """One trial's progress line (``seen``: when its latest row arrived)."""
    if not rows:
        return f"trial {trial_id}: running, no eval reported yet"
    step = max(rows)
    r = rows[step]
    tps = tokens_per_s(rows)
    ago = f", {now - seen:.0f} s ago" if seen is not None else ""
    return (f"trial {trial_id}: step {step}{f'/{total_steps}' if total_steps else ''}  "
            f"train_loss {_num(r.get('train_loss'))}  val_loss {_num(r.get('val_loss'))}  "
            f"{f'{tps:,.0f}' if tps else '-'} tok/s  (last eval{ago})")


class Ticker:
    """Remembers when each trial last reported and when the last lines went out."""

    def __init__(self, every_s: float | None = None, clock: Callable[[], float] = time.time):
        self.every_s = period() if every_s is None else every_s
        self.clock = clock
        self.last_print = clock()
        self.seen: dict[str, float] = {}

    def reported(self, trial_id: str) -> None:
        self.seen[trial_id] = self.clock()

    def due(self) -> bool:
        return self.every_s > 0 and self.clock() - self.last_print >= self.every_s

    def lines(self, running: Iterable[tuple[str, Mapping[int, Mapping[str, Any]],
                                            int | None]],
              setup: Callable[[list[str]], Mapping[str, str]] | None = None) -> list[str]:
        """The lines for ``(trial_id, its rows by step, its planned steps)`` of each running
        trial; marks the time. ``setup`` gives the set-up line of each trial that has no eval
        yet (``sweeps.run.setup_progress.lines_for``)."""
        now = self.last_print = self.clock()
        running = list(running)
        early = setup([t for t, rows, _ in running if not rows]) if setup else {}
        return [early.get(t) or line(t, rows, total, now, self.seen.get(t))
                for t, rows, total in running]

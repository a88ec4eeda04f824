"""python -m sweeps.run SPEC.yaml [--address auto|HOST:PORT] [--resume] [--dry-run]
                      [--set key.path=value ...] [--results DIR] [--max-concurrent N]

Validate the spec (before Ray starts), train each distinct parent once, run the trials with Ray
Tune, write ``results/<sweep>/results.parquet`` and print a ranked table of the trials.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

from moe_core.errors import UpcycleError


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m sweeps.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("spec", help="sweep spec YAML (see search_spaces/)")
    ap.add_argument("--address", default=None,
                    help="Ray cluster address (auto or HOST:PORT); default: start Ray locally")
    ap.add_argument("--resume", action="store_true",
                    help="resume the sweep's experiment directory; finished trials are kept")
    ap.add_argument("--dry-run", action="store_true",
                    help="validate and print the plan without starting Ray")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a spec key, e.g. base.optim.lr=1e-3 or num_samples=4")
    ap.add_argument("--results", default=None, help="results root (default: spec's, 'results')")
    ap.add_argument("--max-concurrent", type=int, default=None,
                    help="at most this many trials at once")
    ap.add_argument("--json", action="store_true", help="print the final summary as JSON")
    ap.add_argument("--verbose", action="store_true",
                    help="Ray Tune's status tables and the trials' own log lines")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    return ap.parse_args(argv)


def _interruptible() -> None:
    """Ctrl+C and SIGTERM stop the sweep gracefully (Tune saves the experiment state), even
    when the driver was started with SIGINT ignored (a background job of a shell)."""
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    _interruptible()
    try:
        from sweeps.spec import estimate, load_spec

        spec = load_spec(args.spec, args.overrides, results=args.results)
        plan = estimate(spec)
        if args.dry_run:
            print_plan(spec, plan)
            return 0
        from sweeps.driver import run_sweep

        summary = run_sweep(spec, plan, address=args.address, resume=args.resume,
                            max_concurrent=args.max_concurrent, verbose=args.verbose)
    except UpcycleError as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: rerun with --resume to continue; finished trials are kept",
              file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(summary, default=str))
    return 0 if summary.get("failed", 0) == 0 else 1


def print_plan(spec, plan: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    con.print(f"[bold]sweep[/] {spec.name}  ({spec.path})  algorithm={spec.algorithm} "
              f"scheduler={spec.scheduler} num_samples={spec.num_samples}")
    t = Table(title="trials (grid points × num_samples)")
    keys = sorted({k for r in plan["rows"] for k in r["point"]})
    for k in keys + ["tokens", "N_active", "parent"]:
        t.add_column(k)
    for r in plan["rows"]:
        t.add_row(*[str(r["point"].get(k, "")) for k in keys],
                  f"{r['tokens']:,}", f"{r['N_active']:,}", str(r["parent"] or "-"))
    con.print(t)
    if plan["sampled"]:
        con.print(f"sampled knobs: {', '.join(plan['sampled'])}")
    con.print(f"trials: {plan['trials']}   distinct parents: {len(plan['parents'])}")
    con.print(f"trial tokens: {plan['trial_tokens']:,}   trial FLOPs (6·N·D): "
              f"{plan['trial_flops']:.3e}")
    con.print(f"parent tokens: {plan['parent_tokens']:,}   parent FLOPs: "
              f"{plan['parent_flops']:.3e}   tokens saved by sharing parents: "
              f"{plan['tokens_saved_by_sharing']:,}")
    con.print(f"WSD stable runs shared by token-budget grids: {plan['branch_groups']}   "
              f"stable tokens saved by branching: {plan['tokens_saved_by_branches']:,}")


def eta(done: int, total: int, started: float) -> str:
    if done == 0:
        return "?"
    left = (time.time() - started) / done * (total - done)
    return f"{left / 60:.1f} min" if math.isfinite(left) else "?"


if __name__ == "__main__":
    os.environ.setdefault("WANDB_MODE", "offline")
    sys.exit(main())

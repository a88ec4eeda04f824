"""python -m sweeps.run SPEC.yaml [--address auto|HOST:PORT] [--resume] [--dry-run]
                      [--set key.path=value ...] [--results DIR] [--max-concurrent N]

Validate the spec (before Ray starts), train each distinct parent once, run the trials with Ray
Tune, write ``results/<sweep>/results.parquet`` and print a ranked table of the trials.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from moe_core.errors import SearchSpaceError, UpcycleError, one_line
from sweeps import console, signals
from sweeps.plan import build_plan
from sweeps.spec import load_spec


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
    ap.add_argument("--results", default=None,
                    help="results root: a folder, s3://BUCKET/PATH or gs://BUCKET/PATH "
                         "(default: the spec's, 'results'; docs/storage.md)")
    ap.add_argument("--max-concurrent", type=int, default=None,
                    help="at most this many trials at once")
    ap.add_argument("--json", action="store_true", help="print the final summary as JSON")
    ap.add_argument("--verbose", action="store_true",
                    help="Ray Tune's status tables and the trials' own log lines")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    return ap.parse_args(argv)


RESUME_HINT = "interrupted: rerun with --resume to continue; finished trials are kept"


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    signals.install()
    try:
        if args.max_concurrent is not None and args.max_concurrent < 1:
            raise SearchSpaceError(f"--max-concurrent={args.max_concurrent} must be >= 1")
        spec = load_spec(args.spec, args.overrides, results=args.results)
        plan = build_plan(spec)
        if args.dry_run:
            console.print_plan(spec, plan)
            return 0
        from sweeps.driver import run_sweep  # imports Ray: not for --dry-run

        summary = run_sweep(spec, plan, address=args.address, resume=args.resume,
                            max_concurrent=args.max_concurrent, verbose=args.verbose)
    except UpcycleError as e:
        if args.debug:
            raise
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(RESUME_HINT, file=sys.stderr)
        return signals.exit_code()
    if args.json:
        print(json.dumps(summary, default=str))
    if not summary.get("complete", True):
        print(f"{RESUME_HINT} ({len(summary['unfinished'])} unfinished, "
              f"{summary['not_started']} not started)", file=sys.stderr)
        return signals.exit_code()
    return 0 if summary.get("failed", 0) == 0 else 1


if __name__ == "__main__":
    os.environ.setdefault("WANDB_MODE", "offline")
    sys.exit(main())

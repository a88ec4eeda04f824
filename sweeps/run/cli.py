"""python -m sweeps.run SPEC.yaml [--address auto|HOST:PORT] [--resume] [--dry-run]
                      [--set key.path=value ...] [--results DIR] [--max-concurrent N]

Validate the spec (before Ray starts), train each distinct parent once, run the trials with Ray
Tune, write ``results/<sweep>/results.parquet`` and print a ranked table of the trials.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from moe_core.errors import SearchSpaceError, cli_boundary
from sweeps.cluster.launcher import (
    NodeType,
    check_launcher,
    cluster_gpu,
    ray_nodes,
    read_launcher,
)
from sweeps.plan import preflight
from sweeps.plan.build import build_plan
from sweeps.plan.cost import parent_rank_counts
from sweeps.run import _signals as signals
from sweeps.run import console, guard
from sweeps.run.address import check_address, dry_run_address
from sweeps.spec import budget as budget_flags
from sweeps.spec.sweep import load_spec
from sweeps.spec.trials import check_kernels
from sweeps.store.oom import LOWER


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m sweeps.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("spec", help="sweep spec YAML (see search_spaces/)")
    ap.add_argument("--address", default=None,
                    help="Ray cluster address (auto or HOST:PORT); default: start Ray locally")
    ap.add_argument("--resume", action="store_true",
                    help="resume the sweep's experiment directory; finished trials are kept")
    ap.add_argument("--force-spec", action="store_true",
                    help="with --resume: resume although the spec changed since the run began")
    ap.add_argument("--dry-run", action="store_true",
                    help="validate and print the plan without starting Ray")
    ap.add_argument("--cluster", default=None, metavar="LAUNCHER.yaml",
                    help="with --dry-run: check the spec against a Ray cluster launcher config's "
                         "node types (sweeps/cluster/aws.yaml, gcp.yaml) without a cloud")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a spec key, e.g. base.optim.lr=1e-3 or num_samples=4")
    ap.add_argument("--results", default=None,
                    help="results root: a folder, s3://BUCKET/PATH or gs://BUCKET/PATH "
                         "(default: the spec's, 'results'; docs/storage.md)")
    ap.add_argument("--max-concurrent", type=int, default=None,
                    help="at most this many trials at once")
    ap.add_argument("--gpu", default=None, metavar="TYPE",
                    help="cost forecast and memory check for this GPU (h100, h200, a100, l4...)")
    ap.add_argument("--price", type=float, default=None, metavar="$/GPU-h",
                    help="price of one GPU-hour, for the forecast's cost")
    for key, flag in budget_flags.FLAGS.items():
        ap.add_argument(flag, type=float, default=None, dest=f"budget_{key}",
                        metavar="HOURS" if "hours" in key else "$",
                        help=f"stop the sweep when this much is spent (spec: budget.{key}; "
                             "--resume with a raised one continues)")
    ap.add_argument("--json", action="store_true", help="print the final summary as JSON")
    ap.add_argument("--verbose", action="store_true",
                    help="Ray Tune's status tables and the trials' own log lines")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    return ap.parse_args(argv)


def _cluster_nodes(address: str | None) -> list[dict[str, float]] | None:
    """The nodes of the cluster ``--dry-run --address`` checks the plan against: probed in
    bounded time first (``sweeps.run.address``); ``auto`` without ``RAY_ADDRESS`` joins nothing."""
    if address is None:
        return None
    resolved = dry_run_address(address)
    if resolved is None:
        console.progress("--address auto: RAY_ADDRESS is not set, so the plan is checked "
                         "against this machine, not a cluster (give HOST:PORT to check one)")
        return None
    check_address(resolved)  # a dead or non-Ray port fails here, in seconds, before Ray
    from sweeps.run.driver import cluster_nodes  # imports Ray: only with --address

    return cluster_nodes(resolved)


def _launcher(args: argparse.Namespace) -> list[NodeType] | None:
    """``--cluster``'s node types (only with ``--dry-run``, without ``--address``)."""
    if args.cluster is None:
        return None
    if not args.dry_run or args.address is not None:
        raise SearchSpaceError(f"--cluster {args.cluster}: checks a spec in the dry run, without "
                               "a cloud; use it with --dry-run and without --address")
    return read_launcher(args.cluster)


def _gpus(types: list[NodeType] | None, nodes: list[dict[str, float]] | None) -> float | None:
    """GPUs of the cluster the forecast schedules on: every node type at its max_workers."""
    if types:
        return sum(t.gpus * t.max_workers for t in types)
    return sum(n.get("GPU", 0) for n in nodes) if nodes else None


MAX_PRICE = 1e4
"""Largest ``--price`` per GPU-hour accepted (list prices are a few dollars)."""


def check_flags(args: argparse.Namespace) -> None:
    """The numeric and named flags, before the spec is read: one line naming the flag."""
    if args.max_concurrent is not None and args.max_concurrent < 1:
        raise SearchSpaceError(f"--max-concurrent={args.max_concurrent} must be >= 1")
    if args.price is not None and not 0 <= args.price <= MAX_PRICE:
        raise SearchSpaceError(f"--price {args.price}: must be a finite price per GPU-hour in "
                               f"[0, {MAX_PRICE:g}]")
    if args.gpu is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", args.gpu):
        raise SearchSpaceError(f"--gpu {args.gpu!r}: give a GPU type such as h100, h200, a100 "
                               "or l4")


BUDGET_EXIT = 3
"""Exit status of a sweep stopped by its budget (2: a configuration error, before launch)."""
OOM_EXIT = 4
"""Exit status of a sweep in which Ray's memory monitor killed a trial (its rows say ``oom``)
or an actor the sweep needed (the sweep stopped; the running trials' rows say ``oom``)."""
RESUME_HINT = "interrupted: rerun with --resume to continue; finished trials are kept"


@cli_boundary(kept="finished trials, rows and checkpoints are kept (rerun with --resume)",
              interrupted=(RESUME_HINT, signals.exit_code))
def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    signals.install()
    check_flags(args)
    spec = load_spec(args.spec, args.overrides, results=args.results)
    limits = budget_flags.with_flags(
        spec.budget, {k: getattr(args, f"budget_{k}") for k in budget_flags.FLAGS}, args.price)
    plan = build_plan(spec)
    types = _launcher(args)
    nodes = ray_nodes(types) if types else _cluster_nodes(args.address) if args.dry_run else None
    gpu = args.gpu or (cluster_gpu(types) if types else None)
    # resources.gpus: auto as it will resolve (the driver resolves it again once connected)
    seen = preflight.resolved(spec, nodes)
    check_kernels(seen, plan.kernels)  # liger asked for on trials that resolve to the CPU
    parent_rank_counts(seen, plan, "gpu")  # a parent_ranks its parents cannot train on: refused
    checks = preflight.run_checks(  # files, vocabulary, checkpoint, disk, memory, resources
        seen, plan, gpu=gpu, concurrent=args.max_concurrent, nodes=nodes,
        local=args.address is None and not types,
        hosts=sum(t.max_workers for t in types) if types else None)  # nodes: counted in them
    lines: list[str] = []
    if types:
        problems, lines = check_launcher(seen, plan, types, args.cluster)
        checks += problems
    lines += guard.preflight(spec, plan)  # before anything starts or moves
    if args.dry_run:
        console.print_plan(spec, plan)
        print(preflight.memory_line(seen, plan, concurrent=args.max_concurrent), flush=True)
        console.print_forecast(seen, plan, gpu=gpu, price=args.price,
                               max_concurrent=args.max_concurrent,
                               cluster_gpus=_gpus(types, nodes))
        for line in lines:
            console.progress(line)
    preflight.enforce(checks, console.progress)
    if args.dry_run:
        return 0
    guard.local_only_ray(args.address)  # a local Ray listens on 127.0.0.1 only
    from sweeps.run.driver import run_sweep  # imports Ray: not for --dry-run

    with guard.held(spec.results_uri, console.progress):  # one run per results folder
        if args.resume:
            guard.check_resume_spec(spec, spec.results_uri, args.force_spec,
                                    console.progress)
        summary = run_sweep(spec, plan, address=args.address, resume=args.resume,
                            max_concurrent=args.max_concurrent, verbose=args.verbose,
                            limits=limits)
    if args.json:
        print(json.dumps(summary, default=str))
    if summary.get("budget", {}).get("status") == "spent":
        print(f"budget spent ({summary['budget']['stopped_by']}): {summary['budget_stopped']} "
              "trials stopped, rows kept; raise the limit and rerun with --resume to continue",
              file=sys.stderr)
        return BUDGET_EXIT
    if summary.get("memory_stop") or summary.get("oom"):
        print(summary.get("memory_stop") or f"{summary['oom']} trial(s) killed by Ray's memory "
              f"monitor (status oom, rows kept); {LOWER}, then rerun with --resume",
              file=sys.stderr)
        return OOM_EXIT
    if not summary.get("complete", True):
        print(f"{RESUME_HINT} ({len(summary['unfinished'])} unfinished, "
              f"{summary['not_started']} not started)", file=sys.stderr)
        return signals.exit_code()
    return 0 if summary.get("failed", 0) == 0 else 1


"""python -m sweeps.cluster local up [--v2] [--max-workers N] [--dir DIR]
python -m sweeps.cluster local down [--dir DIR]
python -m sweeps.cluster constraints > constraints.txt

``up`` starts a fake multi-node cluster driven by Ray's real autoscaler on this machine (a head
without GPUs; worker nodes of 1 CPU + 1 logical GPU, launched as trials queue and removed when
idle) and prints how to run a sweep on it; ``down`` stops exactly the processes ``up`` started
(recorded in DIR/cluster.json). ``constraints`` prints the versions this environment runs as
a pip constraints file, which the cloud configs (sweeps/cluster/aws.yaml, gcp.yaml,
kuberay.yaml) install the package with. See docs/cluster.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from moe_core.errors import UpcycleError, cli_boundary
from sweeps.cluster.constraints import render
from sweeps.cluster.local import (
    LOOPBACK_ENV,
    STATE_FILE,
    LocalCluster,
    LocalClusterConfig,
    check_owned,
)
from sweeps.plan.devices import ALLOW_CPU_ENV

DEFAULT_DIR = Path(tempfile.gettempdir()) / f"upcycle-local-cluster-{os.getuid()}"


@cli_boundary(kept="nothing was stopped or deleted")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sweeps.cluster", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["local", "constraints"])
    ap.add_argument("action", choices=["up", "down"], nargs="?")
    ap.add_argument("--v2", action="store_true", help="Ray's autoscaler v2 (default: v1)")
    ap.add_argument("--max-workers", type=int, default=3)
    ap.add_argument("--idle-timeout-s", type=float, default=6.0)
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                    help=f"where the cluster keeps its state and Ray's logs ({DEFAULT_DIR})")
    args = ap.parse_args(argv)
    if args.what == "constraints":
        sys.stdout.write(render())
        return 0
    if args.action is None:
        ap.error("local needs up or down")
    check_owned(args.dir, "--dir")  # only the user's own folder, before anything is read
    if args.action == "down":
        if not (args.dir / STATE_FILE).exists():
            raise UpcycleError(f"no local cluster recorded in {args.dir / STATE_FILE}")
        LocalCluster.attach(args.dir).stop()
        (args.dir / STATE_FILE).unlink()
        print(f"stopped the local cluster of {args.dir}")
        return 0
    if (args.dir / STATE_FILE).exists():
        raise UpcycleError(f"a local cluster is already recorded in {args.dir}; run "
                           f"`python -m sweeps.cluster local down --dir {args.dir}` first")
    cfg = LocalClusterConfig(max_workers=args.max_workers,
                             idle_timeout_s=args.idle_timeout_s, autoscaler_v2=args.v2)
    c = LocalCluster(cfg, args.dir).start()
    # the worker nodes' GPUs are logical: trials train on the CPU (sweeps.plan.devices)
    env = " ".join(f"{k}={v}" for k, v in {**LOOPBACK_ENV, ALLOW_CPU_ENV: "1"}.items())
    print(f"local cluster up at {c.address} (autoscaler {'v2' if args.v2 else 'v1'}, head "
          f"only; up to {args.max_workers} worker nodes of 1 CPU + 1 logical GPU)\n"
          f"run a sweep on it:  {env} python -m sweeps.run SPEC.yaml --address {c.address} "
          f"--set resources.gpus=1 --set max_concurrent={args.max_workers}\n"
          f"stop it:            python -m sweeps.cluster local down --dir {args.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

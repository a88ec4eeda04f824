"""Sweep overhead: N short trials through Ray Tune (``sweeps.run.driver.run_sweep``) vs the same
trials back to back in one process (``moe_core.train.train``), wall-clock ratio.

    python bench/sweep_overhead.py [--trials 4] [--steps 40]
Ends with one JSON line (``sweep_vs_sequential``).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--concurrent", type=int, default=1,
                    help="Tune concurrency (1 = same parallelism as the sequential baseline)")
    args = ap.parse_args()
    os.environ["WANDB_MODE"] = "disabled"
    tmp = Path(tempfile.mkdtemp(prefix="sweep-overhead-"))
    os.environ["UPCYCLE_CACHE"] = str(tmp / "cache")
    from moe_core.train import train
    from sweeps.plan.build import build_plan
    from sweeps.spec.sweep import parse_spec

    spec = parse_spec({
        "sweep": "overhead", "results": str(tmp / "res"),
        "base": {
            "model": {"preset": "debug"},
            "data": {"source": "synthetic", "synthetic_vocab": 32, "synthetic_tokens": 100000,
                     "seq_len": 64},
            "batch": {"global_batch": 8, "micro_batch": 8},
            "eval": {"every_steps": 10, "batches": 2},
            "tokens": args.steps * 8 * 64,
        },
        "search": {"optim.lr": {"grid": [1e-3 * (i + 1) for i in range(args.trials)]}},
        "logging": {"wandb": {"enabled": False}},
        "max_concurrent": args.concurrent,
    })
    plan = build_plan(spec)
    cfgs = [t.config for t in plan.trials]
    train(cfgs[0])  # warm caches (dataset) so neither side pays for them
    t = time.perf_counter()
    for c in cfgs:
        train(c)
    seq = time.perf_counter() - t

    from sweeps.run.driver import run_sweep

    t = time.perf_counter()
    summary = run_sweep(spec, plan)
    sweep = time.perf_counter() - t
    assert summary["ok"] == args.trials, summary
    print(f"{args.trials} trials × {args.steps} steps: sequential {seq:.1f} s, "
          f"Ray Tune sweep {sweep:.1f} s (concurrency {args.concurrent}), "
          f"overhead ratio {sweep / seq:.2f}")
    print(json.dumps({"bench": "sweep_overhead", "trials": args.trials, "steps": args.steps,
                      "concurrency": args.concurrent, "sequential_s": round(seq, 2),
                      "sweep_s": round(sweep, 2), "sweep_vs_sequential": round(sweep / seq, 3)}))


if __name__ == "__main__":
    main()

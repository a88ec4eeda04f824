"""Scale-out on local Ray nodes: trials/hour of a fixed sweep on 1 node vs 2 nodes (each node
``--cpus`` CPUs, on loopback, started and stopped by PID with ``sweeps.cluster.local``), and the
hand-off time of a parent state to a task on the other node vs on the same node.

    python bench/cluster_scale.py [--trials 4] [--steps 24] [--cpus 1]
Ends with one JSON line (``two_vs_one_node_trials_per_hour``, ``cross_vs_same_node_handoff``).
It stops only the Ray processes it started.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _sweep_seconds(address: str, tmp: Path, trials: int, steps: int, tag: str) -> float:
    spec = {
        "sweep": f"scale_{tag}", "results": str(tmp / "res"),
        "base": {
            "model": {"preset": "debug"},
            "data": {"source": "synthetic", "synthetic_vocab": 32, "synthetic_tokens": 100000,
                     "seq_len": 64},
            "batch": {"global_batch": 8, "micro_batch": 8},
            "eval": {"every_steps": 8, "batches": 2},
            "tokens": steps * 8 * 64,
        },
        "search": {"optim.lr": {"grid": [1e-3 * (i + 1) for i in range(trials)]}},
        "logging": {"wandb": {"enabled": False}},
    }
    f = tmp / f"{tag}.json"
    f.write_text(json.dumps(spec))  # JSON is YAML
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "sweeps.run", str(f), "--address", address],
                   check=True, capture_output=True, timeout=1800)
    return time.perf_counter() - t


def _handoff(address: str, repeats: int) -> tuple[float, float]:
    import numpy as np
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=address, log_to_driver=False, configure_logging=False)
    here = ray.get_runtime_context().get_node_id()
    other = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != here)
    state = {f"w{i}": np.random.default_rng(i).standard_normal((1024, 4096), dtype=np.float32)
             for i in range(8)}  # 128 MiB, like a 15M-preset parent
    ref = ray.put(state)

    @ray.remote(num_cpus=0)
    def fetch(box):
        t = time.perf_counter()
        s = ray.get(box["ref"])
        assert sum(v.size for v in s.values()) > 0
        return time.perf_counter() - t

    same, cross = [], []
    for _ in range(repeats):  # interleaved; a fresh put each time so nothing is cached remotely
        ref = ray.put(state)
        same.append(ray.get(fetch.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            here, soft=False)).remote({"ref": ref})))
        cross.append(ray.get(fetch.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            other, soft=False)).remote({"ref": ref})))
    ray.shutdown()
    return statistics.median(same), statistics.median(cross)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--cpus", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from sweeps.cluster.local import LOOPBACK_ENV, LocalCluster, LocalClusterConfig

    os.environ.update(WANDB_MODE="disabled", **LOOPBACK_ENV)
    os.environ.pop("RAY_ADDRESS", None)
    tmp = Path(tempfile.mkdtemp(prefix="cluster-scale-"))
    os.environ["UPCYCLE_CACHE"] = str(tmp / "cache")
    # object stores that hold the 128 MiB parent of the hand-off
    cluster = LocalCluster(LocalClusterConfig(autoscale=False, head_cpus=args.cpus,
                                              object_store_bytes=512 * 2**20))
    with cluster:
        address = cluster.address
        _sweep_seconds(address, tmp, args.trials, args.steps, "warmup")  # caches, op builds
        one = _sweep_seconds(address, tmp, args.trials, args.steps, "one")
        cluster.add_node(cpus=args.cpus)
        two = _sweep_seconds(address, tmp, args.trials, args.steps, "two")
        same, cross = _handoff(address, args.repeats)
    shutil.rmtree(cluster.root, ignore_errors=True)
    tph1, tph2 = args.trials / one * 3600, args.trials / two * 3600
    print(f"{args.trials} trials × {args.steps} steps: 1 node {one:.1f} s "
          f"({tph1:.0f} trials/h), 2 nodes {two:.1f} s ({tph2:.0f} trials/h), "
          f"ratio {tph2 / tph1:.2f}")
    print(f"128 MiB parent hand-off: same node {same:.3f} s, other node {cross:.3f} s, "
          f"ratio {cross / same:.1f}")
    print(json.dumps({"bench": "cluster_scale", "trials": args.trials, "steps": args.steps,
                      "cpus_per_node": args.cpus, "one_node_s": round(one, 1),
                      "two_nodes_s": round(two, 1),
                      "two_vs_one_node_trials_per_hour": round(tph2 / tph1, 3),
                      "same_node_handoff_s": round(same, 4),
                      "cross_node_handoff_s": round(cross, 4),
                      "cross_vs_same_node_handoff": round(cross / same, 2)}))


if __name__ == "__main__":
    main()

"""N trials sharing one parent: how many parent trainings, and the hand-off cost.

1. Plans a sweep of N trials with one shared dense parent and runs the driver's parent stage:
   parent trainings counted (must be 1), then N trials' ``get_parent`` (must train nothing).
2. Hand-off time of a parent state to N Ray tasks: ``ray.get`` from the object store (numpy,
   zero-copy) vs each task loading the checkpoint from disk (safetensors + SHA-256 check).

    python bench/parent_share.py [--trials 8] [--preset 15M] [--repeats 3] [--work DIR]
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import ray
import torch

from moe_core import build_model
from moe_core.presets import model_config
from moe_core.train.checkpoint import save_checkpoint
from moe_core.train.runner import load_parent


@ray.remote(num_cpus=0.5)
def _from_store(payload_box: dict) -> float:
    t = time.perf_counter()
    state = ray.get(payload_box["ref"])
    n = sum(v.size for v in state["model_state"].values())  # touch every array
    assert n > 0
    return time.perf_counter() - t


@ray.remote(num_cpus=0.5)
def _from_disk(path: str) -> float:
    t = time.perf_counter()
    st = load_parent(path)
    n = sum(np.asarray(v).size for v in st.model_state.values())
    assert n > 0
    return time.perf_counter() - t


def count_parent_trainings(trials: int, tmp: Path) -> dict:
    from sweeps.plan import resources
    from sweeps.plan.build import build_plan
    from sweeps.run.parents import get_parent, train_parents
    from sweeps.spec.sweep import parse_spec

    spec = parse_spec({
        "sweep": "share", "results": str(tmp / "res"),
        "base": {
            "model": {"preset": "debug"},
            "moe": {"num_experts": 4, "top_k": 2},
            "data": {"source": "synthetic", "synthetic_vocab": 32,
                     "synthetic_tokens": 60000, "seq_len": 32, "cache_dir": str(tmp / "c")},
            "batch": {"global_batch": 8, "micro_batch": 8},
            "tokens": 512, "parent": {"tokens": 512, "seed": 0, "lr": 3e-3},
            "upcycle": {"method": "dense_to_moe"},
        },
        "search": {"optim.lr": {"grid": [1e-3 * (i + 1) for i in range(trials)]}},
    })
    spec = resources.resolve(spec, resources.ray_cluster())  # resources.gpus: auto -> 1 or 0,
    # as the driver does (sweeps.run.driver): unresolved, the parent task's options raise
    plan = build_plan(spec)
    cache = tmp / "parents"
    refs = train_parents(spec, plan, cache)
    trained_by_driver = len(list(p for p in cache.iterdir() if p.is_dir()))
    t = time.perf_counter()
    for tr in plan.trials:
        get_parent(tr.config, tr.parent_key, refs, cache)
    trained_after = len(list(p for p in cache.iterdir() if p.is_dir()))
    return {"trials": plan.num_trials, "distinct_parents": len(plan.parents),
            "parent_trainings": trained_after, "trainings_by_driver": trained_by_driver,
            "trial_fetch_s": time.perf_counter() - t}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--preset", default="15M")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", default=None, help="folder for its files (default: a new temp)")
    args = ap.parse_args()
    os.environ.setdefault("WANDB_MODE", "disabled")
    ray.init(address="local", num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False,
             configure_logging=False, log_to_driver=False)
    tmp = Path(tempfile.mkdtemp(prefix="parent-share-", dir=args.work))
    counts = count_parent_trainings(args.trials, tmp)

    cfg = model_config(args.preset, vocab_size=32000)
    model = build_model(cfg)
    path = tmp / "parent"
    save_checkpoint(path, model_state=model.state_dict(), optimizer_state=None,
                    meta={"step": 0, "tokens": 0, "peak_lr": 1e-3, "lr": 1e-4,
                          "model_config": __import__("dataclasses").asdict(cfg)})
    payload = {"model_state": {k: v.numpy() for k, v in model.state_dict().items()},
               "model_config": cfg, "peak_lr": 1e-3, "final_lr": 1e-4, "tokens": 0}
    mb = sum(v.nbytes for v in payload["model_state"].values()) / 2**20
    ref = ray.put(payload)
    store, disk = [], []
    for _ in range(args.repeats):  # interleaved
        t = time.perf_counter()
        ray.get([_from_store.remote({"ref": ref}) for _ in range(args.trials)])
        store.append(time.perf_counter() - t)
        t = time.perf_counter()
        ray.get([_from_disk.remote(str(path)) for _ in range(args.trials)])
        disk.append(time.perf_counter() - t)
    s, d = statistics.median(store), statistics.median(disk)
    print(f"parent trainings for {counts['trials']} trials: {counts['parent_trainings']} "
          f"(distinct parents planned: {counts['distinct_parents']})")
    print(f"hand-off of a {args.preset} parent ({mb:.0f} MiB) to {args.trials} tasks: "
          f"object store {s:.3f} s, disk checkpoint {d:.3f} s, ratio {s / d:.3f}")
    print(json.dumps({"bench": "parent_share", **counts, "state_mib": round(mb, 1),
                      "store_s": round(s, 4), "disk_s": round(d, 4),
                      "store_vs_disk": round(s / d, 4), "torch": torch.__version__}))
    ray.shutdown()


if __name__ == "__main__":
    main()

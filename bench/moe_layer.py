"""Forward+backward time of our MoE layer vs DeepSpeed-MoE vs a dense SwiGLU of equal active FLOPs.

All dropless, same shapes, measured side by side in one run (medians of interleaved repeats).
Ends with one JSON line: ``ours_vs_deepspeed`` and ``ours_vs_dense_active`` are geometric means
over the shapes of time(ours) / time(other).

    python bench/moe_layer.py [--tokens 8192] [--repeats 7] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

import torch
import torch.nn as nn

from moe_core.config import MoEConfig, RouterConfig
from moe_core.moe.layer import MoELayer
from moe_core.nn import SwiGLU

SHAPES = {
    "coarse": dict(d=256, f=1024, E=8, K=2),
    "fine": dict(d=256, f=128, E=64, K=8),
}


class _DSExpert(nn.Module):
    """SwiGLU expert for deepspeed.moe.layer.MoE (it deep-copies one module per expert)."""

    def __init__(self, d: int, f: int):
        super().__init__()
        self.mlp = SwiGLU(d, f)
        self.mlp.reset_parameters(0.02)

    def forward(self, x):
        return self.mlp(x)


def _init_single_rank_dist() -> None:
    import deepspeed

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    if not torch.distributed.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        deepspeed.init_distributed(dist_backend=backend, verbose=False)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _time(fn, device: str) -> float:
    _sync(device)
    t = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="float32 (CPU default) or bfloat16 (GPU)")
    args = ap.parse_args()
    device = args.device
    dtype = getattr(torch, args.dtype or ("bfloat16" if device == "cuda" else "float32"))
    torch.manual_seed(0)
    _init_single_rank_dist()
    from deepspeed.moe.layer import MoE as DSMoE

    ratios_ds, ratios_dense, rows = [], [], []
    for name, s in SHAPES.items():
        d, f, E, K = s["d"], s["f"], s["E"], s["K"]
        cfg = MoEConfig(
            num_experts=E, top_k=K, expert_d_ff=f, router=RouterConfig(order="softmax_topk")
        )
        ours = MoELayer(d, f, cfg, init_std=0.02).to(device, dtype)
        ds = DSMoE(
            hidden_size=d, expert=_DSExpert(d, f), num_experts=E, ep_size=1, k=K,
            capacity_factor=1.0, drop_tokens=False, use_rts=False,
            top2_2nd_expert_sampling=False,
        ).to(device, dtype)
        dense = SwiGLU(d, f * K).to(device, dtype)
        dense.reset_parameters(0.02)
        x = torch.randn(1, args.tokens, d, device=device, dtype=dtype)

        def run_ours(ours=ours, x=x):
            y, aux = ours(x)
            (y.float().pow(2).mean() + aux).backward()

        def run_ds(ds=ds, x=x):
            y, aux, _ = ds(x)
            (y.float().pow(2).mean() + aux).backward()

        def run_dense(dense=dense, x=x):
            dense(x).float().pow(2).mean().backward()

        fns = {"ours": run_ours, "deepspeed": run_ds, "dense_active": run_dense}
        for fn in fns.values():  # warm-up
            fn()
        times: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(args.repeats):  # interleave so drift hits every variant alike
            for k, fn in fns.items():
                times[k].append(_time(fn, device))
        med = {k: statistics.median(v) for k, v in times.items()}
        r_ds, r_dense = med["ours"] / med["deepspeed"], med["ours"] / med["dense_active"]
        ratios_ds.append(r_ds)
        ratios_dense.append(r_dense)
        rows.append((name, E, K, f, med, r_ds, r_dense))

    print(f"device={device} dtype={dtype} tokens={args.tokens} repeats={args.repeats}")
    print(f"{'shape':8} {'E':>3} {'K':>2} {'f':>5} {'ours ms':>9} {'DS ms':>9} "
          f"{'dense ms':>9} {'ours/DS':>8} {'ours/dense':>10}")
    for name, E, K, f, med, r_ds, r_dense in rows:
        print(f"{name:8} {E:>3} {K:>2} {f:>5} {med['ours']*1e3:9.1f} "
              f"{med['deepspeed']*1e3:9.1f} {med['dense_active']*1e3:9.1f} "
              f"{r_ds:8.3f} {r_dense:10.3f}")

    def gmean(v):
        return math.exp(sum(math.log(x) for x in v) / len(v))

    print(json.dumps({
        "bench": "moe_layer", "device": device, "dtype": str(dtype).replace("torch.", ""),
        "tokens": args.tokens,
        "ours_vs_deepspeed": round(gmean(ratios_ds), 4),
        "ours_vs_dense_active": round(gmean(ratios_dense), 4),
        "per_shape": {r[0]: {"ours_vs_deepspeed": round(r[5], 4),
                             "ours_vs_dense_active": round(r[6], 4)} for r in rows},
    }))


if __name__ == "__main__":
    main()

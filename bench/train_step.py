"""Training throughput on the DeepSpeed engine: tokens/s of the debug and 15M presets, dense vs
E8 top-2 MoE (CPU), and on CUDA the model FLOPs utilisation 6·N_active·tokens / time / peak for
0.1B dense and upcycled 8×0.1B.

    python bench/train_step.py [--steps 20] [--presets debug,15M] [--peak-tflops 989]
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from moe_core.params import count_params
from moe_core.train import Trainer, train_config_from_dict


def run(preset: str, moe: bool, steps: int, seq: int, batch: int, micro: int) -> dict:
    cfg = train_config_from_dict({
        "model": {"preset": preset},
        "moe": {"num_experts": 8, "top_k": 2} if moe else None,
        "data": {"source": "synthetic", "synthetic_vocab": 512, "synthetic_tokens": 400_000,
                 "seq_len": seq},
        "batch": {"global_batch": batch, "micro_batch": micro},
        "schedule": {"kind": "constant", "warmup_steps": 0},
        "eval": {"every_steps": 10**6, "batches": 1},
        "tokens": (steps + 2) * batch * seq,
    })
    trainer = Trainer(cfg)
    stamps = []
    for _ in range(steps + 2):  # Trainer.step(): one optimizer step, no eval
        trainer.step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())
    gaps = sorted(b - a for a, b in zip(stamps[1:], stamps[2:]))  # skip warm-up
    step_s = gaps[len(gaps) // 2]
    tok_s = batch * seq / step_s
    n_act = count_params(cfg.model_config(512)).non_embedding_active
    return {"preset": preset, "moe": moe, "tokens_per_s": tok_s, "N_active": n_act,
            "flops_per_s": 6 * n_act * tok_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--presets", default=None)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--micro", type=int, default=None)
    ap.add_argument("--peak-tflops", type=float, default=989.0,
                    help="accelerator peak (H100 SXM bf16 dense: 989)")
    args = ap.parse_args()
    os.environ.setdefault("WANDB_MODE", "disabled")
    cuda = torch.cuda.is_available()
    presets = (args.presets or ("0.1B" if cuda else "debug,15M")).split(",")
    seq = args.seq or (1024 if cuda else 128)
    batch = args.batch or (32 if cuda else 8)
    micro = args.micro or (8 if cuda else 8)
    rows = []
    for p in presets:
        for moe in (False, True):
            r = run(p, moe, args.steps, seq, batch, micro)
            if cuda:
                r["mfu"] = r["flops_per_s"] / (args.peak_tflops * 1e12)
            rows.append(r)
            print(f"{p:>5} {'E8top2' if moe else 'dense':>6}: {r['tokens_per_s']:10.0f} tok/s  "
                  f"N_active={r['N_active']:,}" + (f"  MFU={r['mfu']:.1%}" if cuda else ""),
                  flush=True)
    ratios = {p: next(r for r in rows if r["preset"] == p and r["moe"])["tokens_per_s"]
              / next(r for r in rows if r["preset"] == p and not r["moe"])["tokens_per_s"]
              for p in presets}
    print(json.dumps({"bench": "train_step", "device": "cuda" if cuda else "cpu",
                      "seq": seq, "batch": batch, "rows": rows,
                      "moe_vs_dense_tokens_per_s": ratios}, default=float))


if __name__ == "__main__":
    main()

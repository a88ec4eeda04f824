"""Where a training step's time goes: ``torch.profiler`` over a few ``Trainer.step()`` calls,
kernels grouped by name and sorted into GEMM / attention / element-wise / cast-copy / optimizer
/ communication / other, on the device's clock (CUDA kernels on a GPU, CPU ops on the CPU).
Tells element-wise from GEMM time before any optimisation.

    python bench/profile_step.py [--preset 0.1B] [--moe] [--steps 3] [--seq S] [--micro M]
                                 [--compile] [--chunked-loss] [--trace DIR]

Ends with one JSON line: ``categories`` (seconds and share), ``top`` (the 20 costliest kernels).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from train_step import _data, config

from moe_core.train import Trainer, train_config_from_dict

CATEGORIES = (  # first match wins: attention before GEMM (flash kernels name "gemm" parts)
    ("attention", r"flash|fmha|attention|sdpa|cudnn"),
    ("gemm", r"gemm|matmul|\bmm\b|addmm|bmm|cutlass|xmma|cublas|sm90_|grouped_mm|linear"),
    ("optimizer", r"adam|multi_tensor|foreach|lamb"),
    ("communication", r"nccl|all_reduce|allreduce|broadcast|gloo"),
    ("cast_copy", r"copy|convert|cast|to_copy|contiguous|cat\b|index|gather|scatter"),
    ("elementwise", r"elementwise|vectorized|triton|fused|silu|mul|add|div|exp|rsqrt|pow|"
                    r"softmax|reduce|sum|mean|norm|where|fill|sort|topk|cumsum"),
)


def category(name: str) -> str:
    low = name.lower()
    return next((c for c, pat in CATEGORIES if re.search(pat, low)), "other")


def profile_steps(trainer: Trainer, steps: int, cuda: bool, trace: str | None) -> dict:
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            trainer.step()
        if cuda:
            torch.cuda.synchronize()
    if trace:
        Path(trace).mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(Path(trace) / "trace.json"))
    kernels = []
    for e in prof.key_averages():
        t = (e.self_device_time_total if cuda else e.self_cpu_time_total) / 1e6  # seconds
        if t > 0 and not (cuda and e.device_type.name == "CPU"):
            kernels.append((e.key, t, e.count))
    total = sum(t for _, t, _ in kernels) or 1e-30
    cats: dict[str, float] = {}
    for name, t, _ in kernels:
        cats[category(name)] = cats.get(category(name), 0.0) + t
    top = sorted(kernels, key=lambda k: -k[1])[:20]
    return {"total_s": total, "per_step_s": total / steps,
            "categories": {c: {"s": s, "share": s / total}
                           for c, s in sorted(cats.items(), key=lambda kv: -kv[1])},
            "top": [{"name": n[:160], "s": t, "calls": c, "category": category(n)}
                    for n, t, c in top]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default=None)
    ap.add_argument("--moe", action="store_true", help="E8 top-2 upcycled (else dense)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--micro", type=int, default=None)
    ap.add_argument("--vocab", type=int, default=None)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--chunked-loss", action="store_true")
    ap.add_argument("--trace", default=None, help="also write a Chrome trace into this folder")
    a = ap.parse_args()
    os.environ.setdefault("WANDB_MODE", "disabled")
    cuda = torch.cuda.is_available()
    preset = a.preset or ("0.1B" if cuda else "debug")
    seq, micro = a.seq or (1024 if cuda else 64), a.micro or (32 if cuda else 4)
    vocab = a.vocab or (32768 if cuda else 512)
    speed = {"compile": a.compile, "chunked_loss": a.chunked_loss}
    n = a.warmup + a.steps
    with tempfile.TemporaryDirectory() as tmp:
        data = _data(vocab, (n + 4) * micro * (seq + 1) * 2, Path(tmp))
        parent = None
        if a.moe:  # upcycled from an (untrained) dense parent, as bench/train_step.py
            parent = Trainer(train_config_from_dict(
                config(preset, False, n, seq, micro, micro, data))).parent_state()
        trainer = Trainer(train_config_from_dict(
            config(preset, a.moe, n, seq, micro, micro, data, speed)), parent=parent)
        for _ in range(a.warmup):  # compilation and allocator warm-up
            trainer.step()
        res = profile_steps(trainer, a.steps, cuda, a.trace)
    for c, v in res["categories"].items():
        print(f"{c:>14}: {v['s'] * 1e3:9.1f} ms  {v['share']:6.1%}")
    print(json.dumps({"bench": "profile_step", "device": "cuda" if cuda else "cpu",
                      "preset": preset, "moe": a.moe, "seq": seq, "micro": micro,
                      "compiled": trainer.model.compiled, **speed, "steps": a.steps, **res}))


if __name__ == "__main__":
    main()

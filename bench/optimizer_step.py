"""One optimizer step per bf16 path, side by side: ``optim.bf16_mode`` = deepspeed (ZeRO 0,
DeepSpeed's FP16_UnfusedOptimizer), bf16_optimizer (ZeRO 1, BF16_Optimizer, fp32 gradient
accumulation) and torch_autocast (ZeRO 0, fp32 weights, fused torch AdamW), plus the fp32 run.

Per path: the median wall time of a training step (``Trainer.step``: forward, backward,
clipping, optimizer, balancing) and the host syncs one step makes, by source
(``moe_core.train.host_syncs``; counted on a separate step, since counting slows it down).

On CUDA this is the measurement that picks ``optim.bf16_mode: auto``'s ZeRO-0 choice. On CPU
``--force-cuda-paths`` takes the CUDA code paths (bf16 allowed on CPU, grouped matmul,
atomic-free dispatch) as the tests do: the sync counts carry over to CUDA, the times do not
(bf16 GEMMs on a CPU are not a GPU's).

    python bench/optimizer_step.py [--preset tiny] [--experts 8] [--top-k 2] [--seq 64]
        [--batch 8] [--micro 8] [--steps 6] [--modes deepspeed,bf16_optimizer,torch_autocast]
        [--force-cuda-paths] [--narrow 64]

A mode may name its ZeRO stage, ``auto@2`` (default: 1 for bf16_optimizer, else 0); ``auto``
is ``optim.bf16_mode: auto`` and the row says what it resolved to. ``--narrow W`` keeps the
preset's layers and heads (so its parameter tensors and MoE layers, which is what the sync
count depends on) at width W: the 0.1B E8 count without 0.1B's memory on a CPU.

Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from moe_core.train import Trainer, train_config_from_dict
from moe_core.train.host_syncs import count_host_syncs

SOURCES = {
    "optimizer+clip": ("deepspeed/", "torch/optim/", "moe_core/train/engine.py"),
    "loss reads": ("moe_core/train/loop.py",),
    "data": ("moe_core/train/prefetch.py", "moe_core/data/"),
    "head": ("moe_core/loss.py", "moe_core/model.py", "liger_kernel/"),
    "moe layer": ("moe_core/moe/",),
}
STAGE = {"deepspeed": 0, "bf16_optimizer": 1, "torch_autocast": 0, "fp32": 0, "auto": 0}


def force_cuda_paths() -> None:
    """bf16 on CPU ("auto" -> bf16), torch._grouped_mm for bf16, atomic-free dispatch/combine
    (the readiness review's ``cpu_tier`` switch, ../shared/gpu/probes/cpu_tier)."""
    import moe_core.moe.layer as layer
    import moe_core.train.engine as eng

    eng.pick_dtype = lambda cfg_dtype, device: (torch.float32 if cfg_dtype == "fp32"
                                                else torch.bfloat16)
    layer._use_grouped_mm = lambda x: x.dtype == torch.bfloat16
    layer.ATOMIC_FREE = True


def data(vocab: int, seq: int, tokens: int) -> dict:
    """A synthetic Markov chain for small vocabularies; random tokens for a real LM head (the
    chain's [V, V] table would not fit at 32,768 words; throughput does not need the text)."""
    tmp = Path(tempfile.mkdtemp())
    if vocab <= 4096:
        return {"source": "synthetic", "synthetic_vocab": vocab, "seq_len": seq,
                "synthetic_tokens": max(200_000, tokens), "cache_dir": str(tmp)}
    np.random.default_rng(0).integers(0, vocab, size=tokens, dtype=np.uint16).tofile(
        tmp / "tokens.bin")
    return {"source": "tokens", "path": str(tmp / "tokens.bin"), "dtype": "uint16",
            "token_vocab_size": vocab, "seq_len": seq, "cache_dir": str(tmp)}


def narrow_preset(name: str, width: int) -> str:
    """A bench-only preset with ``name``'s layers and heads at ``width``; its name."""
    from dataclasses import replace

    from moe_core.presets import PRESETS, preset

    new = f"{name}-narrow{width}"
    PRESETS[new] = replace(preset(name), d_model=width)
    return new


def split_mode(spec: str) -> tuple[str, int]:
    """``auto@2`` -> ("auto", 2); ``deepspeed`` -> ("deepspeed", its default stage)."""
    mode, _, stage = spec.partition("@")
    return mode, int(stage) if stage else STAGE[mode]


def cfg_dict(a: argparse.Namespace, spec: str) -> dict:
    mode, stage = split_mode(spec)
    optim = {"lr": 3e-3, "zero_stage": stage}
    optim.update({"dtype": "fp32"} if mode == "fp32" else {"bf16_mode": mode})
    return {"name": f"bench-{mode}", "seed": 0, "model": {"preset": a.preset},
            "data": data(a.vocab, a.seq, 4 * a.batch * a.seq * (a.steps + 4) + 200_000),
            "batch": {"global_batch": a.batch, "micro_batch": a.micro}, "optim": optim,
            "schedule": {"kind": "constant", "warmup_steps": 0},
            "eval": {"every_steps": 10**6, "batches": 1},
            "tokens": a.batch * a.seq * (a.steps + 4),
            "moe": {"num_experts": a.experts, "top_k": a.top_k} if a.experts else None}


def measure(a: argparse.Namespace, spec: str) -> dict:
    import moe_core.train.engine as eng

    t = Trainer(train_config_from_dict(cfg_dict(a, spec)))
    t.step()  # optimizer state, first-call work
    with count_host_syncs() as c:
        t.step()
    times = []
    for _ in range(a.steps):
        if t.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        t.step()
        if t.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return {"mode": spec, "resolved": eng.bf16_mode(t.cfg, t.dtype) or "fp32",
            "zero_stage": t.cfg.optim.zero_stage, "optimizer": type(t.optimizer).__name__,
            "weights": str(next(t.model.parameters()).dtype).replace("torch.", ""),
            "step_s": round(statistics.median(times), 4), "host_syncs": c.total,
            "by_source": c.by_source(SOURCES),
            "host_side_counter_reads": sum(c.host_side.values()),
            "train_loss": t.train_loss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--experts", type=int, default=8, help="0 = dense")
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--modes", default="fp32,deepspeed,bf16_optimizer,torch_autocast")
    ap.add_argument("--force-cuda-paths", action="store_true")
    ap.add_argument("--narrow", type=int, default=0,
                    help="keep the preset's layers and heads at this width (sync counts)")
    a = ap.parse_args()
    if a.narrow:
        a.preset = narrow_preset(a.preset, a.narrow)
    if a.force_cuda_paths:
        force_cuda_paths()
    rows = [measure(a, m) for m in a.modes.split(",")]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"{'mode':18} {'resolved':15} {'optimizer':22} {'weights':9} {'step s':>8} "
          f"{'syncs':>6}  by source")
    for r in rows:
        print(f"{r['mode']:18} {r['resolved']:15} {r['optimizer']:22} {r['weights']:9} "
              f"{r['step_s']:8.4f} "
              f"{r['host_syncs']:6d}  {r['by_source']}")
    print(json.dumps({"bench": "optimizer_step", "device": device,
                      "torch_threads": torch.get_num_threads(),
                      "forced_cuda_paths": a.force_cuda_paths, "preset": a.preset,
                      "experts": a.experts, "top_k": a.top_k, "seq": a.seq, "batch": a.batch,
                      "micro": a.micro, "rows": rows}))


if __name__ == "__main__":
    main()

"""Training throughput on the DeepSpeed engine, dense vs E8 top-2 MoE upcycled from it
(``dense_to_moe``): tokens/s on CPU (debug and 15M presets); on CUDA also the model FLOPs
utilisation and the peak memory, for 0.1B dense and upcycled E8 top-2 0.1B in bf16.

MFU = FLOPs per token × tokens/s / peak, with FLOPs per token (PaLM, App. B)

    6·N_active + 6·V·d + 12·L·d·S

N_active: active non-embedding parameters (attention, MLP or the K routed experts, router,
norms); 6·V·d: the LM head (the input embedding is a lookup); 12·L·d·S: attention scores and
their weighted sum, forward and backward (L layers, width d, sequence S; not halved for the
causal mask). ``mfu_6n`` counts 6·N_active alone. On CUDA the data are random tokens of a
32,768-word vocabulary (a real LM head); on CPU a 512-word synthetic chain.

    python bench/train_step.py [--steps 20] [--presets debug,15M] [--peak-tflops 989]
                               [--seq S] [--batch B] [--micro M] [--vocab V]
                               [--compile] [--activation-checkpointing] [--chunked-loss]
                               [--models dense,moe] [--bf16-modes deepspeed,torch_autocast,...]

``--compile`` sets ``model.compile: true`` (regional torch.compile of each block; the first
steps, which compile, are warm-up and not timed) and ``--activation-checkpointing`` sets
``model.activation_checkpointing: true`` and ``--chunked-loss`` ``model.chunked_loss: true``
(moe_core.loss), for both models; all are recorded in the JSON line,
and each row's ``compiled`` says whether compilation stayed on or fell back to eager.
Ends with one JSON line (``mfu`` per model on CUDA).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from moe_core.params import count_params
from moe_core.train import Trainer, train_config_from_dict


def flops_per_token(n_active: int, vocab: int, d: int, layers: int, seq: int) -> dict:
    return {"6N": 6 * n_active, "lm_head": 6 * vocab * d, "attention": 12 * layers * d * seq}


def _data(vocab: int, tokens: int, tmp: Path) -> dict:
    if vocab <= 4096:
        return {"source": "synthetic", "synthetic_vocab": vocab,
                "synthetic_tokens": max(400_000, tokens), "cache_dir": str(tmp)}
    path = tmp / "tokens.bin"  # random tokens: throughput does not depend on the text
    rng = np.random.default_rng(0)
    rng.integers(0, vocab, size=tokens, dtype=np.uint16).tofile(path)
    return {"source": "tokens", "path": str(path), "dtype": "uint16",
            "token_vocab_size": vocab, "cache_dir": str(tmp)}


def config(preset: str, moe: bool, steps: int, seq: int, batch: int, micro: int,
           data: dict, speed: dict | None = None, bf16_mode: str | None = None) -> dict:
    d = {
        "model": {"preset": preset, **(speed or {})},
        "data": {**data, "seq_len": seq},
        "batch": {"global_batch": batch, "micro_batch": micro},
        "schedule": {"kind": "constant", "warmup_steps": 0},
        "eval": {"every_steps": 10**6, "batches": 1},
        "tokens": (steps + 2) * batch * seq,
    }
    if bf16_mode:  # bf16_optimizer is DeepSpeed's ZeRO-1 BF16_Optimizer: it needs stage 1
        d["optim"] = {"bf16_mode": bf16_mode,
                      "zero_stage": 1 if bf16_mode == "bf16_optimizer" else 0}
    if moe:
        d.update(moe={"num_experts": 8, "top_k": 2},
                 parent={"tokens": (steps + 2) * batch * seq},
                 upcycle={"method": "dense_to_moe"})
    return d


WARMUP_STEPS = 2
"""Untimed first steps (allocator warm-up; with --compile, compilation)."""


def run(cfg_dict: dict, steps: int, parent=None) -> tuple[dict, Trainer]:
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    cfg = train_config_from_dict(cfg_dict)
    trainer = Trainer(cfg, parent=parent)
    stamps = []
    for _ in range(steps + WARMUP_STEPS):  # Trainer.step(): one optimizer step, no eval
        trainer.step()
        if cuda:
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())
    gaps = sorted(b - a for a, b in zip(stamps[WARMUP_STEPS - 1:], stamps[WARMUP_STEPS:]))
    step_s = gaps[len(gaps) // 2]
    seq, batch = cfg.seq_len, cfg.batch.global_batch
    tok_s = batch * seq / step_s
    mcfg = trainer.model.config
    n_act = count_params(mcfg).non_embedding_active
    f = flops_per_token(n_act, mcfg.vocab_size, mcfg.d_model, mcfg.n_layer, seq)
    row = {"preset": cfg.model.preset, "moe": cfg.moe is not None, "tokens_per_s": tok_s,
           "compiled": trainer.model.compiled,
           "N_active": n_act, "flops_per_token": f, "flops_per_s": sum(f.values()) * tok_s}
    if cuda:
        row["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return row, trainer


def run_preset(p: str, models: set, mode: str | None, args: argparse.Namespace,
               shape: tuple[int, int, int], data: dict, speed: dict) -> list[dict]:
    """The dense and/or E8 top-2 rows of one preset under one ``optim.bf16_mode``."""
    cuda = torch.cuda.is_available()
    seq, batch, micro = shape
    dense_cfg = config(p, False, args.steps, seq, batch, micro, data, speed, mode)
    if "dense" in models:
        dense, trainer = run(dense_cfg, args.steps)
    else:  # the parent only: no steps timed
        dense, trainer = None, Trainer(train_config_from_dict(dense_cfg))
    parent = trainer.parent_state()
    del trainer
    moe = run(config(p, True, args.steps, seq, batch, micro, data, speed, mode),
              args.steps, parent=parent)[0] if "moe" in models else None
    rows = []
    for r in (x for x in (dense, moe) if x is not None):
        r["bf16_mode"] = mode or "auto"
        if cuda:
            peak = args.peak_tflops * 1e12
            r["mfu"] = r["flops_per_s"] / peak
            r["mfu_6n"] = r["flops_per_token"]["6N"] * r["tokens_per_s"] / peak
        rows.append(r)
        print(f"{p:>5} {'E8top2' if r['moe'] else 'dense':>6} {r['bf16_mode']:>14}: "
              f"{r['tokens_per_s']:10.0f} tok/s  N_active={r['N_active']:,}"
              + (f"  MFU={r['mfu']:.1%} (6·N alone {r['mfu_6n']:.1%})  "
                 f"peak mem {r['peak_mem_gib']:.1f} GiB" if cuda else ""), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--presets", default=None)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--micro", type=int, default=None)
    ap.add_argument("--vocab", type=int, default=None)
    ap.add_argument("--peak-tflops", type=float, default=989.0,
                    help="accelerator peak (H100 SXM bf16 dense: 989)")
    ap.add_argument("--compile", action="store_true",
                    help="model.compile: true (regional torch.compile of each block)")
    ap.add_argument("--activation-checkpointing", action="store_true",
                    help="model.activation_checkpointing: true (recompute blocks in backward)")
    ap.add_argument("--chunked-loss", action="store_true",
                    help="model.chunked_loss: true (LM head + loss without the logits)")
    ap.add_argument("--bf16-modes", default=None,
                    help="comma-separated optim.bf16_mode values to time each model under "
                         "(deepspeed, bf16_optimizer at ZeRO 1, torch_autocast); default: auto")
    ap.add_argument("--models", default="dense,moe",
                    help="dense, moe or both: each at its own best micro-batch in its own run "
                         "(moe alone upcycles an untrained dense parent)")
    args = ap.parse_args()
    models = set(args.models.split(","))
    speed = {"compile": args.compile, "activation_checkpointing": args.activation_checkpointing,
             "chunked_loss": args.chunked_loss}
    os.environ.setdefault("WANDB_MODE", "disabled")
    cuda = torch.cuda.is_available()
    presets = (args.presets or ("0.1B" if cuda else "debug,15M")).split(",")
    seq = args.seq or (1024 if cuda else 128)
    batch = args.batch or (32 if cuda else 8)
    micro = args.micro or (32 if cuda else 8)
    vocab = args.vocab or (32768 if cuda else 512)
    modes = args.bf16_modes.split(",") if args.bf16_modes else [None]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = _data(vocab, (args.steps + 4) * batch * (seq + 1) * 2, Path(tmp))
        for p in presets:
            for mode in modes:
                rows += run_preset(p, models, mode, args, (seq, batch, micro), data, speed)
    ratios = {p: next(r for r in rows if r["preset"] == p and r["moe"])["tokens_per_s"]
              / next(r for r in rows if r["preset"] == p and not r["moe"])["tokens_per_s"]
              for p in presets} if models >= {"dense", "moe"} and modes == [None] else {}
    out = {"bench": "train_step", "device": "cuda" if cuda else "cpu", "seq": seq,
           "batch": batch, "micro": micro, "vocab": vocab, **speed, "rows": rows,
           "moe_vs_dense_tokens_per_s": ratios,
           "mfu_formula": "(6*N_active + 6*V*d + 12*L*d*S) * tokens_per_s / peak"}
    if cuda:
        out["peak_tflops"] = args.peak_tflops
        out["mfu"] = {f"{r['preset']}-{'E8top2' if r['moe'] else 'dense'}"
                      + ("" if r["bf16_mode"] == "auto" else f"-{r['bf16_mode']}"):
                      round(r["mfu"], 4) for r in rows}
    print(json.dumps(out, default=float))


if __name__ == "__main__":
    main()

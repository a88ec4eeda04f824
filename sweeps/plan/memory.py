"""The per-trial memory forecast of ``--dry-run``, and which knobs make a sweep fit a node.

A trial's peak (one rank; CPU: its process's RSS) is at the end of a step's backward, where the
gradients and DeepSpeed's flat reduction bucket exist beside the weights and the optimizer
state: the terms of :func:`trial_memory_parts`, each explained in docs/preflight-and-cost.md.
Measured against SmolLM2-135M upcycled (``studies/real_model.py``, docs/own-checkpoint.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from moe_core.params import count_params
from sweeps.plan.build import _bf16, bf16_weights
from sweeps.run.console import human_bytes

RUNTIME_BYTES = 450 * 10**6
"""A trial process's memory before its model: Python with torch, DeepSpeed and the trainer
imported (0.44 GB peak RSS measured on CPU, torch 2.13, DeepSpeed 0.19; 0.46 GB with the
SmolLM2 tokenizer loaded, studies/real_model.py)."""

REDUCE_BUCKET = 500_000_000
"""DeepSpeed's gradient reduction bucket, elements (``MEMORY_OPT_ALLREDUCE_SIZE``)."""


def model_memory_parts(cfg: Any, gpus: float, ranks: int = 1) -> dict[str, int]:
    """The accelerator's part of a trial's peak, by term (see the module docstring);
    ``ranks``: over how many data-parallel ranks ZeRO-1/2 split the state."""
    m = cfg.model_config()
    n = count_params(m).total
    bf16 = _bf16(cfg, gpus)  # bf16 compute (activations)
    w = 2 if bf16_weights(cfg, gpus) else 4  # torch_autocast: fp32 weights and gradients
    zero = cfg.optim.zero_stage
    split_opt = ranks if zero >= 1 else 1
    split_grad = ranks if zero >= 2 else 1
    s, b, h, a = cfg.seq_len, cfg.batch.micro_batch, m.d_model, m.n_head
    k = m.moe.top_k if m.moe is not None else 1
    # Korthikanti et al. 2022, Eq. 2: s·b·h·(34 + 5·a·s/h) B per layer in 16-bit (× 2 in fp32),
    # the MoE MLP's 19 of the 34 times top-K
    act = s * b * h * (15 + 19 * k + 5 * a * s / h) * m.n_layer * (1 if bf16 else 2)
    # AdamW's two fp32 moments, split over the ranks by ZeRO-1/2 (Rajbhandari et al. 2020,
    # §5.1 Eq. P_os); the reduce bucket flattens the gradients into a second copy at the
    # accumulation boundary (DeepSpeedEngine.allreduce_no_retain), even on one rank
    return {"weights": n * w, "master": n * 4 if w == 2 else 0,
            "gradients": n * w // split_grad, "optimizer": n * 8 // split_opt,
            "reduce_bucket": min(n // split_grad, REDUCE_BUCKET) * w,
            "activations": int(act), "logits": 2 * s * b * m.vocab_size * 4}


def trial_memory_parts(cfg: Any, gpus: float, ranks: int = 1) -> dict[str, int]:
    """One trial's peak by term: :func:`model_memory_parts`, the runtime and the parent."""
    parent = 0
    if cfg.parent is not None:
        parent = count_params(cfg.model_config(moe="parent")).total * 4
    return {"runtime": RUNTIME_BYTES, "parent": parent,
            **model_memory_parts(cfg, gpus, ranks)}


def trial_memory_bytes(cfg: Any, gpus: float, ranks: int = 1) -> int:
    """A trial's peak memory (one rank's; CPU: its process's RSS): the sum of
    :func:`trial_memory_parts`."""
    return sum(trial_memory_parts(cfg, gpus, ranks).values())


def model_memory_bytes(cfg: Any, gpus: float, ranks: int = 1) -> int:
    """The accelerator's part only (no runtime, no parent copy on the host)."""
    return sum(model_memory_parts(cfg, gpus, ranks).values())


def with_micro_batch(cfg: Any, micro: int) -> Any:
    return dataclasses.replace(cfg, batch=dataclasses.replace(cfg.batch, micro_batch=micro))


def with_zero_stage(cfg: Any, stage: int) -> Any:
    return dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, zero_stage=stage))


def memory_fixes(configs: list[Any], gpus: float, ranks: int, concurrent: int, budget: float,
                 estimate: Any = trial_memory_bytes) -> list[str]:
    """The knobs that make ``concurrent`` trials of ``configs`` (each ``ranks`` processes of
    ``estimate`` bytes) fit ``budget`` bytes, each with the figure it gives:
    ``max_concurrent``, the largest smaller ``batch.micro_batch`` that divides every config's
    per-rank batch, and (several ranks) a higher ``optim.zero_stage``. Empty when none does."""
    def need(cfgs: list[Any], conc: int) -> int:
        return conc * ranks * max(estimate(c, gpus, ranks) for c in cfgs)

    out = []
    one = need(configs, 1)
    fit = int(budget // one) if one else 0
    if 1 <= fit < concurrent:
        out.append(f"max_concurrent: {fit} ({human_bytes(need(configs, fit))})")
    micro = max(c.batch.micro_batch for c in configs)
    for mb in range(micro - 1, 0, -1):
        if all((c.batch.global_batch // ranks) % mb == 0 for c in configs):
            smaller = [with_micro_batch(c, min(mb, c.batch.micro_batch)) for c in configs]
            if need(smaller, concurrent) <= budget:
                out.append(f"batch.micro_batch: {mb} ({human_bytes(need(smaller, concurrent))})")
                break
    if ranks > 1:
        for stage in (1, 2):
            if stage > max(c.optim.zero_stage for c in configs):
                staged = [with_zero_stage(c, max(stage, c.optim.zero_stage)) for c in configs]
                b = need(staged, concurrent)
                if b <= budget:
                    out.append(f"optim.zero_stage: {stage} ({human_bytes(b)})")
                    break
    return out


def fits_line(fixes: list[str]) -> str:
    """``fits with A or B``, or a sentence saying that no single knob does."""
    return ("fits with " + " or ".join(fixes)) if fixes else \
        "no single knob makes it fit (lower several, or use a larger node)"

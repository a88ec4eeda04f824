"""Read-backs of the knob audit (``moe_core.train.audit``) that measure the live data, the
upcycled weights at step 0 and the parent a trainer was handed: each function takes the live
``Trainer`` and returns what its objects hold, never the config's value.

Some knobs leave no number to read, only a draw: the data order of ``eval.seed``, the Markov
chain of ``data.synthetic_seed``. For those the live objects are compared with a fresh draw of
the requested value (one validation batch, the chain's first 64 tokens) and the effective value
is the requested one when they are that draw, else ``"another draw"``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from moe_core.data.sources import markov_chain
from moe_core.upcycle.dense import routed_output_scale

OTHER = "another draw"
"""The effective value of a draw-checked knob whose live objects are not its draw."""

CHAIN_PREFIX = 64
"""Tokens of the live synthetic stream compared with a fresh draw of the requested chain."""


# ---- data ------------------------------------------------------------------------------------


def source(t: Any) -> str:
    """The source the live dataset came from: its content hash names it (``synthetic-…``,
    ``tokens-…``, ``stdlib-…``, ``text-…``, set by the branch of ``load_dataset`` that read
    it)."""
    return t.dataset.content_hash.split("-", 1)[0]


def token_file(t: Any) -> str | None:
    """The file the live training split maps (source ``tokens``)."""
    f = getattr(t.batcher.tokens, "filename", None)
    return None if f is None else str(Path(f).resolve())


def requested_token_file(path: str) -> str:
    p = Path(path).resolve()
    return str(p / "train.bin" if p.is_dir() else p)


def cache_dir(t: Any) -> str | None:
    """The folder holding the token cache file the live dataset was read from."""
    f = t.dataset.cache_file
    if f is None:
        return None
    p = Path(f).resolve().parent
    return str(p.parent if p.name.startswith("corpus-") else p)


def file_digest(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def tokenizer(t: Any) -> str:
    """``bytes`` when the live dataset has no tokenizer file, else that file's digest."""
    p = t.dataset.tokenizer_path
    return "bytes" if p is None else file_digest(p)


def val_share(t: Any) -> float:
    """The share of the live dataset's tokens held out for validation."""
    n_val = len(t.dataset.val)
    return round(n_val / (n_val + len(t.dataset.train)), 6)


def within_half(req: float, eff: float) -> bool:
    """The interleaved split holds out whole blocks of 32768 tokens, 1 of every
    round(1/val_fraction): the share is the request's only within that rounding."""
    return abs(eff - req) <= 0.5 * req


def stream_tokens(t: Any) -> int:
    return len(t.dataset.train) + len(t.dataset.val)


def chain_is(t: Any, concentration: float, seed: int) -> bool:
    """Whether the live stream starts with the chain drawn with (concentration, seed): the
    first ``CHAIN_PREFIX`` tokens of ``sample_chain``, which draws all its uniforms (one 64-bit
    draw each) before the start state: the generator skips the rest of them (``advance``)."""
    d = t.cfg.data
    P = markov_chain(d.synthetic_vocab, concentration, seed)
    rng = np.random.default_rng(seed + 1)
    n = stream_tokens(t)
    u = rng.random(min(n, CHAIN_PREFIX))
    rng.bit_generator.advance(n - len(u))
    s = int(rng.integers(len(P)))
    cum = np.cumsum(P, axis=1)
    want = []
    for x in u:
        s = min(int(np.searchsorted(cum[s], x, side="right")), len(P) - 1)
        want.append(s)
    return bool(np.array_equal(np.asarray(t.batcher.tokens[:CHAIN_PREFIX]), want))


def val_seed(t: Any, seed: int) -> Any:
    """``seed`` when the live first validation batch is the one ``seed`` draws, else
    ``OTHER``."""
    x, _ = t.dataset.val_batches(seq_len=t.batcher.seq_len, batch_size=len(t.val[0][0]),
                                 num_batches=1, seed=seed)[0]
    return seed if torch.equal(x, t.val[0][0].cpu()) else OTHER


def synthetic_seed(t: Any) -> Any:
    d = t.cfg.data
    return d.synthetic_seed if chain_is(t, d.synthetic_concentration, d.synthetic_seed) \
        else OTHER


def synthetic_concentration(t: Any) -> Any:
    d = t.cfg.data
    return d.synthetic_concentration if chain_is(t, d.synthetic_concentration,
                                                 d.synthetic_seed) else OTHER


# ---- bf16 -----------------------------------------------------------------------------------


def bf16_mode(t: Any) -> str:
    """How the live run does bf16: fp32 weights under a plain torch optimizer
    (``torch_autocast``), DeepSpeed's ``BF16_Optimizer`` (``bf16_optimizer``), else bf16
    weights in DeepSpeed's wrapper for the stage (``deepspeed``)."""
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer

    weights = next(t.model.parameters()).dtype
    if weights == torch.float32 and isinstance(t.optimizer, torch.optim.Optimizer):
        return "torch_autocast"
    return "bf16_optimizer" if isinstance(t.optimizer, BF16_Optimizer) else "deepspeed"


# ---- the upcycled weights at step 0 ----------------------------------------------------------


def _first_moe(t: Any) -> tuple[int, Any]:
    return next((i, b.mlp) for i, b in enumerate(t.model.blocks) if b.is_moe)


def _parent(t: Any, key: str) -> torch.Tensor:
    return torch.as_tensor(np.asarray(t.parent.model_state[key]), dtype=torch.float64)


def granularity(t: Any) -> int:
    """G = the parent's dense d_ff / the live experts' d_ff."""
    i, m = _first_moe(t)
    return _parent(t, f"blocks.{i}.mlp.w_up").shape[1] // m.w_up.shape[2]


def virtual_groups(t: Any) -> bool:
    """Whether the G experts of every group share one live router row (004 App. A)."""
    G = granularity(t)
    for m in t.model.moe_layers():
        rows = m.router.weight.detach().float()
        groups = rows.reshape(-1, G, rows.shape[1])
        if not torch.equal(groups, groups[:, :1].expand_as(groups)):
            return False
    return True


def expert_scale(t: Any) -> float:
    """The factor by which the first live expert's output is its dense shard's, measured:
    (‖w_up of the expert‖ / ‖w_up of its shard in the parent‖)², as ``up`` and ``down`` each
    carry √ of it (004 §2.3.1; moe_core/upcycle/dense.py)."""
    i, m = _first_moe(t)
    G, f = granularity(t), m.w_up.shape[2]
    shard = (m.ep_rank * m.num_local_experts) % G
    dense = _parent(t, f"blocks.{i}.mlp.w_up")[:, shard * f:(shard + 1) * f]
    live = m.w_up[0].detach().double().cpu()
    return float((live.norm() / dense.norm()) ** 2)


def requested_scale(c: Any, G: int) -> float:
    """The factor the config asks for: t / (c + 1), t = G (top-K softmax or renormalized) or
    N·G/K, c = the shard's shared copies (004 §2.3.1, §3.9); 1 without weight scaling."""
    if not c.upcycle.weight_scaling:
        return 1.0
    copies = sum(1 for s in range(c.moe.num_shared_experts) if s % G == 0)
    return routed_output_scale(c.moe, G) / (copies + 1)


def close_1pct(req: float, eff: float) -> bool:
    """Norms of bf16 weights carry their rounding: within 1 %."""
    return abs(eff - req) <= 1e-2 * abs(req)


def replica_counts(t: Any) -> list[list[int]]:
    """r_e, the copies of each parent expert, per MoE layer of the trainer's expansion map
    (the map the weights and the optimizer state were expanded by)."""
    return [t.expansion.counts(i) for i in sorted(t.expansion.sources)]


def strategy_agrees(req: str, counts: list[list[int]]) -> bool:
    """``uniform``: every expert copied ``factor`` times. A scored strategy: a valid allocation
    (each r_e ≥ 1, the same total per layer); equal scores give the uniform one, so its name
    cannot be told from the counts."""
    totals = {sum(c) for c in counts}
    if req == "uniform":
        return len(totals) == 1 and all(len(set(c)) == 1 for c in counts)
    return len(totals) == 1 and all(min(c) >= 1 for c in counts)


def router_noise(t: Any) -> float:
    """The largest |live router bias of a replica − its source expert's bias in the parent|
    (003 Def. 3.1: U(−δ, δ) on the replicas' biases)."""
    worst = 0.0
    for i in sorted(t.expansion.sources):
        m = t.model.blocks[i].mlp
        idx = t.expansion.index(i)
        key = f"blocks.{i}.mlp.expert_bias"
        src = _parent(t, key) if key in t.parent.model_state else \
            torch.zeros(t.expansion.num_source_experts, dtype=torch.float64)
        live = m.expert_bias.detach().double().cpu()
        E = t.expansion.num_source_experts
        if len(idx) > E:
            worst = max(worst, float((live[E:] - src[idx[E:]]).abs().max()))
    return round(worst, 9)


def noise_agrees(req: float, eff: float) -> bool:
    """δ = 0: no replica's bias moved; δ > 0: the largest move lies in (0, δ]."""
    return eff == 0.0 if req == 0 else 0.0 < eff <= req * (1 + 1e-6)

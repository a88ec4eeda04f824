"""Utility scores for expert upcycling and greedy replica allocation (003 §4.2, §5.3.2, App. B).

Shape legend: E experts of one layer, B sequences, S sequence length.

Scores per expert e, with w_e all its weights (gate, up, down) and g_e = ∇_{w_e} L the gradient of
the mean next-token cross-entropy on a calibration batch (router losses excluded):
``grad_norm`` ‖g_e‖² (003 Eq. 19), ``saliency`` ‖w_e‖·‖g_e‖ (Eq. 20), ``weight_norm`` ‖w_e‖²,
``curvature`` ‖g_e‖²/H_e with H_e the diagonal empirical Fisher averaged over the expert's
parameters, H_e = mean_b ‖g_e^(b)‖² / P_e, estimated from the squared gradients of b = 1..n
micro-batches of the calibration batch (003 §4.2: "diagonal Fisher approximations"; one batch
alone would make ‖g‖²/Σg² ≡ 1). Ranking is per layer (003 §5.3.2), so the constant P_e = 3·D·f
does not change allocations.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from moe_core.errors import ConfigError
from moe_core.upcycle.strategies import GRADIENT_STRATEGIES, STRATEGIES


def check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ConfigError(
            f"upcycle.strategy={strategy!r} is not known; use one of {', '.join(STRATEGIES)}"
        )


@dataclass(frozen=True, slots=True)
class ExpertStats:
    """Per-expert statistics of one MoE layer (float64 tensors [E])."""

    w_sq: torch.Tensor
    """‖w_e‖²."""
    g_sq: torch.Tensor | None = None
    """‖g_e‖² of the full calibration batch gradient."""
    fisher: torch.Tensor | None = None
    """Diagonal empirical Fisher averaged over the expert's parameters: mean_b ‖g_e^(b)‖² / P_e."""


def utility_scores(strategy: str, stats: ExpertStats) -> torch.Tensor:
    """Score [E] of each expert under ``strategy`` (pure; 003 §4.2, App. B)."""
    check_strategy(strategy)
    if strategy == "uniform":
        return torch.ones_like(stats.w_sq)
    if strategy == "weight_norm":
        return stats.w_sq.clone()
    if stats.g_sq is None:
        raise ConfigError(f"upcycle.strategy={strategy!r} needs gradient statistics")
    if strategy == "grad_norm":
        return stats.g_sq.clone()
    if strategy == "saliency":
        return stats.w_sq.sqrt() * stats.g_sq.sqrt()
    if stats.fisher is None:
        raise ConfigError("upcycle.strategy='curvature' needs a Fisher estimate")
    # ‖g‖²/H; an expert that saw no token has g = H = 0 and scores 0.
    h = stats.fisher
    return torch.where(h > 0, stats.g_sq / h.clamp(min=1e-300), torch.zeros_like(h))


def allocate_replicas(scores_E: torch.Tensor | Sequence[float], total: int) -> list[int]:
    """Replication counts r_e ≥ 1 with Σ r_e = ``total`` (003 Def. 3.1, §5.3.2).

    Greedy selection with replacement: every expert keeps its own copy, then each extra copy goes
    to the expert with the highest utility per copy u_e / r_e (an expert can be picked again; the
    division by r_e is what makes repeated picks of one expert progressively less attractive, as
    its utility is shared among its copies). Ties go to the expert with fewer copies, then the
    lower index, so equal scores give a uniform allocation. A higher score never gets fewer
    copies: if u_a > u_b and r_b > r_a, then when b took its last copy u_b/(r_b−1) ≥ u_a/r_a' with
    r_a' ≤ r_b − 1, i.e. u_b ≥ u_a, a contradiction.
    """
    s = [float(v) for v in (scores_E.tolist() if isinstance(scores_E, torch.Tensor)
                            else scores_E)]
    E = len(s)
    if E == 0:
        raise ConfigError("allocate_replicas: no experts to allocate to")
    if any(not math.isfinite(v) or v < 0 for v in s):
        raise ConfigError(
            f"allocate_replicas: utility scores must be finite and >= 0, got {s}; check the "
            "calibration batch (a diverged model gives non-finite gradients)"
        )
    if total < E:
        raise ConfigError(f"allocate_replicas: total={total} is below the {E} source experts")
    r = [1] * E
    heap = [(-v, 1, e) for e, v in enumerate(s)]
    heapq.heapify(heap)
    for _ in range(total - E):
        _, _, e = heapq.heappop(heap)
        r[e] += 1
        heapq.heappush(heap, (-s[e] / r[e], r[e], e))
    return r


def replication_counts(
    strategy: str, num_experts: int, factor: int, scores_E: torch.Tensor | None = None
) -> list[int]:
    """r_e for one layer: ``factor`` each for ``uniform`` (003 §4.1), else greedy on scores."""
    if strategy == "uniform":
        return [factor] * num_experts
    if scores_E is None or len(scores_E) != num_experts:
        raise ConfigError(
            f"upcycle.strategy={strategy!r} needs one score per expert ({num_experts})"
        )
    return allocate_replicas(scores_E, factor * num_experts)


def split_batch(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) from tokens [B, S+1] (targets = inputs shifted by one) or a tuple
    ``(inputs, targets)`` of two [B, S] tensors."""
    if isinstance(batch, tuple) and len(batch) == 2:
        x, y = (torch.as_tensor(t) for t in batch)
    else:
        w = torch.as_tensor(batch)
        if w.ndim != 2 or w.shape[1] < 2:
            raise ConfigError(
                f"batch has shape {tuple(w.shape)}; pass calibration tokens [B, S] with S >= 2 "
                "(or an (inputs, targets) pair)"
            )
        x, y = w[:, :-1], w[:, 1:]
    if x.dtype.is_floating_point or x.shape != y.shape or x.ndim != 2:
        raise ConfigError("batch: inputs and targets must be integer token ids of equal shape "
                          "[B, S]")
    return x.long(), y.long()


def expert_stats(
    model: Any, batch: Any = None, *, gradients: bool = True, fisher_chunks: int = 0
) -> dict[int, ExpertStats]:
    """Per-MoE-layer :class:`ExpertStats` of ``model``, keyed by block index.

    With ``gradients``: one forward/backward pass of the mean cross-entropy on ``batch``
    (``torch.autograd.grad``: no ``.grad`` is written); with ``fisher_chunks`` = n > 1 the batch
    is split into n micro-batches along B (one pass each) for the Fisher estimate. The model runs
    in eval mode (no balancing accumulators move) and is left exactly as found: weights,
    ``requires_grad`` flags, train/eval mode and router statistics.
    """
    layers = {i: b.mlp for i, b in enumerate(model.blocks) if b.is_moe}
    for m in layers.values():
        if getattr(m, "ep_size", 1) > 1:
            raise ConfigError("expert utility scores need the full (unsharded) experts; gather "
                              "the expert-parallel shards first")
    names = ("w_gate", "w_up", "w_down")
    out: dict[int, ExpertStats] = {}
    with torch.no_grad():
        w_sq = {i: sum(getattr(m, n).double().pow(2).flatten(1).sum(1) for n in names)
                for i, m in layers.items()}
    if not gradients:
        return {i: ExpertStats(w_sq=w_sq[i]) for i in layers}
    if batch is None:
        raise ConfigError("gradient utility scores need batch= (calibration tokens [B, S])")
    dev = next(model.parameters()).device
    x, y = (t.to(dev) for t in split_batch(batch))
    B = x.shape[0]
    params = [getattr(m, n) for m in layers.values() for n in names]
    flags = [p.requires_grad for p in params]
    saved_stats = [(m.record_stats, m.last_stats) for m in layers.values()]
    was_training = model.training
    n = max(1, min(fisher_chunks, B))
    g_sum = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    fisher = {i: torch.zeros(m.num_local_experts, dtype=torch.float64, device=dev)
              for i, m in layers.items()}
    try:
        model.eval()
        for m in layers.values():
            m.record_stats = False
        for p in params:
            p.requires_grad_(True)
        with torch.enable_grad():
            for idx in torch.arange(B, device=dev).chunk(n):
                wb = idx.numel() / B  # mean CE over equal-length rows: chunk means average to it
                loss = model(x[idx], y[idx]).loss
                grads = torch.autograd.grad(loss, params, allow_unused=True)
                grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params)]
                for acc, g in zip(g_sum, grads):
                    acc.add_(g.double(), alpha=wb)
                for k, i in enumerate(layers):
                    sq = sum(g.double().pow(2).flatten(1).sum(1) for g in grads[3 * k:3 * k + 3])
                    fisher[i] += wb * sq
    finally:
        for p, fl in zip(params, flags):
            p.requires_grad_(fl)
        for m, (rs, ls) in zip(layers.values(), saved_stats):
            m.record_stats, m.last_stats = rs, ls
        model.train(was_training)
    for k, (i, m) in enumerate(layers.items()):
        g_sq = sum(g.pow(2).flatten(1).sum(1) for g in g_sum[3 * k:3 * k + 3])
        P = sum(getattr(m, nm)[0].numel() for nm in names)
        out[i] = ExpertStats(w_sq=w_sq[i], g_sq=g_sq, fisher=fisher[i] / P)
    return out


def expert_scores(
    model: Any, strategy: str, batch: Any = None, *, fisher_chunks: int = 8
) -> dict[int, torch.Tensor]:
    """Utility score [E] of every expert of every MoE layer of ``model`` (keyed by block index).
    Gradient strategies need ``batch``; the model's weights are not changed."""
    check_strategy(strategy)
    if strategy in GRADIENT_STRATEGIES and batch is None:
        raise ConfigError(
            f"expand_experts(strategy={strategy!r}) needs batch= (calibration tokens [B, S]) "
            "for one forward/backward pass; pass a batch or use strategy='uniform'"
        )
    grads = strategy in GRADIENT_STRATEGIES
    chunks = fisher_chunks if strategy == "curvature" else 1
    stats = expert_stats(model, batch, gradients=grads, fisher_chunks=chunks)
    return {i: utility_scores(strategy, s) for i, s in stats.items()}

"""Routing math as pure functions on tensors.

Shape legend: T tokens, E experts, K experts per token (top-K), D model dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from moe_core.config import RouterConfig

_EPS = 1e-6


@dataclass(frozen=True, slots=True)
class Routing:
    """Result of routing T tokens to K of E experts."""

    logits_TE: torch.Tensor
    """Logits that enter the softmax (after gating logit normalization, if on)."""
    probs_TE: torch.Tensor
    """Softmax over all experts of ``logits_TE``; feeds aux losses and router statistics."""
    topk_idx_TK: torch.Tensor
    """Selected experts per token (int64)."""
    topk_weight_TK: torch.Tensor
    """Weight of each selected expert's output."""


def normalize_logits(z_TE: torch.Tensor, lam: float) -> torch.Tensor:
    """z̃ = λ·(z − μ)/σ over the expert dimension (002 §4.1); σ is the population std."""
    mu = z_TE.mean(dim=-1, keepdim=True)
    sigma = z_TE.std(dim=-1, keepdim=True, unbiased=False)
    return lam * (z_TE - mu) / (sigma + _EPS)


def route(
    raw_logits_TE: torch.Tensor,
    *,
    top_k: int,
    cfg: RouterConfig,
    selection_bias_E: torch.Tensor | None = None,
) -> Routing:
    """Pick top-K experts per token and their output weights.

    ``softmax_topk`` (004 §2.1.2): weights are softmax probabilities over all E experts of the
    selected K, optionally renormalized to sum to one (002 Eq. 2). ``topk_softmax`` (000 Eq. 15):
    weights are the softmax over the K selected logits and always sum to one.

    ``selection_bias_E`` (loss-free balancing, 003 §2) is added to the score that top-K is taken
    over (probabilities for ``softmax_topk``, logits for ``topk_softmax``) and changes only which
    experts are selected, never the weights, so no gradient flows through it.
    """
    z = raw_logits_TE.float()
    if cfg.logit_norm_lambda is not None:
        z = normalize_logits(z, cfg.logit_norm_lambda)
    probs = F.softmax(z, dim=-1)
    scores = probs if cfg.order == "softmax_topk" else z
    if selection_bias_E is not None:
        scores = scores + selection_bias_E.to(scores.dtype)
    idx = torch.topk(scores.detach(), top_k, dim=-1).indices
    if cfg.order == "softmax_topk":
        w = probs.gather(-1, idx)
        if cfg.renormalize:
            w = w / w.sum(dim=-1, keepdim=True)
    else:
        w = F.softmax(z.gather(-1, idx), dim=-1)
    return Routing(logits_TE=z, probs_TE=probs, topk_idx_TK=idx, topk_weight_TK=w)


def capacity(num_tokens: int, top_k: int, num_experts: int, capacity_factor: float) -> int:
    """Per-expert capacity ceil(cf·T·K/E) (Switch Transformer; 002 §4.2 drop rate)."""
    import math

    return max(1, math.ceil(capacity_factor * num_tokens * top_k / num_experts))


def overflow_count(counts_E: torch.Tensor, cap: int) -> torch.Tensor:
    """Assignments that exceed capacity ``cap``: Σ_e max(0, count_e − cap)."""
    return (counts_E - cap).clamp(min=0).sum()

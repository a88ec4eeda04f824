"""Load-balancing losses and balancing-state updates as pure functions.

Shape legend: T tokens, E experts, K experts per token.
"""

from __future__ import annotations

import torch


def switch_aux_loss(probs_TE: torch.Tensor, topk_idx_TK: torch.Tensor,
                    counts_E: torch.Tensor | None = None) -> torch.Tensor:
    """Switch load-balancing loss, normalised to 1 at perfect balance.

    000 App. A.3: L = (4/T²)·Σ_i (Σ_j P_ji)·Q_i for 8 experts top-2; in general the factor is E/K
    (Megatron's switch_load_balancing_loss_func), with Q_i the assignments to expert i.
    ``counts_E``: the Q_i when the caller has them already (the MoE layer's dispatch counts);
    else they are counted from ``topk_idx_TK``.
    """
    T, E = probs_TE.shape
    K = topk_idx_TK.shape[-1]
    if counts_E is None:
        counts_E = torch.bincount(topk_idx_TK.reshape(-1), minlength=E)
    q_E = counts_E.to(probs_TE.dtype)
    p_E = probs_TE.sum(dim=0)
    return (E / (K * T * T)) * (p_E * q_E).sum()


def squared_aux_loss(probs_TE: torch.Tensor) -> torch.Tensor:
    """Squared-deviation aux loss Σ_j (1/n − (1/T)Σ_i g_ij)² (002 Eq. 3)."""
    E = probs_TE.shape[-1]
    return ((1.0 / E - probs_TE.mean(dim=0)) ** 2).sum()


def z_loss(logits_TE: torch.Tensor) -> torch.Tensor:
    """Router z-loss (ST-MoE): mean over tokens of logsumexp(logits)²."""
    return torch.logsumexp(logits_TE, dim=-1).pow(2).mean()


def adaptive_aux_target(drop_rate: float, xi: float, alpha_max: float) -> float:
    """α̂ = f(d) = min(ξ·d, α_max) (002 Eq. 5, 9)."""
    return min(xi * drop_rate, alpha_max)


def adaptive_aux_coef(
    alpha_prev: float, drop_rate: float, *, xi: float, alpha_max: float, beta: float
) -> float:
    """α_{i+1} = β·α_i + (1−β)·f(d_i) (002 Eq. 6)."""
    return beta * alpha_prev + (1.0 - beta) * adaptive_aux_target(drop_rate, xi, alpha_max)


def loss_free_bias_update(
    bias_E: torch.Tensor, load_E: torch.Tensor, rate: float
) -> torch.Tensor:
    """b_i ← b_i + rate·sign(mean load − load_i) (003 §2; Wang et al. 2024)."""
    load = load_E.to(bias_E.dtype)
    return bias_E + rate * torch.sign(load.mean() - load)

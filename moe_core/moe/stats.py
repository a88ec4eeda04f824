"""Router and expert statistics as pure functions (002 §3.2, §4.1; 004 Fig. 6).

Shape legend: T tokens, E experts, X flattened expert parameters.
"""

from __future__ import annotations

import math

import torch


def load_fractions(counts_E: torch.Tensor) -> torch.Tensor:
    """Fraction of all assignments each expert received (sums to 1)."""
    c = counts_E.double()
    return c / c.sum().clamp(min=1)


def routing_entropy(probs_TE: torch.Tensor) -> float:
    """Mean over tokens of −Σ p log p of the full router distribution (nats)."""
    p = probs_TE.double().clamp(min=1e-30)
    return float(-(p * p.log()).sum(dim=-1).mean())


def max_ratios(probs_TE: torch.Tensor) -> tuple[float, float]:
    """Mean Max1/Max2 and Max2/Max3 of the router probabilities (002 §4.1, Fig. 3).

    NaN where there are fewer experts than the ratio needs.
    """
    E = probs_TE.shape[-1]
    if E < 2:
        return math.nan, math.nan
    top = torch.topk(probs_TE.double(), min(3, E), dim=-1).values.clamp(min=1e-30)
    r12 = float((top[:, 0] / top[:, 1]).mean())
    r23 = float((top[:, 1] / top[:, 2]).mean()) if E >= 3 else math.nan
    return r12, r23


def mean_pairwise_cosine(vectors_EX: torch.Tensor) -> float:
    """Mean cosine similarity over distinct pairs of rows ("expert similarity", 002 Fig. 1)."""
    E = vectors_EX.shape[0]
    if E < 2:
        return math.nan
    v = torch.nn.functional.normalize(vectors_EX.double(), dim=-1)
    sim = v @ v.T
    off = sim.sum() - sim.diagonal().sum()
    return float(off / (E * (E - 1)))


def cosine_to_reference(vectors_EX: torch.Tensor, reference_X: torch.Tensor) -> float:
    """Mean cosine similarity of each row to one reference vector (004 Fig. 6: upcycled experts
    vs the dense parent's MLP)."""
    v = torch.nn.functional.normalize(vectors_EX.double(), dim=-1)
    r = torch.nn.functional.normalize(reference_X.double().reshape(1, -1), dim=-1)
    return float((v @ r.T).mean())


def max_violation(load_E: torch.Tensor) -> float:
    """MaxVio = (max_e load_e − mean load) / mean load: 0 at perfect balance, E − 1 when one
    expert takes every assignment (Wang et al. 2024, arXiv:2408.15664 §4.1, Eq. 6: the
    loss-free balancing paper, 003's [52]; not one of the seeds)."""
    load = load_E.double()
    mean = load.mean()
    return float((load.max() - mean) / mean) if float(mean) > 0 else math.nan


LAYER_HEALTH: dict[str, str] = {
    "max_load": "max", "max_vio": "max", "dead_experts": "max", "drop_rate": "max",
    "max1_max2": "min", "expert_similarity": "max",
}
"""Per-layer health statistic → how its worst layer is picked: ``max`` where a larger value is
less healthy (collapse, imbalance, dead experts, dropped tokens, copies that never diverge),
``min`` for Max1/Max2 (002 §4.1: a ratio near 1 is a router that cannot tell its experts
apart)."""


def worst_layer(stat: str, values_L: list[float]) -> float:
    """The least healthy layer's value of ``stat`` (``LAYER_HEALTH``); NaN layers ignored, NaN
    when every layer is."""
    vals = [v for v in values_L if not math.isnan(v)]
    if not vals:
        return math.nan
    return max(vals) if LAYER_HEALTH[stat] == "max" else min(vals)

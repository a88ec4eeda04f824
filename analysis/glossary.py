"""What each router statistic in the results means, one line each (the report prints the lines
of the columns it shows). Definitions follow ``moe_core.train.evaluate`` and
``moe_core.moe.stats``: every value is measured on the validation batches of an eval and
averaged over the MoE layers unless said otherwise."""

from __future__ import annotations

from collections.abc import Iterable

ROUTER_METRICS: dict[str, str] = {
    "router.max_load": "share of the token-to-expert assignments the busiest expert receives "
                       "(1/E is perfect balance, 1 is every token on one expert)",
    "router.min_load": "share the least-used expert receives (0: an expert no token reached)",
    "router.dead_experts": "experts no validation token reached, summed over the MoE layers "
                           "(002 §4)",
    "router.entropy": "mean entropy of each token's router distribution in nats (ln E: "
                      "uniform, 0: one expert gets all the probability)",
    "router.max1_max2": "mean ratio of each token's largest to second-largest router "
                        "probability (002 §4.1; near 1: the router hesitates between experts)",
    "router.max2_max3": "the same for the second- and third-largest probabilities",
    "router.expert_similarity": "mean cosine similarity of the experts' flattened weights "
                                "within a layer (002 Fig. 1; 1: the experts are still "
                                "identical copies)",
    "router.cos_to_parent": "mean cosine similarity of each expert's weights to the dense "
                            "parent's MLP (004 Fig. 6; 1: not moved from the parent)",
    "router.drop_rate": "share of assignments dropped by the expert capacity limit (0 when "
                        "dropless)",
    "router.overflow_rate_cf1": "share of assignments that would overflow at capacity factor "
                                "1 (an imbalance signal, 002 §4.2)",
    "router.aux_switch": "Switch load-balancing loss, normalised to 1 at perfect balance "
                         "(000 App. A.3)",
    "router.aux_coef": "the coefficient the balancing loss is multiplied by",
    "aux_loss": "the auxiliary loss added to the LM loss (coefficient × balancing loss, plus "
                "the z-loss if set)",
}


def glossary_lines(columns: Iterable[str]) -> list[str]:
    """``- name: meaning`` for each router statistic among ``columns``, in their order."""
    return [f"- `{c}`: {ROUTER_METRICS[c]}" for c in columns if c in ROUTER_METRICS]

"""Upcycling operators: dense → MoE (000 §2.1, App. A.6; 004 §2.3, App. A) and MoE → MoE expert
upcycling (003 Def. 3.1, §4, App. D), each as a model-level function and a state-dict variant
that takes torch tensors or numpy arrays (parents arrive from Ray's object store as numpy).

Operators are pure: the source model / state is never modified.
"""

from __future__ import annotations

from moe_core.upcycle.dense import (
    dense_to_moe,
    dense_to_moe_state,
    granularity_of,
    routed_output_scale,
    router_init,
)
from moe_core.upcycle.experts import ExpansionMap, expand_experts, expand_experts_state
from moe_core.upcycle.optim import (
    WRAPPED,
    expand_optimizer_state,
    join_optimizer_states,
    optimizer_param_names,
    shard_optimizer_state,
)
from moe_core.upcycle.perturb import (
    ExpertWeights,
    Perturbation,
    add_noise,
    apply_perturbation,
    drop_reinit,
    interpolate,
    scale_copy,
)
from moe_core.upcycle.utility import (
    STRATEGIES,
    ExpertStats,
    allocate_replicas,
    expert_scores,
    expert_stats,
    replication_counts,
    utility_scores,
)

__all__ = [
    "WRAPPED",
    "STRATEGIES",
    "ExpansionMap",
    "ExpertStats",
    "ExpertWeights",
    "Perturbation",
    "add_noise",
    "allocate_replicas",
    "apply_perturbation",
    "dense_to_moe",
    "dense_to_moe_state",
    "drop_reinit",
    "expand_experts",
    "expand_experts_state",
    "expand_optimizer_state",
    "expert_scores",
    "expert_stats",
    "granularity_of",
    "interpolate",
    "join_optimizer_states",
    "optimizer_param_names",
    "replication_counts",
    "routed_output_scale",
    "router_init",
    "scale_copy",
    "shard_optimizer_state",
    "utility_scores",
]

"""Upcycling operators: dense → MoE (000 §2.1, App. A.6; 004 §2.3, App. A) and MoE → MoE expert
upcycling (003 Def. 3.1, §4, App. D), each as a model-level function and a state-dict variant
that takes torch tensors or numpy arrays (parents arrive from Ray's object store as numpy).

Operators are pure: the source model / state is never modified.
"""

from __future__ import annotations

from moe_core.lazy import lazy_exports

# Loaded on first use (PEP 562), so that importing a light submodule (a config, a constant)
# does not import torch through this package.
_LAZY = {
    "dense_to_moe": "moe_core.upcycle.dense",
    "dense_to_moe_state": "moe_core.upcycle.dense",
    "granularity_of": "moe_core.upcycle.dense",
    "routed_output_scale": "moe_core.upcycle.dense",
    "router_init": "moe_core.upcycle.dense",
    "ExpansionMap": "moe_core.upcycle.experts",
    "expand_experts": "moe_core.upcycle.experts",
    "expand_experts_state": "moe_core.upcycle.experts",
    "WRAPPED": "moe_core.upcycle.optim",
    "expand_optimizer_state": "moe_core.upcycle.optim",
    "join_optimizer_states": "moe_core.upcycle.optim",
    "optimizer_param_names": "moe_core.upcycle.optim",
    "shard_optimizer_state": "moe_core.upcycle.optim",
    "ExpertWeights": "moe_core.upcycle.perturb",
    "Perturbation": "moe_core.upcycle.perturb",
    "add_noise": "moe_core.upcycle.perturb",
    "apply_perturbation": "moe_core.upcycle.perturb",
    "drop_reinit": "moe_core.upcycle.perturb",
    "interpolate": "moe_core.upcycle.perturb",
    "scale_copy": "moe_core.upcycle.perturb",
    "STRATEGIES": "moe_core.upcycle.utility",
    "ExpertStats": "moe_core.upcycle.utility",
    "allocate_replicas": "moe_core.upcycle.utility",
    "expert_scores": "moe_core.upcycle.utility",
    "expert_stats": "moe_core.upcycle.utility",
    "replication_counts": "moe_core.upcycle.utility",
    "utility_scores": "moe_core.upcycle.utility",
}


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


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)


"""Names of the expert-replication strategies (torch-free: ``TrainConfig`` checks them)."""

STRATEGIES = ("uniform", "grad_norm", "saliency", "weight_norm", "curvature")
"""Replication strategies of ``expand_experts`` (003 §4.1, §4.2)."""
GRADIENT_STRATEGIES = ("grad_norm", "saliency", "curvature")

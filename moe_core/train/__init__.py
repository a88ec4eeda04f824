"""Training on the DeepSpeed engine: configs, the Trainer, checkpoints, WSD branches, parents.

Layout: ``config`` (the run's dataclasses) → ``engine`` (ranks, device, dtype, DeepSpeed),
``init`` (initial model through the upcycler table), ``evaluate``, ``callbacks``,
``checkpoint`` → ``loop`` (``Trainer``: set-up / ``step()`` / ``fit()``, and ``train()``) →
``wsd`` (stable runs and decay branches) and ``runner`` (parents: train once, cache, load).
"""

from __future__ import annotations

from moe_core.lazy import lazy_exports

# Loaded on first use (PEP 562), so that importing a light submodule (a config, a constant)
# does not import torch through this package.
_LAZY = {
    "Phase": "moe_core.schedules",
    "Callback": "moe_core.train.callbacks",
    "FunctionCallback": "moe_core.train.callbacks",
    "ParentState": "moe_core.train.callbacks",
    "TrainResult": "moe_core.train.callbacks",
    "TrainConfig": "moe_core.train.config",
    "apply_overrides": "moe_core.train.config",
    "load_yaml": "moe_core.train.config",
    "train_config_from_dict": "moe_core.train.config",
    "Trainer": "moe_core.train.loop",
    "train": "moe_core.train.loop",
}


__all__ = [
    "Callback",
    "FunctionCallback",
    "ParentState",
    "Phase",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "apply_overrides",
    "load_yaml",
    "train",
    "train_config_from_dict",
]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)


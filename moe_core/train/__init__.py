"""Training on the DeepSpeed engine: configs, the Trainer, checkpoints, WSD branches, parents.

Layout: ``config`` (the run's dataclasses) → ``engine`` (ranks, device, dtype, DeepSpeed),
``init`` (initial model through the upcycler table), ``evaluate``, ``callbacks``,
``checkpoint`` → ``loop`` (``Trainer``: set-up / ``step()`` / ``fit()``, and ``train()``) →
``wsd`` (stable runs and decay branches) and ``runner`` (parents: train once, cache, load).
"""

from moe_core.schedules import Phase
from moe_core.train.callbacks import Callback, FunctionCallback, ParentState, TrainResult
from moe_core.train.config import TrainConfig, apply_overrides, load_yaml, train_config_from_dict
from moe_core.train.loop import Trainer, train

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

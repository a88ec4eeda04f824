"""Training on the DeepSpeed engine: configs, the loop, checkpoints, WSD branches, parents."""

from moe_core.train.config import TrainConfig, apply_overrides, load_yaml, train_config_from_dict
from moe_core.train.trainer import Callback, ParentState, TrainResult, train

__all__ = [
    "Callback",
    "ParentState",
    "TrainConfig",
    "TrainResult",
    "apply_overrides",
    "load_yaml",
    "train",
    "train_config_from_dict",
]

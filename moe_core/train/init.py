"""The run's model at step 0: fresh, or made from a parent state by an upcycler.

``UPCYCLERS`` maps each ``upcycle.method`` to its operator; ``UpcycleConfig`` accepts exactly
these names (checked here at import), so a new parent source (a Hugging Face checkpoint, say)
adds one entry rather than a branch in the loop.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any

import torch

from moe_core import upcycle
from moe_core.config import ModelConfig
from moe_core.model import Transformer, build_model
from moe_core.train.callbacks import ParentState
from moe_core.train.checkpoint import state_from_numpy
from moe_core.train.config import TrainConfig, UpcycleConfig

# (parent state, parent ModelConfig, run config, calibration batch) -> (state, ModelConfig)
Upcycler = Callable[[dict[str, torch.Tensor], ModelConfig, TrainConfig, Any],
                    tuple[dict[str, torch.Tensor], ModelConfig]]


def _continue(state, parent_cfg, cfg, calib):
    """Same architecture: continued training (the dense baseline of 004 Fig. 4a)."""
    return state, cfg.model_config(parent_cfg.vocab_size)


def _dense_to_moe(state, parent_cfg, cfg, calib):
    """Dense → MoE (000 §2.1; 004 §2.3: virtual groups and weight scaling)."""
    u = cfg.upcycle
    return upcycle.dense_to_moe_state(state, parent_cfg, cfg.moe,
                                      virtual_groups=u.virtual_groups,
                                      weight_scaling=u.weight_scaling, seed=cfg.seed)


def _expand_experts(state, parent_cfg, cfg, calib):
    """E → factor·E experts (003 Def. 3.1) with the replication strategy."""
    u = cfg.upcycle
    return upcycle.expand_experts_state(state, parent_cfg, u.factor, strategy=u.strategy,
                                        batch=calib, router_noise=u.router_noise,
                                        seed=cfg.seed)[:2]


UPCYCLERS: dict[str, Upcycler] = {
    "continue": _continue,
    "dense_to_moe": _dense_to_moe,
    "expand_experts": _expand_experts,
}
_METHODS = typing.get_args(typing.get_type_hints(UpcycleConfig)["method"])
if set(UPCYCLERS) != set(_METHODS):
    raise ImportError(f"UPCYCLERS {sorted(UPCYCLERS)} != upcycle.method values {_METHODS}")


def needs_calibration(cfg: TrainConfig) -> bool:
    """Expert upcycling with a data-dependent replication strategy reads one batch."""
    u = cfg.upcycle
    return u is not None and u.method == "expand_experts" and u.strategy != "uniform"


def build_initial_model(
    cfg: TrainConfig,
    vocab_size: int,
    parent: ParentState | None,
    calib: Any = None,
    moe_layer_cls: type | None = None,
) -> Transformer:
    """The run's model at step 0 (all experts): fresh, or upcycled from the parent state."""
    torch.manual_seed(cfg.seed)
    mcfg = cfg.model_config(vocab_size)
    kw = {"moe_layer_cls": moe_layer_cls} if moe_layer_cls is not None else {}
    if parent is None:
        return build_model(mcfg, **kw)
    state = state_from_numpy(parent.model_state)
    new_state, new_cfg = UPCYCLERS[cfg.upcycle.method](state, parent.model_config, cfg, calib)
    model = build_model(dataclasses.replace(new_cfg, moe=mcfg.moe), **kw)
    model.load_state_dict(new_state)
    return model

"""The run's model at step 0: fresh, or made from a parent state by an upcycler.

``UPCYCLERS`` maps each ``upcycle.method`` to its operator; ``UpcycleConfig`` accepts exactly
these names (checked here at import), so a new parent source (a Hugging Face checkpoint, say)
adds one entry rather than a branch in the loop.
"""

from __future__ import annotations

import dataclasses
import logging
import typing
from collections.abc import Callable
from typing import Any

import torch

from moe_core import upcycle
from moe_core.config import ModelConfig
from moe_core.errors import ConfigError
from moe_core.model import Transformer, build_model
from moe_core.moe.named_state import load_model_state
from moe_core.train.callbacks import ParentState
from moe_core.train.checkpoint import state_from_numpy
from moe_core.train.config import TrainConfig, UpcycleConfig
from moe_core.upcycle.experts import ExpansionMap

log = logging.getLogger("moe_core.train")

# (parent state, parent ModelConfig, run config, calibration batch)
#   -> (state, ModelConfig, ExpansionMap of expert upcycling or None)
Upcycler = Callable[[dict[str, torch.Tensor], ModelConfig, TrainConfig, Any],
                    tuple[dict[str, torch.Tensor], ModelConfig, ExpansionMap | None]]


def _continue(state, parent_cfg, cfg, calib):
    """Same architecture: continued training (the dense baseline of 004 Fig. 4a)."""
    return state, cfg.model_config(parent_cfg.vocab_size), None


def _dense_to_moe(state, parent_cfg, cfg, calib):
    """Dense → MoE (000 §2.1; 004 §2.3: virtual groups and weight scaling)."""
    u = cfg.upcycle
    new_state, new_cfg = upcycle.dense_to_moe_state(state, parent_cfg, cfg.moe,
                                                    virtual_groups=u.virtual_groups,
                                                    weight_scaling=u.weight_scaling,
                                                    seed=cfg.seed)
    return new_state, new_cfg, None


def _expand_experts(state, parent_cfg, cfg, calib):
    """E → factor·E experts (003 Def. 3.1) with the replication strategy."""
    u = cfg.upcycle
    return upcycle.expand_experts_state(state, parent_cfg, u.factor, strategy=u.strategy,
                                        batch=calib, router_noise=u.router_noise,
                                        seed=cfg.seed)


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
) -> tuple[Transformer, ExpansionMap | None]:
    """The run's model at step 0 (all experts): fresh, or upcycled from the parent state; with
    the ExpansionMap when experts were replicated (the optimizer state follows it)."""
    torch.manual_seed(cfg.seed)
    mcfg = cfg.model_config(vocab_size)
    kw = {"moe_layer_cls": moe_layer_cls} if moe_layer_cls is not None else {}
    if parent is None:
        return build_model(mcfg, **kw), None
    if vocab_size > parent.model_config.vocab_size:
        raise ConfigError(f"the data's vocabulary ({vocab_size} tokens) exceeds the parent's "
                          f"vocab_size={parent.model_config.vocab_size}; tokenize with the "
                          "parent's tokenizer (data.tokenizer: its folder)")
    state = state_from_numpy(parent.model_state)
    new_state, new_cfg, expansion = UPCYCLERS[cfg.upcycle.method](state, parent.model_config,
                                                                  cfg, calib)
    model = build_model(dataclasses.replace(new_cfg, moe=mcfg.moe), **kw)
    load_model_state(model, new_state, resume=False)  # its own config sets α^(l)
    return model, expansion


def initial_optimizer_state(parent: ParentState | None, expansion: ExpansionMap | None,
                            model: Transformer, optimizer: Any,
                            ep: tuple[int, int] = (0, 1)) -> dict[str, Any] | None:
    """The AdamW state a run starts from: the parent's, its expert moments gathered with the
    experts, when experts were replicated at τ (003 §3: training continues through the
    transition); None (a fresh AdamW) otherwise. ``ep`` = (expert-parallel rank, size): a
    rank holding a slice of the experts gets the same slice of their moments. Needs the
    parent's state in the format of this run's optimizer at ZeRO 0 (torch's in fp32,
    DeepSpeed's bf16 wrapper's, fp32 masters included, in bf16); any other starts afresh, with
    a warning."""
    if parent is None or expansion is None or parent.optimizer_state is None:
        return None
    state = parent.optimizer_state
    inner = getattr(optimizer, "optimizer", optimizer)
    wrapped = upcycle.WRAPPED in state  # DeepSpeed's bf16/fp16 ZeRO-0 wrapper: fp32 masters
    torch_format = {"state", "param_groups"} <= set(state[upcycle.WRAPPED] if wrapped else state)
    if not (torch_format and isinstance(inner, torch.optim.Optimizer) and
            wrapped == hasattr(optimizer, "fp32_groups")):
        log.warning("the parent's optimizer state (%s) does not fit this run's optimizer (%s); "
                    "the expanded run starts with a fresh AdamW",
                    "DeepSpeed wrapper" if wrapped else "torch" if torch_format else "other",
                    type(optimizer).__name__)
        return None
    names = upcycle.optimizer_param_names(model, optimizer)
    out = upcycle.expand_optimizer_state(state, expansion, param_names=names)
    if ep[1] > 1:
        out = upcycle.shard_optimizer_state(out, names, *ep)
    return with_own_groups(out, optimizer)


def with_own_groups(state: dict[str, Any], optimizer: Any) -> dict[str, Any]:
    """``state`` (built for another expert-parallel layout) with ``optimizer``'s own group
    identity: DeepSpeed names an expert group after its expert-parallel size (``ep_size_1`` in
    a 1-rank parent, ``ep_size_2`` on 2 expert ranks). Modifies and returns ``state``."""
    inner = getattr(optimizer, "optimizer", optimizer)
    groups = (state[upcycle.WRAPPED] if upcycle.WRAPPED in state else state)["param_groups"]
    for g, mine in zip(groups, inner.param_groups):
        g.update({k: mine[k] for k in ("name", "moe") if k in mine})
    return state

"""Expand AdamW moments together with the experts (003 §3: a run resumed after the transition τ
keeps its optimizer state).

Every per-parameter tensor whose leading dimension indexes the E source experts (exp_avg,
exp_avg_sq, max_exp_avg_sq of ``w_gate``, ``w_up``, ``w_down`` and ``router.weight`` of an MoE
layer) is gathered with the same :class:`ExpansionMap` as the weights, so a replica starts with
its source's moments. Scalars (``step``) and every other parameter's state are copied.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from moe_core.errors import ConfigError
from moe_core.upcycle.experts import ExpansionMap

_EXPERT_PARAM = re.compile(r"(?:^|\.)blocks\.(\d+)\.mlp\.(w_gate|w_up|w_down|router\.weight)$")
_SHARDED_PARAM = re.compile(r"(?:^|\.)blocks\.\d+\.mlp\.(w_gate|w_up|w_down)$")
"""Expert weights an expert-parallel rank holds a slice of (``MoELayer.shard_experts``); the
router stays whole on every rank."""


def optimizer_param_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Names of the optimizer's parameters in the order of its state_dict ids (param groups in
    order, parameters in order within each group)."""
    names = {id(p): n for n, p in model.named_parameters()}
    try:
        return [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    except KeyError:
        raise ConfigError("optimizer holds a parameter that is not in the model") from None


def _expand_value(v: Any, idx: torch.Tensor, E: int) -> Any:
    if isinstance(v, torch.Tensor):
        if v.ndim >= 1 and v.shape[0] == E:
            return v.index_select(0, idx.to(v.device))
        return v.clone()
    if isinstance(v, np.ndarray):
        if v.ndim >= 1 and v.shape[0] == E:
            return v[idx.numpy()].copy()
        return v.copy()
    return copy.deepcopy(v)


def _expand_entry(name: str, entry: Any, emap: ExpansionMap) -> Any:
    m = _EXPERT_PARAM.search(name)
    if m is None or int(m.group(1)) not in emap.sources:
        if isinstance(entry, Mapping):
            return {k: _expand_value(v, torch.arange(0), -1) for k, v in entry.items()}
        return _expand_value(entry, torch.arange(0), -1)
    idx = emap.index(int(m.group(1)))
    E = emap.num_source_experts
    if isinstance(entry, Mapping):
        return {k: _expand_value(v, idx, E) for k, v in entry.items()}
    return _expand_value(entry, idx, E)


def expand_optimizer_state(
    opt_state: Mapping[str, Any],
    emap: ExpansionMap,
    *,
    param_names: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Optimizer state of the E-expert model → state for the factor·E-expert model.

    ``opt_state`` is either a torch optimizer ``state_dict()`` (``{"state": {id: {...}},
    "param_groups": [...]}``; then ``param_names`` gives the parameter name of each id in order,
    see :func:`optimizer_param_names`) or a name-keyed mapping ``{param name: {"exp_avg": T,
    "exp_avg_sq": T, ...}}`` (DeepSpeed-agnostic; values torch or numpy). Parameter names may
    carry a wrapper prefix (``module.``). Returns a new dict; the input is not modified. The
    expanded model's parameters come in the same order as the source's, so a torch state dict
    keeps its ids and loads into an optimizer built over ``new_model.parameters()`` in the same
    grouping.
    """
    if "state" in opt_state and "param_groups" in opt_state:
        ids = [pid for g in opt_state["param_groups"] for pid in g["params"]]
        if param_names is None or len(param_names) != len(ids):
            raise ConfigError(
                f"expand_optimizer_state: a torch optimizer state_dict needs param_names, one "
                f"name per parameter id ({len(ids)}); use optimizer_param_names(model, opt)"
            )
        name_of = dict(zip(ids, param_names))
        state = {pid: _expand_entry(name_of[pid], entry, emap)
                 for pid, entry in opt_state["state"].items()}
        out = {k: copy.deepcopy(v) for k, v in opt_state.items() if k != "state"}
        out["state"] = state
        return out
    return {name: _expand_entry(name, entry, emap) for name, entry in opt_state.items()}


def shard_optimizer_state(opt_state: Mapping[str, Any], param_names: Sequence[str],
                          ep_rank: int, ep_size: int) -> dict[str, Any]:
    """The part of a whole-model torch optimizer ``state_dict`` that expert-parallel rank
    ``ep_rank`` of ``ep_size`` holds: every per-expert tensor of ``w_gate``, ``w_up`` and
    ``w_down`` ([E, ·, ·]; a dense layer's 2-D weights of the same names are not experts) cut
    to the rank's consecutive slice of experts along dim 0, as
    ``MoELayer.shard_experts`` cuts the weights; everything else (the router, scalars such as
    ``step``) copied whole. ``param_names`` names each parameter id in order
    (:func:`optimizer_param_names`). Returns a new dict; the input is not modified."""
    ids = [pid for g in opt_state["param_groups"] for pid in g["params"]]
    if len(param_names) != len(ids):
        raise ConfigError(f"shard_optimizer_state: {len(param_names)} parameter names for "
                          f"{len(ids)} parameter ids; use optimizer_param_names(model, opt)")
    name_of = dict(zip(ids, param_names))

    def cut(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.ndim == 3:  # [E, ., .]; a dense layer's is 2-D
            E = v.shape[0]
            if E % ep_size:
                raise ConfigError(f"{E} experts do not split over {ep_size} expert ranks")
            n = E // ep_size
            return v[ep_rank * n:(ep_rank + 1) * n].clone()
        return copy.deepcopy(v)

    state = {pid: ({k: cut(v) for k, v in entry.items()}
                   if _SHARDED_PARAM.search(name_of[pid]) else copy.deepcopy(entry))
             for pid, entry in opt_state["state"].items()}
    out = {k: copy.deepcopy(v) for k, v in opt_state.items() if k != "state"}
    out["state"] = state
    return out

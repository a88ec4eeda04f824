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


def is_expert_shard(name: str, t: Any) -> bool:
    """Whether ``t`` (a weight named ``name``, or its moment or fp32 master) is one an
    expert-parallel rank holds a slice of (``MoELayer.shard_experts``): an MoE layer's
    [E, ·, ·] ``w_gate``/``w_up``/``w_down``. A dense layer's 2-D weights of the same names are
    whole, and so is the router."""
    return isinstance(t, torch.Tensor) and t.ndim == 3 and _SHARDED_PARAM.search(name) is not None


def optimizer_param_names(model: torch.nn.Module, optimizer: Any) -> list[str]:
    """Names of the optimizer's parameters in the order of its state_dict ids (param groups in
    order, parameters in order within each group). DeepSpeed's fp16/bf16 ZeRO-0 wrappers hold
    the model's parameters in ``fp16_groups`` (their torch optimizer holds fp32 copies), in the
    same order."""
    names = {id(p): n for n, p in model.named_parameters()}
    groups = getattr(optimizer, "fp16_groups", None) or [g["params"] for g in
                                                         optimizer.param_groups]
    try:
        return [names[id(p)] for g in groups for p in g]
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
    grouping. A DeepSpeed fp16/bf16 ZeRO-0 wrapper's state (:data:`WRAPPED`) expands its torch
    state and its fp32 master weights (``fp32_groups``, the same parameter order) alike.
    """
    if WRAPPED in opt_state:
        out = {k: copy.deepcopy(v) for k, v in opt_state.items()
               if k not in (WRAPPED, "fp32_groups")}
        out[WRAPPED] = expand_optimizer_state(opt_state[WRAPPED], emap, param_names=param_names)
        if "fp32_groups" in opt_state:
            names = iter(param_names or ())
            out["fp32_groups"] = [[_expand_entry(next(names), t, emap) for t in group]
                                  for group in opt_state["fp32_groups"]]
        return out
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


WRAPPED = "optimizer_state_dict"
"""Key under which DeepSpeed's fp16/bf16 ZeRO-0 wrappers (``FP16_UnfusedOptimizer``,
``FP16_Optimizer``) keep the torch optimizer's state dict; their ``fp32_groups`` (master
weights, one list per parameter group) come in the same parameter order."""


def _per_rank_experts(states: Sequence[Mapping[str, Any]], param_names: Sequence[str],
                      fn: Any) -> dict[str, Any]:
    """``states[0]`` with every per-expert tensor (an [E, ·, ·] moment or fp32 master of an
    expert weight, :data:`_SHARDED_PARAM`) replaced by ``fn(the same tensor in each state)``;
    the rest copied from ``states[0]``. A torch ``state_dict`` or a DeepSpeed ZeRO-0 wrapper's
    (its torch state and its ``fp32_groups``)."""
    first = states[0]
    if WRAPPED in first:  # DeepSpeed's fp16/bf16 wrapper around a torch optimizer
        out = {k: copy.deepcopy(v) for k, v in first.items() if k not in (WRAPPED, "fp32_groups")}
        out[WRAPPED] = _per_rank_experts([st[WRAPPED] for st in states], param_names, fn)
        if "fp32_groups" in first:
            flat = iter(param_names)
            out["fp32_groups"] = [
                [fn([st["fp32_groups"][g][j] for st in states])
                 if is_expert_shard(next(flat), t) else t.clone()
                 for j, t in enumerate(group)]
                for g, group in enumerate(first["fp32_groups"])]
        return out
    ids = [pid for g in first["param_groups"] for pid in g["params"]]
    if len(param_names) != len(ids):
        raise ConfigError(f"optimizer state: {len(param_names)} parameter names for "
                          f"{len(ids)} parameter ids; use optimizer_param_names(model, opt)")
    name_of = dict(zip(ids, param_names))
    state = {}
    for pid, entry in first["state"].items():
        state[pid] = {k: fn([st["state"][pid][k] for st in states])
                      if is_expert_shard(name_of[pid], v) else copy.deepcopy(v)
                      for k, v in entry.items()}
    out = {k: copy.deepcopy(v) for k, v in first.items() if k != "state"}
    out["state"] = state
    return out


def shard_optimizer_state(opt_state: Mapping[str, Any], param_names: Sequence[str],
                          ep_rank: int, ep_size: int) -> dict[str, Any]:
    """The part of a whole-model optimizer state that expert-parallel rank ``ep_rank`` of
    ``ep_size`` holds: every per-expert tensor of ``w_gate``, ``w_up`` and ``w_down`` ([E, ·, ·];
    a dense layer's 2-D weights of the same names are not experts) cut to the rank's
    consecutive slice of experts along dim 0, as ``MoELayer.shard_experts`` cuts the weights;
    everything else (the router, scalars such as ``step``) copied whole. A torch
    ``state_dict`` or a DeepSpeed ZeRO-0 fp16/bf16 wrapper's; ``param_names`` names each
    parameter in order (:func:`optimizer_param_names`). The input is not modified."""

    def cut(vs: list[torch.Tensor]) -> torch.Tensor:
        E = vs[0].shape[0]
        if E % ep_size:
            raise ConfigError(f"{E} experts do not split over {ep_size} expert ranks")
        n = E // ep_size
        return vs[0][ep_rank * n:(ep_rank + 1) * n].clone()

    return _per_rank_experts([opt_state], param_names, cut)


def join_optimizer_states(states: Sequence[Mapping[str, Any]], param_names: Sequence[str]
                          ) -> dict[str, Any]:
    """The whole-model optimizer state from the states of expert-parallel ranks 0 … ep−1 (in
    that order): each per-expert tensor concatenated along dim 0, everything else from rank 0
    (the inverse of :func:`shard_optimizer_state`). The inputs are not modified."""
    return _per_rank_experts(states, param_names, lambda vs: torch.cat(vs))

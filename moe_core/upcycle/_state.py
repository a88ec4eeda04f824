"""Helpers shared by the upcycling operators: state-dict conversion, key names, model rebuild."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from moe_core.config import ModelConfig
from moe_core.errors import ConfigError
from moe_core.model import Transformer
from moe_core.moe.layer import MoELayer
from moe_core.moe.named_state import load_model_state

State = dict[str, torch.Tensor]


def to_torch_state(state: Mapping[str, Any]) -> tuple[State, set[str]]:
    """Torch view of ``state``: numpy arrays are copied (object-store buffers are read-only and
    must never be written through), torch tensors are passed by reference. Returns the state and
    the keys whose tensors are borrowed from the caller (callers clone those before returning)."""
    out: State = {}
    borrowed: set[str] = set()
    for k, v in state.items():
        if isinstance(v, torch.Tensor):
            out[k] = v.detach()
            borrowed.add(k)
        elif isinstance(v, np.ndarray | np.generic | int | float):
            out[k] = torch.tensor(np.asarray(v))
        else:
            raise ConfigError(
                f"state[{k!r}] is a {type(v).__name__}; upcycling takes torch tensors or numpy "
                "arrays as state-dict values"
            )
    return out, borrowed


def mlp_key(layer: int, name: str) -> str:
    return f"blocks.{layer}.mlp.{name}"


def take(state: State, key: str, what: str) -> torch.Tensor:
    try:
        return state[key]
    except KeyError:
        raise ConfigError(
            f"{what}: the state has no {key!r}; pass the full model state_dict() of a model "
            "built from the given config"
        ) from None


def moe_layer_ids(cfg: ModelConfig) -> list[int]:
    assert cfg.moe is not None
    return [i for i in range(cfg.n_layer) if cfg.moe.is_moe_layer(i)]


def generator(seed: int) -> torch.Generator:
    """Every random draw of an operator comes from one CPU generator seeded here."""
    return torch.Generator().manual_seed(int(seed))


def rebuild(template: torch.nn.Module, cfg: ModelConfig, state: State,
            moe_layer_cls: type | None = None) -> Any:
    """A fresh ``Transformer`` for ``cfg`` holding ``state``, on the template's device and dtype
    and in its train/eval mode."""
    model = Transformer(cfg, moe_layer_cls or MoELayer)
    load_model_state(model, state, resume=False)
    p = next(template.parameters())
    model.to(device=p.device, dtype=p.dtype)
    model.train(template.training)
    return model

"""Named state of the MoE layers: what a model's state dict carries besides the weights, and what
each way of making one model from another does with it.

Configuration never travels in a state dict: ``moe.router.aux_coef`` (like every other knob)
comes from the run's own config, so a child whose knob says 0.1 trains with 0.1 whatever its
parent used. Two per-layer entries are training state, each with one rule per method
(:data:`RULES`, the table of docs/model-and-upcycling.md "Named state"):

- ``expert_bias`` (b_e, the loss-free / replica selection bias; 003 §2, Def. 3.1): always in
  the state dict.
- ``aux_coef`` (α^(l), the adaptive aux coefficient; 002 §4.2): in the state dict only where
  ``router.adaptive_aux`` is on (the layer registers it persistent then); otherwise a
  non-persistent buffer the config sets. A state written before this rule (every MoE layer kept
  ``aux_coef``) loads by the same rules: the entry is dropped unless this is a resume of an
  adaptive run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

ADAPTED = "aux_coef"
"""The per-layer entry that is state only under ``router.adaptive_aux``."""

METHODS = ("continue", "dense_to_moe", "expand_experts", "resume", "hf_load", "hf_save")
"""Every way a state dict reaches or leaves a model: the three ``upcycle.method`` operators
(a ``parent.from_pretrained`` parent goes through ``hf_load`` first), resuming a checkpoint of
the same run (a WSD branch included), and the Hugging Face reader / writer."""

RULES: dict[str, dict[str, str]] = {
    "expert_bias": {
        "continue": "copied from the parent",
        "dense_to_moe": "zeros (the dense parent has no router)",
        "expand_experts": "gathered with the experts; replicas get the source's + U(−δ, δ), "
                          "δ = upcycle.router_noise (003 Def. 3.1)",
        "resume": "restored from the checkpoint",
        "hf_load": "zeros (Mixtral / Qwen-MoE have no selection bias)",
        "hf_save": "refused when nonzero (no Hugging Face form)",
    },
    "aux_coef": {
        "continue": "the child's router.aux_coef (a new run starts its own α^(l))",
        "dense_to_moe": "the child's router.aux_coef",
        "expand_experts": "the child's router.aux_coef (the parent's α^(l) is dropped)",
        "resume": "restored with router.adaptive_aux (the run's own α^(l)); else router.aux_coef",
        "hf_load": "router.aux_coef of the run's config (not read from the checkpoint)",
        "hf_save": "not written: config.json's router_aux_loss_coef is router.aux_coef",
    },
}


def is_adapted_key(key: str) -> bool:
    """True for a state-dict key of an MoE layer's α^(l) (``blocks.3.mlp.aux_coef``)."""
    return key.rsplit(".", 1)[-1] == ADAPTED


def without_adapted(state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` less every α^(l) entry (what an upcycler hands its child: the child's own
    config sets its coefficient)."""
    return {k: v for k, v in state.items() if not is_adapted_key(k)}


def load_model_state(model: torch.nn.Module, state: Mapping[str, Any], *,
                     resume: bool) -> None:
    """Load ``state`` into ``model`` strictly, by :data:`RULES`: the α^(l) entries load only
    on ``resume`` and only where the model keeps them (``router.adaptive_aux``); anywhere else
    the model keeps the coefficient its own config gave it. Any other missing or unexpected
    key is an error, as in ``load_state_dict``."""
    own = model.state_dict()
    out = {k: v for k, v in state.items()
           if not is_adapted_key(k) or (resume and k in own)}
    for k, v in own.items():
        if is_adapted_key(k) and k not in out:
            out[k] = v
    model.load_state_dict(out)

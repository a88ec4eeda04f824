"""Read a Hugging Face ``save_pretrained`` folder (config.json + safetensors) into this project's
``ModelConfig`` and state dict, without transformers and without the network.

Dense: ``LlamaForCausalLM`` (Llama 2, 3 and 3.1+ with its ``llama3`` RoPE scaling),
``MistralForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM`` (q/k norms, a decoupled
head_dim), ``Phi3ForCausalLM`` (fused q/k/v and gate/up projections, split on load)
(:func:`load_dense`). MoE, as :func:`moe_core.hf.save_moe` writes them:
``MixtralForCausalLM``, ``Qwen2MoeForCausalLM`` and ``Qwen3MoeForCausalLM`` (:func:`load_moe`).
Everything else is refused in one line.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from safetensors import safe_open

from moe_core.config import ModelConfig
from moe_core.errors import ConfigError
from moe_core.hf.convert import attn_from_hf, dense_mlp_from_hf
from moe_core.hf_check import (
    check_files,
    check_tensor,
)
from moe_core.hf_config import (  # re-exported: config.json alone, without torch
    DENSE_ARCHS,
    MOE_ARCHS,
    architecture,
    model_config,
    moe_config,
    pretrained_hf,
    read_config,
    weight_files,
)
from moe_core.model import Transformer


def read_tensors(path: str | Path, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """Every tensor of the folder, after the dry run's streamed check of its safetensors
    headers against the files and config.json (``moe_core.hf_check.check_files``)."""
    out: dict[str, torch.Tensor] = {}
    files = weight_files(path)
    check_files(files, read_config(path), finite=False)  # tensors are checked as they load
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for k in fh.keys():  # noqa: SIM118 (safe_open has no __iter__)
                t = fh.get_tensor(k)
                check_tensor(f, k, t)
                out[k] = t.to(dtype) if dtype is not None and t.is_floating_point() else t
    return out


def load_pretrained(path: str | Path, dtype: torch.dtype | None = torch.float32
                    ) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """:func:`load_moe` or :func:`load_dense`, whichever the folder's architecture needs."""
    _, arch = pretrained_hf(path)
    return (load_moe if arch in MOE_ARCHS else load_dense)(path, dtype)


class _Tensors(dict):
    """HF tensors; a missing key or a wrong shape is one ``ConfigError`` naming it."""

    arch = ""

    def __missing__(self, key: str) -> torch.Tensor:
        raise ConfigError(f"{self.arch}: the checkpoint has no tensor {key!r}; "
                          "the weight files do not match config.json")


def _expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):  # shapes only: no memory, no RNG draws
        model = Transformer(cfg)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _check_shapes(state: dict[str, torch.Tensor], cfg: ModelConfig, arch: str) -> None:
    for k, shape in _expected_shapes(cfg).items():
        if k not in state:
            raise ConfigError(f"{arch}: no tensor for {k!r}; the weight files do not match "
                              "config.json")
        if tuple(state[k].shape) != shape:
            raise ConfigError(f"{arch}: {k} has shape {tuple(state[k].shape)} but config.json "
                              f"implies {shape}; the weight files do not match config.json")


def _common(hf_t: _Tensors, cfg: ModelConfig, arch: str) -> dict[str, torch.Tensor]:
    """Embeddings, final norm, lm_head and every block's attention (bias-free o_proj only)."""
    state = {"tok_emb.weight": hf_t["model.embed_tokens.weight"],
             "norm.weight": hf_t["model.norm.weight"]}
    state["lm_head.weight"] = (state["tok_emb.weight"] if cfg.tie_embeddings
                               else hf_t["lm_head.weight"])
    for i in range(cfg.n_layer):
        p = f"model.layers.{i}."
        ob = hf_t.get(p + "self_attn.o_proj.bias")
        if ob is not None and bool(ob.any()):
            raise ConfigError(f"{arch}: {p}self_attn.o_proj.bias is not zero; an output "
                              "projection bias is not supported (attention_bias covers q/k/v)")
        state.update(attn_from_hf(hf_t, cfg, i, p))
    return state


def _zero_qkv_bias(state: dict[str, torch.Tensor], cfg: ModelConfig) -> ModelConfig:
    """q/k/v biases that are all exactly zero are dropped (the same function, fewer params)."""
    keys = [f"blocks.{i}.attn.wqkv.bias" for i in range(cfg.n_layer)]
    if cfg.qkv_bias and not any(bool(state[k].any()) for k in keys):
        for k in keys:
            del state[k]
        return dataclasses.replace(cfg, qkv_bias=False)
    return cfg


def unfuse_phi3(hf_t: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Phi-3's fused projections under Llama's names: ``qkv_proj`` rows [q | k | v] →
    ``q_proj``/``k_proj``/``v_proj``, ``gate_up_proj`` rows [gate | up] → ``gate_proj``/
    ``up_proj`` (transformers' Phi3 splits them the same way in its forward)."""
    H, Hkv, Dh, F = cfg.n_head, cfg.kv_heads, cfg.resolved_head_dim, cfg.ffn_dim
    out = dict(hf_t)
    for i in range(cfg.n_layer):
        p = f"model.layers.{i}."
        qkv = out.pop(p + "self_attn.qkv_proj.weight", None)
        if qkv is not None:
            for n, t in zip(("q", "k", "v"), qkv.split((H * Dh, Hkv * Dh, Hkv * Dh), 0)):
                out[p + f"self_attn.{n}_proj.weight"] = t
        gu = out.pop(p + "mlp.gate_up_proj.weight", None)
        if gu is not None:
            out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = gu.split((F, F), 0)
    return out


def load_dense(path: str | Path, dtype: torch.dtype | None = torch.float32
               ) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(ModelConfig, state dict) of a local Llama / Mistral / Qwen2 / Qwen3 / Phi-3 folder.

    Reads config.json and the safetensors (sharded or not) itself: no transformers, no network.
    Tensors are cast to ``dtype`` (fp32 by default; None keeps the checkpoint's). q/k rows are
    permuted to this project's RoPE pair layout (:mod:`moe_core.hf.convert`). Anything without
    an exact equivalent (another architecture, a RoPE scaling other than linear / llama3,
    partial RoPE, an o_proj bias, non-SwiGLU MLPs) is refused with one ``ConfigError`` line.
    """
    hf = read_config(path)
    arch = architecture(hf)
    if arch in MOE_ARCHS:
        raise ConfigError(f"{arch} is a mixture of experts; load_dense reads "
                          f"{', '.join(DENSE_ARCHS)} (use moe_core.hf.load_moe)")
    if arch not in DENSE_ARCHS:
        raise ConfigError(f"{arch} is not supported; load_dense reads {', '.join(DENSE_ARCHS)}")
    cfg = model_config(hf)
    tensors = read_tensors(path, dtype)
    hf_t = _Tensors(unfuse_phi3(tensors, cfg) if arch == "Phi3ForCausalLM" else tensors)
    hf_t.arch = arch
    state = _common(hf_t, cfg, arch)
    for i in range(cfg.n_layer):
        state.update(dense_mlp_from_hf(hf_t, i, f"model.layers.{i}.mlp."))
    _check_shapes(state, cfg, arch)
    return cfg, state


def _moe_block(hf_t: _Tensors, cfg: ModelConfig, i: int, arch: str) -> dict[str, torch.Tensor]:
    """Block ``i``'s MoE layer from Mixtral's ``block_sparse_moe`` or Qwen2/3-MoE's ``mlp``."""
    assert cfg.moe is not None
    E = cfg.moe.num_experts
    b = f"blocks.{i}.mlp."
    mixtral = arch == "MixtralForCausalLM"
    p = f"model.layers.{i}." + ("block_sparse_moe." if mixtral else "mlp.")
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    out = {b + "router.weight": hf_t[p + "gate.weight"],
           b + "expert_bias": torch.zeros(E, dtype=hf_t[p + "gate.weight"].dtype)}
    for n, w in zip(names, ("w_gate", "w_up", "w_down")):
        out[b + w] = torch.stack([hf_t[p + f"experts.{e}.{n}.weight"].t() for e in range(E)])
    if arch == "Qwen2MoeForCausalLM":
        gate = hf_t[p + "shared_expert_gate.weight"]
        if cfg.moe.num_shared_experts > 0 and bool(gate.any()):
            raise ConfigError(f"{arch}: layer {i} shared_expert_gate is not zero; a gated shared "
                              "expert (sigmoid(g·x) ≠ 1/2) has no exact equivalent here")
        if cfg.moe.num_shared_experts > 0:  # sigmoid(0) = 1/2 exactly; halving is exact
            out.update(dense_mlp_from_hf(hf_t, i, p + "shared_expert.", dst="mlp.shared."))
            out[b + "shared.w_down"] = out[b + "shared.w_down"] * 0.5
    return out


def load_moe(path: str | Path, dtype: torch.dtype | None = torch.float32
             ) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(ModelConfig, state dict) of a ``MixtralForCausalLM``, ``Qwen2MoeForCausalLM`` or
    ``Qwen3MoeForCausalLM`` folder in the exact forms :func:`moe_core.hf.save_moe` writes (Qwen3-MoE
    as the Hub stores it: no shared expert): Qwen2-MoE's shared expert must have
    a zero ``shared_expert_gate`` (an always-on shared expert at weight 1/2) or width 0.
    Same rules as :func:`load_dense` otherwise."""
    hf = read_config(path)
    arch = architecture(hf)
    if arch in DENSE_ARCHS:
        raise ConfigError(f"{arch} is dense; use moe_core.hf.load_dense")
    if arch not in MOE_ARCHS:
        raise ConfigError(f"{arch} is not supported; load_moe reads {', '.join(MOE_ARCHS)}")
    cfg = model_config(hf, moe_config(hf, arch))
    hf_t = _Tensors(read_tensors(path, dtype))
    hf_t.arch = arch
    state = _common(hf_t, cfg, arch)
    assert cfg.moe is not None
    for i in range(cfg.n_layer):
        if cfg.moe.is_moe_layer(i):
            state.update(_moe_block(hf_t, cfg, i, arch))
        else:
            state.update(dense_mlp_from_hf(hf_t, i, f"model.layers.{i}.mlp."))
    cfg = _zero_qkv_bias(state, cfg)
    _check_shapes(state, cfg, arch)
    return cfg, state

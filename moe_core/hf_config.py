"""A Hugging Face ``config.json`` as this project's ``ModelConfig``, without torch: what
``moe_core.hf.load`` builds its models from, and what ``analysis.decide --plan`` sizes a
checkpoint with (it reads no weights)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moe_core.config import ModelConfig, MoEConfig, RopeScaling
from moe_core.errors import ConfigError
from moe_core.hf_check import check_sizes, read_config_bounded

DENSE_ARCHS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
               "Phi3ForCausalLM")
MOE_ARCHS = ("MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM")
QK_NORM_TYPES = ("qwen3", "qwen3_moe")
"""``model_type``s whose attention normalises each query and key head (``model.qk_norm``)."""
def read_config(path: str | Path) -> dict[str, Any]:
    """config.json of a ``save_pretrained`` folder (refused in one line if absent or broken)."""
    p = Path(path)
    if not p.is_dir():
        raise ConfigError(f"{p} is not a directory; give a Hugging Face save_pretrained folder")
    f = p / "config.json"
    if not f.is_file():
        raise ConfigError(f"{f} is missing; give a Hugging Face save_pretrained folder")
    cfg = read_config_bounded(f)  # size capped before parsing
    check_sizes(cfg, str(f))  # bounded sizes: nothing downstream builds 1e9 layers
    return cfg


def architecture(hf: dict[str, Any]) -> str:
    archs = hf.get("architectures") or []
    return str(archs[0]) if archs else f"model_type={hf.get('model_type')!r}"


def _rope(hf: dict[str, Any], arch: str) -> tuple[float, RopeScaling | None]:
    """RoPE base and scaling of a config (transformers 5's ``rope_parameters`` or 4's
    ``rope_theta`` + ``rope_scaling``); a scaling with no exact equivalent is refused."""
    rp = hf.get("rope_parameters") or {}
    src = {**(hf.get("rope_scaling") or {}), **rp}
    kind = src.get("rope_type") or src.get("type") or "default"
    theta = float(rp.get("rope_theta", hf.get("rope_theta", 10000.0)))
    partial = float(src.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)))
    if partial != 1.0:
        raise ConfigError(f"{arch}: partial_rotary_factor={partial:g} (RoPE on part of each "
                          "head) has no equivalent here; RoPE rotates whole heads")
    if kind == "default":
        return theta, None
    if kind not in ("linear", "llama3"):
        raise ConfigError(f"{arch}: rope_type={kind!r} (RoPE scaling) has no equivalent here; "
                          "supported: default, linear, llama3")
    try:
        if kind == "linear":
            return theta, RopeScaling(kind="linear", factor=float(src["factor"]))
        return theta, RopeScaling(
            kind="llama3", factor=float(src["factor"]),
            low_freq_factor=float(src["low_freq_factor"]),
            high_freq_factor=float(src["high_freq_factor"]),
            original_max_position=int(src["original_max_position_embeddings"]))
    except KeyError as e:
        raise ConfigError(f"{arch}: rope_type={kind!r} needs {e.args[0]} in its RoPE "
                          "parameters") from None


def _max_seq_len(hf: dict[str, Any]) -> int:
    """max_position_embeddings, capped at a sliding window when one is on: below the window
    sliding-window attention is full causal attention, so logits agree exactly."""
    n = int(hf.get("max_position_embeddings", 2048))
    window = hf.get("sliding_window")
    if hf.get("model_type") in ("qwen2", "qwen2_moe", *QK_NORM_TYPES) and \
            not hf.get("use_sliding_window"):
        window = None
    return min(n, int(window)) if window else n


def model_config(hf: dict[str, Any], moe: MoEConfig | None = None) -> ModelConfig:
    """ModelConfig of an HF config.json mapping; refuses what has no exact equivalent."""
    arch = architecture(hf)
    if hf.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"{arch}: hidden_act={hf['hidden_act']!r} is not supported; "
                          "the MLPs here are SwiGLU (silu)")
    if hf.get("mlp_bias"):
        raise ConfigError(f"{arch}: mlp_bias=true is not supported (the MLPs have no biases)")
    D, H = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    head_dim = hf.get("head_dim")
    head_dim = None if head_dim is None or int(head_dim) * H == D else int(head_dim)
    theta, scaling = _rope(hf, arch)
    kv = hf.get("num_key_value_heads")
    qkv_bias = {"qwen2": True, "qwen2_moe": True}.get(hf.get("model_type"), False)
    qkv_bias = bool(hf.get("qkv_bias", qkv_bias)) or bool(hf.get("attention_bias", False))
    return ModelConfig(
        vocab_size=int(hf["vocab_size"]), n_layer=int(hf["num_hidden_layers"]), d_model=D,
        n_head=H, n_kv_heads=None if kv is None or int(kv) == H else int(kv),
        d_ff=int(hf["intermediate_size"]), max_seq_len=_max_seq_len(hf),
        init_std=float(hf.get("initializer_range", 0.02)), rope_theta=theta,
        rope_scaling=scaling, norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), qkv_bias=qkv_bias,
        head_dim=head_dim, qk_norm=hf.get("model_type") in QK_NORM_TYPES,
        moe=moe, name=str(hf.get("_name_or_path") or arch),
    )

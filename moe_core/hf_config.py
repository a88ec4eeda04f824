"""A Hugging Face ``config.json`` as this project's ``ModelConfig``, without torch: what
``moe_core.hf.load`` builds its models from, and what ``analysis.decide --plan`` sizes a
checkpoint with (it reads no weights)."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

from moe_core.config import ModelConfig, MoEConfig, RopeScaling, RouterConfig
from moe_core.errors import ConfigError, UpcycleError
from moe_core.fsio import load_json
from moe_core.hf_check import CheckReport, check_files, check_sizes, read_config_bounded

DENSE_ARCHS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
               "Phi3ForCausalLM")
MOE_ARCHS = ("MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM")
QK_NORM_TYPES = ("qwen3", "qwen3_moe")
"""``model_type``s whose attention normalises each query and key head (``model.qk_norm``)."""


INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def weight_files(path: str | Path) -> list[Path]:
    """The safetensors files of a folder: the shards its index names, or model.safetensors."""
    p = Path(path)
    if (p / INDEX).is_file():
        try:
            wmap = load_json(p / INDEX, 16 << 20, "safetensors index")["weight_map"]
            if not isinstance(wmap, dict) or not all(isinstance(v, str) and "/" not in v
                                                     and v not in ("", ".", "..")
                                                     for v in wmap.values()):
                raise ValueError("weight_map must map names to file names in the folder")
        except (UpcycleError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"{p / INDEX} is not a safetensors index ({e})") from None
        files = [p / f for f in sorted(set(wmap.values()))]
    elif (p / SINGLE).is_file():
        files = [p / SINGLE]
    else:
        bins = sorted(x.name for x in p.glob("*.bin"))
        extra = f" (found {bins[0]}: re-save it with safe_serialization)" if bins else ""
        raise ConfigError(f"{p} has no {SINGLE} or {INDEX}{extra}; only safetensors are read")
    for f in files:
        if not f.is_file():
            raise ConfigError(f"{f} is missing: the folder's {INDEX} names it")
    return files


def checkpoint_hash(path: str | Path) -> str:
    """Content hash (16 hex chars) of config.json and the weight files (the parent cache key)."""
    p = Path(path)
    h = hashlib.sha256()
    for f in [p / "config.json", *weight_files(p)]:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda fh=fh: fh.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()[:16]


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


def pretrained_hf(path: str | Path) -> tuple[dict[str, Any], str]:
    """(config.json, architecture) of a ``parent.from_pretrained`` folder, dense or MoE."""
    try:
        hf = read_config(path)
    except ConfigError as e:
        raise ConfigError(f"parent.from_pretrained={str(path)!r}: {e}") from None
    arch = architecture(hf)
    if arch not in DENSE_ARCHS + MOE_ARCHS:
        raise ConfigError(f"parent.from_pretrained: {arch} is not supported; give a "
                          f"{', '.join(DENSE_ARCHS + MOE_ARCHS)} folder")
    return hf, arch


def pretrained_moe(path: str | Path) -> MoEConfig | None:
    """The MoE of the checkpoint at ``path`` (Mixtral, Qwen2-MoE, Qwen3-MoE), None when it is
    dense (config.json only)."""
    hf, arch = pretrained_hf(path)
    return moe_config(hf, arch) if arch in MOE_ARCHS else None


def pretrained_model_config(path: str | Path, moe: MoEConfig | None,
                            max_seq_len: int) -> ModelConfig:
    """The ModelConfig of a trial upcycled from the checkpoint at ``path``, dense or MoE
    (config.json only, no weights): its dims, ``moe`` and ``max_seq_len`` (refused beyond the
    checkpoint's)."""
    hf, _ = pretrained_hf(path)
    cfg = model_config(hf)
    if max_seq_len > cfg.max_seq_len:
        raise ConfigError(f"data.seq_len (or model.max_seq_len)={max_seq_len} exceeds the "
                          f"checkpoint's {cfg.max_seq_len} positions; lower it")
    return dataclasses.replace(cfg, max_seq_len=max_seq_len, moe=moe)


def moe_config(hf: dict[str, Any], arch: str) -> MoEConfig:
    """The MoEConfig of an MoE checkpoint's config.json (Mixtral, Qwen2-MoE, Qwen3-MoE)."""
    if arch == "MixtralForCausalLM":
        return MoEConfig(num_experts=int(hf["num_local_experts"]),
                         top_k=int(hf["num_experts_per_tok"]),
                         router=RouterConfig(order="topk_softmax"))
    if hf.get("mlp_only_layers"):
        raise ConfigError(f"{arch}: mlp_only_layers={hf['mlp_only_layers']} has no equivalent; "
                          "dense layers here follow moe.interleave only")
    f = int(hf["moe_intermediate_size"])
    shared = int(hf.get("shared_expert_intermediate_size") or 0)
    if shared % f:
        raise ConfigError(f"{arch}: shared_expert_intermediate_size={shared} is not a multiple "
                          f"of moe_intermediate_size={f}; shared experts here are N of width f")
    n_shared = shared // f
    # the Hub's Qwen2/3-MoE configs say num_experts; transformers 5 writes Qwen3-MoE's as
    # num_local_experts
    E = hf["num_experts"] if "num_experts" in hf else hf.get("num_local_experts")
    if E is None:
        raise ConfigError(f"{arch}: config.json has neither num_experts nor num_local_experts")
    return MoEConfig(num_experts=int(E), top_k=int(hf["num_experts_per_tok"]),
                     expert_d_ff=f, num_shared_experts=n_shared,
                     interleave=int(hf.get("decoder_sparse_step", 1)),
                     router=RouterConfig(order="softmax_topk",
                                         renormalize=bool(hf.get("norm_topk_prob", False))))


def check_checkpoint(path: str | Path, what: str = "checkpoint",
                     finite: bool = True) -> CheckReport:
    """Refuse (one line) a folder whose config.json or safetensors files are unusable, in
    bounded time and memory (``moe_core.hf_check``); reads each tensor once when ``finite``."""
    try:
        return check_files(weight_files(path), read_config(path), finite)
    except ConfigError as e:
        raise ConfigError(f"{what}: {e}") from None

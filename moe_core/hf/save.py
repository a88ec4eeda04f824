"""Write this project's models as Hugging Face ``save_pretrained`` folders that
``transformers.AutoModelForCausalLM.from_pretrained`` loads with the same logits.

Mapping (exact in floating point unless said otherwise; table in docs/hf-checkpoints.md):

* dense → ``LlamaForCausalLM`` (``attention_bias`` = ``model.qkv_bias``, with a zero o_proj bias),
  or ``Qwen3ForCausalLM`` with q/k norms (``model.qk_norm``). A decoupled ``head_dim`` and a
  linear / llama3 RoPE scaling are written as such to every architecture.
* an MoE with q/k norms → ``Qwen3MoeForCausalLM`` (Qwen2-MoE's routing, no shared expert).
* coarse MoE (expert d_ff = d_ff), ``router.order: topk_softmax``, every layer MoE, no shared
  experts, no q/k/v bias → ``MixtralForCausalLM``. Mixtral takes softmax over all E logits, then
  top-K, then divides by the K weights' sum: the softmax over the K selected logits (000 Eq. 15)
  up to rounding.
* every other MoE → ``Qwen2MoeForCausalLM``: softmax over all experts → top-K (004 §2.1.2),
  ``norm_topk_prob`` = ``router.renormalize`` (or true for ``topk_softmax``, the same function as
  above), ``moe_intermediate_size`` = expert d_ff (granular, 004 §2.2), ``decoder_sparse_step`` =
  ``moe.interleave`` (both make layer i MoE when (i + 1) % step == 0), dense layers of
  ``intermediate_size`` = d_ff. N shared experts of width f are one shared expert of width N·f
  (our ``shared`` SwiGLU already is); Qwen2-MoE multiplies it by sigmoid(shared_expert_gate·x),
  so the gate weight is written as zero (sigmoid(0) = 1/2 exactly) and the shared down_proj
  doubled (exact: a power of two). Without shared experts the shared expert has width 0.
* refused, one line each: gating logit normalisation (``router.logit_norm_lambda``), a
  loss-free / replica selection bias (``router.loss_free_rate`` or a nonzero ``expert_bias``),
  capacity-factor token dropping, expert-parallel shards, and an explicit ``arch="mixtral"``
  for what Mixtral cannot express (interleave, shared experts, granular experts, q/k/v biases,
  softmax → top-K without renormalisation).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from moe_core.config import ModelConfig
from moe_core.errors import ConfigError
from moe_core.fsio import publish_dir, removed_on_error
from moe_core.hf.convert import attn_to_hf, dense_mlp_to_hf
from moe_core.hf_config import INDEX, SINGLE
from moe_core.outdir import mark_out_dir
from moe_core.upcycle._state import to_torch_state

ARCHS = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM",
         "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
         "qwen3_moe": "Qwen3MoeForCausalLM"}
DENSE = ("llama", "qwen3")


def _mixtral_problem(cfg: ModelConfig) -> str | None:
    """Why Mixtral cannot hold ``cfg`` exactly, or None."""
    m = cfg.moe
    assert m is not None
    if m.router.order != "topk_softmax" and not m.router.renormalize:
        return "router.order=softmax_topk without renormalize (Mixtral renormalises the top-K)"
    if m.interleave != 1:
        return f"moe.interleave={m.interleave} (every Mixtral layer is MoE)"
    if m.num_shared_experts:
        return f"moe.num_shared_experts={m.num_shared_experts} (Mixtral has no shared expert)"
    if m.resolved_expert_d_ff(cfg.ffn_dim) != cfg.ffn_dim:
        return "granular experts (Mixtral experts are d_ff wide; use qwen2_moe)"
    if cfg.qkv_bias:
        return "model.qkv_bias=true (Mixtral attention has no biases)"
    if cfg.qk_norm:
        return "model.qk_norm=true (Mixtral attention has no q/k norms)"
    return None


def _qwen3_moe_problem(cfg: ModelConfig) -> str | None:
    """Why Qwen3-MoE cannot hold ``cfg`` exactly, or None."""
    assert cfg.moe is not None
    if cfg.moe.num_shared_experts:
        return f"moe.num_shared_experts={cfg.moe.num_shared_experts} (Qwen3-MoE has no shared " \
               "expert)"
    return None


def export_arch(cfg: ModelConfig, state: Mapping[str, torch.Tensor] | None = None,
                arch: str | None = None) -> str:
    """The HF ``model_type`` ``cfg`` exports as (``llama``, ``qwen3``, ``mixtral``,
    ``qwen2_moe``, ``qwen3_moe``), or a one-line ``ConfigError`` saying why it has no exact
    Hugging Face form. q/k norms (Qwen3) export as Qwen3 / Qwen3-MoE, the only ones with them."""
    if arch is not None and arch not in ARCHS:
        raise ConfigError(f"arch={arch!r} is not known; use one of {', '.join(ARCHS)}")
    m = cfg.moe
    if m is None:
        want = "qwen3" if cfg.qk_norm else "llama"
        if arch not in (None, "llama", "qwen3"):
            raise ConfigError(f"arch={arch!r} needs an MoE model; a dense model exports as {want}")
        if arch is not None and arch != want:
            raise ConfigError(f"arch={arch!r} cannot express model.qk_norm={cfg.qk_norm} "
                              f"(Qwen3 always normalises q/k heads, Llama never); use "
                              f"arch={want!r}")
        return want
    if arch in DENSE:
        raise ConfigError(f"arch={arch!r} is for dense models; this model has model.moe set")
    r = m.router
    if r.logit_norm_lambda is not None:
        raise ConfigError(f"router.logit_norm_lambda={r.logit_norm_lambda} (gating logit "
                          "normalisation, 002 §4.1) has no Hugging Face form: Mixtral and "
                          "Qwen2-MoE route on the raw logits; train with it null to export")
    if r.loss_free_rate > 0:
        raise ConfigError(f"router.loss_free_rate={r.loss_free_rate} (loss-free balancing bias, "
                          "003 §2) has no Hugging Face form: Mixtral and Qwen2-MoE have no "
                          "selection bias; train with it 0 to export")
    for k, v in (state or {}).items():
        if k.endswith("mlp.expert_bias") and bool(torch.as_tensor(v).any()):
            raise ConfigError(f"{k} is nonzero (a selection bias, e.g. upcycle.router_noise) "
                              "and has no Hugging Face form; Mixtral and Qwen2-MoE have none")
    if m.capacity_factor is not None:
        raise ConfigError(f"moe.capacity_factor={m.capacity_factor} drops tokens; Mixtral and "
                          "Qwen2-MoE are dropless: set it null to export")
    return _moe_arch(cfg, arch)


def _moe_arch(cfg: ModelConfig, arch: str | None) -> str:
    """Mixtral where exact, else Qwen2-MoE, except that q/k norms need Qwen3-MoE; an explicit
    ``arch`` is checked."""
    why, why3 = _mixtral_problem(cfg), _qwen3_moe_problem(cfg)
    if arch == "mixtral" and why is not None:
        alt = "qwen3_moe" if cfg.qk_norm else "qwen2_moe"
        raise ConfigError(f"arch='mixtral' cannot express {why}; use arch='{alt}'")
    if arch == "qwen2_moe" and cfg.qk_norm:
        raise ConfigError("arch='qwen2_moe' cannot express model.qk_norm=true (Qwen2-MoE "
                          "attention has no q/k norms); use arch='qwen3_moe'")
    if arch == "qwen3_moe" and not cfg.qk_norm:
        raise ConfigError("arch='qwen3_moe' cannot express model.qk_norm=false (Qwen3-MoE "
                          "always normalises q/k heads); use arch='qwen2_moe'")
    if (arch == "qwen3_moe" or (arch is None and cfg.qk_norm)) and why3 is not None:
        raise ConfigError(f"{'arch=' + repr(arch) if arch else 'model.qk_norm=true (Qwen3-MoE)'}"
                          f" cannot express {why3}; no Hugging Face MoE has both")
    if arch is not None:
        return arch
    if cfg.qk_norm:
        return "qwen3_moe"
    return "mixtral" if why is None else "qwen2_moe"


def hf_config(cfg: ModelConfig, arch: str, dtype: torch.dtype) -> Any:
    """The transformers config object of ``cfg`` exported as ``arch``."""
    import transformers  # noqa: PLC0415 (export only; load_dense works without it)

    common = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.ffn_dim,
        num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.kv_heads, head_dim=cfg.resolved_head_dim, hidden_act="silu",
        max_position_embeddings=max_positions(cfg), initializer_range=cfg.init_std,
        rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings,
        rope_parameters=rope_parameters(cfg),
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
        architectures=[ARCHS[arch]], dtype=str(dtype).removeprefix("torch."),
    )
    if arch == "llama":
        return transformers.LlamaConfig(**common, attention_bias=cfg.qkv_bias)
    if arch == "qwen3":
        return transformers.Qwen3Config(**common, attention_bias=cfg.qkv_bias,
                                        use_sliding_window=False)
    m = cfg.moe
    assert m is not None
    if arch == "mixtral":
        return transformers.MixtralConfig(**common, num_local_experts=m.num_experts,
                                          num_experts_per_tok=m.top_k, sliding_window=None,
                                          router_aux_loss_coef=m.router.aux_coef)
    f = m.resolved_expert_d_ff(cfg.ffn_dim)
    routed = dict(num_experts=m.num_experts, num_experts_per_tok=m.top_k,
                  moe_intermediate_size=f,
                  norm_topk_prob=m.router.order == "topk_softmax" or m.router.renormalize,
                  decoder_sparse_step=m.interleave, mlp_only_layers=[],
                  use_sliding_window=False, router_aux_loss_coef=m.router.aux_coef)
    if arch == "qwen3_moe":
        return transformers.Qwen3MoeConfig(**common, **routed, attention_bias=cfg.qkv_bias)
    return transformers.Qwen2MoeConfig(
        **common, **routed, shared_expert_intermediate_size=f * m.num_shared_experts,
        qkv_bias=cfg.qkv_bias)


def max_positions(cfg: ModelConfig) -> int:
    """``max_position_embeddings``: the positions our RoPE table covers, or, under a llama3
    scaling, the context the scaling was made for (factor × the original), which transformers
    requires to exceed the original. Informational only: neither RoPE depends on it."""
    sc = cfg.rope_scaling
    if sc is not None and sc.kind == "llama3":
        return max(cfg.max_seq_len, round(sc.factor * sc.original_max_position))
    return cfg.max_seq_len


def rope_parameters(cfg: ModelConfig) -> dict[str, Any]:
    """transformers' ``rope_parameters`` of ``cfg`` (its base and scaling)."""
    out: dict[str, Any] = {"rope_type": "default", "rope_theta": float(cfg.rope_theta)}
    sc = cfg.rope_scaling
    if sc is not None:
        out.update(rope_type=sc.kind, factor=float(sc.factor))
        if sc.kind == "llama3":
            out.update(low_freq_factor=float(sc.low_freq_factor),
                       high_freq_factor=float(sc.high_freq_factor),
                       original_max_position_embeddings=int(sc.original_max_position))
    return out


def hf_state(state: Mapping[str, torch.Tensor], cfg: ModelConfig, arch: str
             ) -> dict[str, torch.Tensor]:
    """Our state dict under the HF names of ``arch`` (per-expert keys, as the Hub's
    Mixtral / Qwen2-MoE checkpoints are stored)."""
    out = {"model.embed_tokens.weight": state["tok_emb.weight"],
           "model.norm.weight": state["norm.weight"]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = state["lm_head.weight"]
    for i in range(cfg.n_layer):
        p = f"model.layers.{i}."
        out.update(attn_to_hf(state, cfg, i, p))
        if arch in ("llama", "qwen3", "qwen3_moe") and cfg.qkv_bias:  # attention_bias: o_proj
            out[p + "self_attn.o_proj.bias"] = torch.zeros(cfg.d_model,
                                                           dtype=state["norm.weight"].dtype)
        if cfg.moe is None or not cfg.moe.is_moe_layer(i):
            out.update(dense_mlp_to_hf(state, i, p + "mlp."))
            continue
        b = f"blocks.{i}.mlp."
        mixtral = arch == "mixtral"
        mp = p + ("block_sparse_moe." if mixtral else "mlp.")
        out[mp + "gate.weight"] = state[b + "router.weight"]
        names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
        for n, w in zip(names, ("w_gate", "w_up", "w_down")):
            for e, t in enumerate(state[b + w].unbind(0)):
                out[mp + f"experts.{e}.{n}.weight"] = t.t()
        if arch == "qwen2_moe":
            sp = mp + "shared_expert."
            if cfg.moe.num_shared_experts:
                out.update(dense_mlp_to_hf(state, i, sp, src="mlp.shared."))
                out[sp + "down_proj.weight"] = out[sp + "down_proj.weight"] * 2.0
            else:
                D, dt = cfg.d_model, state[b + "router.weight"].dtype
                out.update({sp + "gate_proj.weight": torch.zeros(0, D, dtype=dt),
                            sp + "up_proj.weight": torch.zeros(0, D, dtype=dt),
                            sp + "down_proj.weight": torch.zeros(D, 0, dtype=dt)})
            out[mp + "shared_expert_gate.weight"] = torch.zeros(
                1, cfg.d_model, dtype=state[b + "router.weight"].dtype)
    return out


def _write_weights(tensors: dict[str, torch.Tensor], d: Path, max_shard_bytes: int) -> None:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for k in sorted(tensors):
        t = tensors[k]
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = t
        size += nbytes
    meta = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(d / SINGLE), metadata=meta)
        return
    n = len(shards)
    wmap = {}
    for j, sh in enumerate(shards):
        name = f"model-{j + 1:05d}-of-{n:05d}.safetensors"
        save_file(sh, str(d / name), metadata=meta)
        wmap.update({k: name for k in sh})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (d / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": wmap},
                                      indent=2))


def save_moe(model_or_state: Any, cfg: ModelConfig | None, path: str | Path, *,
             arch: str | None = None, dtype: torch.dtype | None = None,
             max_shard_bytes: int = 5 * 2**30, extra_files: Mapping[str, Path] | None = None
             ) -> str:
    """Write ``model_or_state`` (a ``Transformer`` or its state dict, torch or numpy) with
    ModelConfig ``cfg`` (None: the model's own) as a Hugging Face folder at ``path``; returns
    the architecture written (``LlamaForCausalLM``, ``Qwen3ForCausalLM``, ``MixtralForCausalLM``,
    ``Qwen2MoeForCausalLM``, ``Qwen3MoeForCausalLM``). ``arch`` forces one (default: Mixtral
    where exact, else Qwen2-MoE; Qwen3 / Qwen3-MoE for q/k norms; module docstring). ``dtype``
    casts floating tensors (default: as stored). ``extra_files`` (name → source path, e.g. the
    source's tokenizer.json) are copied in. The folder appears atomically, with the project's
    mark (``moe_core.outdir.MARKER``), and replaces whatever is at ``path``: callers that
    write where a user points check it first (``moe_core.outdir``). Configs with no
    exact HF form are refused in one line.
    """
    if isinstance(model_or_state, torch.nn.Module):
        cfg = cfg or model_or_state.config
        if any(getattr(m, "ep_size", 1) > 1 for m in model_or_state.modules()):
            raise ConfigError("save_moe needs the full experts; gather the expert-parallel "
                              "shards into one state first")
        state_in: Mapping[str, Any] = model_or_state.state_dict()
    else:
        state_in = model_or_state
    if cfg is None:
        raise ConfigError("save_moe: give the ModelConfig of the state (cfg)")
    state, _ = to_torch_state(state_in)
    kind = export_arch(cfg, state, arch)
    tensors = hf_state(state, cfg, kind)
    dt = dtype or state["norm.weight"].dtype
    tensors = {k: (v.to(dt) if v.is_floating_point() else v).detach().cpu().contiguous()
               for k, v in tensors.items()}
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    with removed_on_error(tmp):  # a full disk leaves no .tmp-* folder
        hf_config(cfg, kind, dt).save_pretrained(str(tmp))
        _write_weights(tensors, tmp, max_shard_bytes)
        for name, src in (extra_files or {}).items():
            (tmp / name).write_bytes(Path(src).read_bytes())
        mark_out_dir(tmp, "moe_core.hf.save_moe")
        publish_dir(tmp, out, only_ours=True)  # never a file a user saved into OUT meanwhile
    return ARCHS[kind]

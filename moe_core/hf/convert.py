"""Pure mappings between this project's model and Hugging Face Llama-family checkpoints.

Conventions (shape legend: V vocab, D model dim, H heads, Hkv key/value heads, Dh head dim,
F dense d_ff, f expert d_ff, E experts):

* Our linear weights are stored [in, out] for the SwiGLU MLPs and experts (``w_gate`` [D, F])
  and [out, in] for ``nn.Linear`` modules (``wqkv``, ``wo``, ``router``, ``lm_head``); Hugging
  Face stores every projection [out, in].
* Our fused ``wqkv`` rows are [q (H·Dh) | k (Hkv·Dh) | v (Hkv·Dh)]; Dh may be decoupled from
  D / H (``head_dim``, Qwen3), and Qwen3's per-head q/k RMSNorm weights ([Dh]) are permuted
  like one head's rows.
* RoPE: ours rotates the pairs (x[2i], x[2i+1]) of each head (Meta's Llama layout), transformers'
  ``rotate_half`` the pairs (x[i], x[i + Dh/2]). The q and k rows (and biases) of every head are
  permuted between the two layouts, as transformers' Meta → HF Llama conversion does; the
  attention scores, hence the logits, are the same.
"""

from __future__ import annotations

import torch

from moe_core.config import ModelConfig


def rope_to_hf(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows of q or k (weight [n_heads·Dh, D] or bias [n_heads·Dh]) from our interleaved pair
    layout to transformers' half-split layout: HF row h·Dh/2 + i ← our row 2i + h."""
    rest = w.shape[1:]
    dh = w.shape[0] // n_heads
    return w.reshape(n_heads, dh // 2, 2, *rest).transpose(1, 2).reshape(w.shape).contiguous()


def rope_from_hf(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Inverse of :func:`rope_to_hf`."""
    rest = w.shape[1:]
    dh = w.shape[0] // n_heads
    return w.reshape(n_heads, 2, dh // 2, *rest).transpose(1, 2).reshape(w.shape).contiguous()


def attn_to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig, i: int,
               prefix: str) -> dict[str, torch.Tensor]:
    """Block ``i``'s attention and norms under HF names (``prefix`` = ``model.layers.{i}.``)."""
    H, Hkv, Dh = cfg.n_head, cfg.kv_heads, cfg.resolved_head_dim
    b = f"blocks.{i}."
    w = state[b + "attn.wqkv.weight"]
    q, k, v = w.split((H * Dh, Hkv * Dh, Hkv * Dh), dim=0)
    out = {
        prefix + "input_layernorm.weight": state[b + "attn_norm.weight"],
        prefix + "post_attention_layernorm.weight": state[b + "mlp_norm.weight"],
        prefix + "self_attn.q_proj.weight": rope_to_hf(q, H),
        prefix + "self_attn.k_proj.weight": rope_to_hf(k, Hkv),
        prefix + "self_attn.v_proj.weight": v.contiguous(),
        prefix + "self_attn.o_proj.weight": state[b + "attn.wo.weight"],
    }
    bias = state.get(b + "attn.wqkv.bias")
    if bias is not None:
        qb, kb, vb = bias.split((H * Dh, Hkv * Dh, Hkv * Dh), dim=0)
        out[prefix + "self_attn.q_proj.bias"] = rope_to_hf(qb, H)
        out[prefix + "self_attn.k_proj.bias"] = rope_to_hf(kb, Hkv)
        out[prefix + "self_attn.v_proj.bias"] = vb.contiguous()
    if cfg.qk_norm:  # a [Dh] weight over one head's dims: permuted as one head's rows
        for n in ("q_norm", "k_norm"):
            out[prefix + f"self_attn.{n}.weight"] = rope_to_hf(state[b + f"attn.{n}.weight"], 1)
    return out


def attn_from_hf(hf: dict[str, torch.Tensor], cfg: ModelConfig, i: int,
                 prefix: str) -> dict[str, torch.Tensor]:
    """Inverse of :func:`attn_to_hf`: our block ``i`` attention and norm tensors."""
    H, Hkv = cfg.n_head, cfg.kv_heads
    b = f"blocks.{i}."
    a = prefix + "self_attn."
    out = {
        b + "attn_norm.weight": hf[prefix + "input_layernorm.weight"],
        b + "mlp_norm.weight": hf[prefix + "post_attention_layernorm.weight"],
        b + "attn.wqkv.weight": torch.cat([rope_from_hf(hf[a + "q_proj.weight"], H),
                                           rope_from_hf(hf[a + "k_proj.weight"], Hkv),
                                           hf[a + "v_proj.weight"]], 0),
        b + "attn.wo.weight": hf[a + "o_proj.weight"],
    }
    if cfg.qkv_bias:
        out[b + "attn.wqkv.bias"] = torch.cat([rope_from_hf(hf[a + "q_proj.bias"], H),
                                               rope_from_hf(hf[a + "k_proj.bias"], Hkv),
                                               hf[a + "v_proj.bias"]], 0)
    if cfg.qk_norm:
        for n in ("q_norm", "k_norm"):
            out[b + f"attn.{n}.weight"] = rope_from_hf(hf[a + f"{n}.weight"], 1)
    return out


def dense_mlp_to_hf(state: dict[str, torch.Tensor], i: int, prefix: str,
                    names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
                    src: str = "mlp.") -> dict[str, torch.Tensor]:
    """A SwiGLU ([in, out] weights) as HF ``{gate,up,down}_proj`` ([out, in])."""
    b = f"blocks.{i}.{src}"
    return {prefix + f"{n}.weight": state[b + w].t().contiguous()
            for n, w in zip(names, ("w_gate", "w_up", "w_down"))}


def dense_mlp_from_hf(hf: dict[str, torch.Tensor], i: int, prefix: str,
                      names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
                      dst: str = "mlp.") -> dict[str, torch.Tensor]:
    b = f"blocks.{i}.{dst}"
    return {b + w: hf[prefix + f"{n}.weight"].t().contiguous()
            for n, w in zip(names, ("w_gate", "w_up", "w_down"))}

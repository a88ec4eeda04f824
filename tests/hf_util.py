"""Tiny random Hugging Face models for the moe_core.hf tests (no downloads)."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB, D, H, LAYERS, FF = 97, 32, 4, 2, 64


def tiny_dense(arch: str, path: Path, *, kv_heads: int = 2, tie: bool = False,
               seed: int = 0, rope: dict | None = None) -> Path:
    """A random ``arch`` saved with save_pretrained at ``path``: llama, mistral (sliding
    window), qwen2 (q/k/v biases), qwen3 (q/k norms and a decoupled head_dim: 4 heads of 16 in a
    32-wide model), llama31 (Llama 3.1's ``llama3`` RoPE scaling, its three frequency bands all
    populated: 1 kept, 1 blended, 2 divided), phi3 (fused q/k/v and gate/up projections);
    ``rope`` replaces the RoPE parameters. Biases and
    norm weights (the q/k norms too) are random, so the mapping of each is tested."""
    import transformers

    torch.manual_seed(seed)
    kw = dict(vocab_size=VOCAB, hidden_size=D, intermediate_size=FF, num_hidden_layers=LAYERS,
              num_attention_heads=H, num_key_value_heads=kv_heads, max_position_embeddings=64,
              rms_norm_eps=1e-5, tie_word_embeddings=tie,
              rope_parameters={"rope_type": "default", "rope_theta": 5000.0})
    cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
           "llama31": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
           "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
           "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
           "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
           "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM)}[arch]
    if arch == "mistral":
        kw["sliding_window"] = 32
    if arch == "qwen3":
        kw["head_dim"] = 16
    if arch == "phi3":
        kw.update(pad_token_id=None, bos_token_id=None, eos_token_id=None)
    if arch == "llama31":  # head_dim 8, θ 500: wavelengths 6.3 (< 32/4), 30, 140, 664 (> 32)
        kw["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 32}
    if rope is not None:
        kw["rope_parameters"] = rope
    model = cls[1](cls[0](**kw))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("bias") or "norm" in n:
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "norm" in n else 0.0))
    model.save_pretrained(str(path))
    return path


def hf_logits(path: Path, tokens: torch.Tensor) -> torch.Tensor:
    import transformers

    m = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    m.eval()
    with torch.no_grad():
        return m(tokens).logits


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| / max |b|."""
    return float((a - b).abs().max() / b.abs().max())


def train_steps(model: torch.nn.Module, opt: torch.optim.Optimizer, vocab: int,
                steps: int = 3, seed: int = 0) -> torch.nn.Module:
    """``steps`` optimizer steps of ``model`` on random (4, 17) token batches drawn from
    ``seed`` (LM loss plus the router's aux loss), so weights (experts, routers) differ."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randint(0, vocab, (4, 17), generator=g)
        out = model(x[:, :-1], x[:, 1:])
        (out.loss + out.aux_loss).backward()
        opt.step()
        opt.zero_grad()
    return model

"""Tiny random Hugging Face models for the moe_core.hf tests (no downloads)."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB, D, H, LAYERS, FF = 97, 32, 4, 2, 64


def tiny_dense(arch: str, path: Path, *, kv_heads: int = 2, tie: bool = False,
               seed: int = 0) -> Path:
    """A random ``arch`` (llama, mistral, qwen2) saved with save_pretrained at ``path``. Biases
    (Qwen2) and norm weights are random too, so the mapping of each is tested."""
    import transformers

    torch.manual_seed(seed)
    kw = dict(vocab_size=VOCAB, hidden_size=D, intermediate_size=FF, num_hidden_layers=LAYERS,
              num_attention_heads=H, num_key_value_heads=kv_heads, max_position_embeddings=64,
              rms_norm_eps=1e-5, tie_word_embeddings=tie,
              rope_parameters={"rope_type": "default", "rope_theta": 5000.0})
    cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
           "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
           "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[arch]
    if arch == "mistral":
        kw["sliding_window"] = 32
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

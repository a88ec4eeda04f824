"""Hugging Face interchange: Llama (2, 3, 3.1+) / Mistral / Qwen2 / Qwen3 / Phi-3 checkpoints in
(``load_dense``, no transformers needed), Mixtral / Qwen2-MoE / Qwen3-MoE / Llama / Qwen3
checkpoints out (``save_moe``), a GGUF file as a cached Llama folder (``cached_hf_folder``), and
the one-shot ``python -m moe_core.hf upcycle`` / ``export`` / ``gguf`` CLI. Nothing here
touches the network.
"""

from __future__ import annotations

from moe_core.lazy import lazy_exports

# Loaded on first use (PEP 562), so that importing a light submodule (a config, a constant)
# does not import torch through this package.
_LAZY = {
    "cached_hf_folder": "moe_core.hf.gguf",
    "checkpoint_hash": "moe_core.hf_config",
    "load_dense": "moe_core.hf.load",
    "load_moe": "moe_core.hf.load",
    "read_config": "moe_core.hf.load",
    "export_arch": "moe_core.hf.save",
    "save_moe": "moe_core.hf.save",
    "load_tokenizer": "moe_core.hf.tokenizer",
}


__all__ = ["cached_hf_folder", "checkpoint_hash", "export_arch", "load_dense", "load_moe",
           "load_tokenizer", "read_config", "save_moe"]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)


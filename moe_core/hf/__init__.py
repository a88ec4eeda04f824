"""Hugging Face interchange: Llama (2, 3, 3.1+) / Mistral / Qwen2 / Qwen3 / Phi-3 checkpoints in
(``load_dense``, no transformers needed), Mixtral / Qwen2-MoE / Qwen3-MoE / Llama / Qwen3
checkpoints out (``save_moe``), and the
one-shot ``python -m moe_core.hf upcycle`` CLI. Nothing here touches the network.
"""

from __future__ import annotations

from moe_core.hf.load import checkpoint_hash, load_dense, load_moe, read_config
from moe_core.hf.save import export_arch, save_moe
from moe_core.hf.tokenizer import load_tokenizer

__all__ = ["checkpoint_hash", "export_arch", "load_dense", "load_moe", "load_tokenizer",
           "read_config", "save_moe"]

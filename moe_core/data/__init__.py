"""Token sources behind one interface, and deterministic batching.

Sources (``DataConfig.source``):
- ``tokens``: memory-mapped token files (uint16/uint32; nanoGPT's ``train.bin``/``val.bin``
  directory layout or one file split by ``val_fraction``);
- ``text``: a .txt file or a directory of them, tokenized by bytes or by a byte-level BPE
  tokenizer trained offline with ``tokenizers`` (saved next to the cached tokens);
- ``stdlib``: a real-text corpus present on every machine: the Python standard library's own
  source files (sorted, bounded by ``max_corpus_bytes``);
- ``synthetic``: a stationary order-1 Markov chain with a known entropy rate, so the irreducible
  loss E of a fit is known exactly.

Data order is a pure function of (seed, step): the data position saved in a checkpoint is the
step counter, resume is exact, and a global batch does not depend on ranks or micro-batches.
"""

from __future__ import annotations

from moe_core.lazy import lazy_exports

# Loaded on first use (PEP 562), so that importing a light submodule (a config, a constant)
# does not import torch through this package.
_LAZY = {
    "TokenBatcher": "moe_core.data.batching",
    "DataConfig": "moe_core.data.config",
    "Dataset": "moe_core.data.sources",
    "data_fingerprint": "moe_core.data.files",
    "load_dataset": "moe_core.data.sources",
}


__all__ = ["DataConfig", "Dataset", "TokenBatcher", "data_fingerprint", "load_dataset"]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)


"""Data configuration."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from moe_core.errors import ConfigError


@functools.cache
def _hf_vocab_size(path: str) -> int:
    from tokenizers import Tokenizer  # noqa: PLC0415 (third-party, loaded on use)

    return Tokenizer.from_file(path).get_vocab_size()


def default_cache_dir() -> Path:
    return Path(os.environ.get("UPCYCLE_CACHE", Path.home() / ".cache" / "upcycle-sweeps"))


@dataclass(frozen=True, kw_only=True, slots=True)
class DataConfig:
    source: Literal["tokens", "text", "stdlib", "synthetic"] = "stdlib"
    """tokens (memmap .bin), text (.txt files), stdlib (built-in corpus), synthetic (Markov)."""
    path: str | None = None
    """tokens: a .bin file or a directory with train.bin/val.bin; text: a .txt file or dir."""
    dtype: Literal["uint16", "uint32"] = "uint16"
    """Token file dtype (nanoGPT: uint16; Megatron with large vocabularies: uint32)."""
    token_vocab_size: int | None = None
    """tokens: vocabulary size of the token files; None = max token + 1."""
    tokenizer: str = "bytes"
    """text/stdlib: ``bytes`` (raw bytes, vocab 256), ``bpe`` (a byte-level BPE trained
    offline), or the path of a Hugging Face folder (or its tokenizer.json) whose tokenizer is
    loaded through ``tokenizers`` (e.g. the ``parent.from_pretrained`` checkpoint's)."""
    bpe_vocab_size: int = 4096
    """BPE target vocabulary size."""
    seq_len: int = 128
    """Context length of training sequences."""
    val_fraction: float = 0.05
    """Share of the tokens held out for validation (the last part of the stream)."""
    max_corpus_bytes: int = 4_000_000
    """stdlib/text: read at most this many bytes (deterministic prefix of the sorted files)."""
    synthetic_vocab: int = 64
    """synthetic: number of symbols V."""
    synthetic_tokens: int = 2_000_000
    """synthetic: length of the sampled stream."""
    synthetic_concentration: float = 0.3
    """synthetic: Dirichlet concentration of each transition row (lower = lower entropy)."""
    synthetic_seed: int = 1234
    """synthetic: seed of the chain itself (the data, not the data order)."""
    cache_dir: str | None = None
    """Where tokenized corpora are cached; None = $UPCYCLE_CACHE or ~/.cache/upcycle-sweeps."""

    def __post_init__(self) -> None:
        if self.source not in ("tokens", "text", "stdlib", "synthetic"):
            raise ConfigError(
                f"data.source={self.source!r} is not known; use tokens, text, stdlib or synthetic"
            )
        if self.source in ("tokens", "text") and not self.path:
            raise ConfigError(f"data.path is required for data.source={self.source}")
        if self.dtype not in ("uint16", "uint32"):
            raise ConfigError(f"data.dtype={self.dtype!r} must be uint16 or uint32")
        if self.hf_tokenizer and not self.tokenizer_file.is_file():
            raise ConfigError(
                f"data.tokenizer={self.tokenizer!r} must be 'bytes', 'bpe', or a Hugging Face "
                "folder holding tokenizer.json (or that file)")
        if not isinstance(self.seq_len, int) or self.seq_len < 1:
            raise ConfigError(f"data.seq_len={self.seq_len!r} must be an integer >= 1")
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"data.val_fraction={self.val_fraction} must lie in (0, 1)")
        if self.bpe_vocab_size < 260:
            raise ConfigError(f"data.bpe_vocab_size={self.bpe_vocab_size} must be >= 260")
        if self.synthetic_vocab < 2:
            raise ConfigError(f"data.synthetic_vocab={self.synthetic_vocab} must be >= 2")
        if self.synthetic_concentration <= 0:
            raise ConfigError(
                f"data.synthetic_concentration={self.synthetic_concentration} must be > 0"
            )
        if self.max_corpus_bytes < 10_000:
            raise ConfigError(f"data.max_corpus_bytes={self.max_corpus_bytes} must be >= 10000")

    @property
    def hf_tokenizer(self) -> bool:
        """``data.tokenizer`` names a Hugging Face tokenizer (not ``bytes`` or ``bpe``)."""
        return self.tokenizer not in ("bytes", "bpe")

    @property
    def tokenizer_file(self) -> Path:
        """tokenizer.json of a Hugging Face ``data.tokenizer`` (the path itself if a file)."""
        p = Path(self.tokenizer)
        return p / "tokenizer.json" if p.is_dir() else p

    def vocab_size_hint(self) -> int:
        """Vocabulary size known from the config alone (exact for bytes/BPE/synthetic)."""
        if self.source == "synthetic":
            return self.synthetic_vocab
        if self.source == "tokens":
            return self.token_vocab_size or 65536
        if self.hf_tokenizer:
            return _hf_vocab_size(str(self.tokenizer_file))
        return 256 if self.tokenizer == "bytes" else self.bpe_vocab_size

    @property
    def resolved_cache_dir(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else default_cache_dir()

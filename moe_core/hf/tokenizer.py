"""The tokenizer of a Hugging Face folder, through ``tokenizers`` (no transformers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moe_core.errors import ConfigError


def tokenizer_file(path: str | Path) -> Path:
    """``tokenizer.json`` of a ``save_pretrained`` folder (or the file itself)."""
    p = Path(path)
    f = p / "tokenizer.json" if p.is_dir() else p
    if not f.is_file():
        raise ConfigError(f"{f} is missing; the folder needs a fast tokenizer (tokenizer.json)")
    return f


def load_tokenizer(path: str | Path) -> Any:
    """``tokenizers.Tokenizer`` from a folder's tokenizer.json (refused in one line if absent)."""
    from tokenizers import Tokenizer  # noqa: PLC0415 (third-party, loaded on use)

    f = tokenizer_file(path)
    try:
        return Tokenizer.from_file(str(f))
    except Exception as e:  # tokenizers raises a bare Exception on a malformed file
        raise ConfigError(f"{f} is not a tokenizers JSON file ({str(e)[:120]})") from None

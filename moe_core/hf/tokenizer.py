"""The tokenizer of a Hugging Face folder, through ``tokenizers``; and the tokenizer a run used,
written next to an export as ``transformers`` files (``save_run_tokenizer``)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from moe_core.data import DataConfig, load_dataset
from moe_core.errors import ConfigError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "added_tokens.json", "vocab.json", "merges.txt",
                   "chat_template.jinja", "chat_template.json", "generation_config.json")
"""A ``save_pretrained`` folder's tokenizer files, its chat template (transformers 5 writes
``chat_template.jinja``, 4.4x ``chat_template.json``) and generation config (eos, sampling
defaults): those present are copied into upcycles and exports."""


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


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map, the alphabet of ``tokenizers``'
    ByteLevel pre-tokenizer and decoder."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = list(bs), 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def byte_tokenizer() -> Any:
    """``data.tokenizer: bytes`` as a ``tokenizers.Tokenizer``: token id = byte value (as
    ``moe_core.data.sources.tokenize`` encodes), a BPE with no merges over the ByteLevel
    alphabet, so any text encodes and every id sequence decodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: PLC0415

    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def symbol_tokenizer(vocab_size: int) -> Any:
    """``data.source: synthetic``'s symbols as words ``s0 … s{V-1}`` (whitespace-separated)."""
    from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: PLC0415

    tok = Tokenizer(models.WordLevel({f"s{i}": i for i in range(vocab_size)}, unk_token="s0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def _save_fast(tok: Any, out: Path) -> None:
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415 (export only)

    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(str(out))


def _copy_folder(src: Path, out: Path) -> list[str]:
    if src.is_file():  # a bare tokenizer.json: wrap it so AutoTokenizer finds a config
        from tokenizers import Tokenizer  # noqa: PLC0415

        _save_fast(Tokenizer.from_file(str(src)), out)
        return ["tokenizer.json"]
    names = [n for n in TOKENIZER_FILES if (src / n).is_file()]
    for n in names:
        shutil.copyfile(src / n, out / n)
    return names


def save_run_tokenizer(out: str | Path, data: DataConfig, *, parent_dir: str | None = None,
                       override: str | Path | None = None) -> str:
    """Write into ``out`` (an exported model's folder) the tokenizer the run used, as files
    ``transformers.AutoTokenizer`` loads; returns one line saying which, or why none.

    In order: ``override`` (a folder or tokenizer.json); a Hugging Face ``data.tokenizer``
    (its folder's files); ``bytes`` / ``bpe`` on text or stdlib data (bytes built here, the
    BPE file the run trained, from the data cache); the ``parent.from_pretrained`` folder's
    files (synthetic data trains on its vocabulary's ids); synthetic symbols; token files
    record no tokenizer (none written: pass one)."""
    out = Path(out)
    if override is not None or data.hf_tokenizer:
        src = Path(override if override is not None else data.tokenizer)
        if not src.exists():
            raise ConfigError(f"tokenizer {src} does not exist; give a save_pretrained folder "
                              "or its tokenizer.json")
        names = _copy_folder(src, out)
        if "tokenizer.json" not in names and "tokenizer.model" not in names:
            raise ConfigError(f"{src} holds no tokenizer.json or tokenizer.model")
        return f"copied from {src} ({', '.join(names)})"
    if data.source in ("text", "stdlib"):
        if data.tokenizer == "bytes":
            _save_fast(byte_tokenizer(), out)
            return "bytes (token id = byte value), built as a PreTrainedTokenizerFast"
        ds = load_dataset(data)  # cached: finds the BPE this data was tokenized with
        from tokenizers import Tokenizer  # noqa: PLC0415

        _save_fast(Tokenizer.from_file(str(ds.tokenizer_path)), out)
        return f"the run's BPE ({ds.tokenizer_path}), as a PreTrainedTokenizerFast"
    if parent_dir is not None and any((Path(parent_dir) / n).is_file()
                                      for n in ("tokenizer.json", "tokenizer.model")):
        names = _copy_folder(Path(parent_dir), out)
        return f"the parent's, copied from {parent_dir} ({', '.join(names)})"
    if data.source == "synthetic":
        _save_fast(symbol_tokenizer(data.synthetic_vocab), out)
        return f"synthetic symbols s0..s{data.synthetic_vocab - 1} (WordLevel)"
    return (f"none: data.source={data.source} records no tokenizer; pass --tokenizer DIR "
            "(the folder the token files were made with)")

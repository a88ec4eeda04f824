"""Token sources: each yields one 1-D token array split into train/val, plus metadata."""

from __future__ import annotations

import hashlib
import json
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from moe_core.data.config import DataConfig
from moe_core.data.files import (  # noqa: F401 (data_fingerprint re-exported)
    data_fingerprint,
    stdlib_files,
    text_files,
)
from moe_core.errors import ConfigError
from moe_core.fsio import atomic_write, atomic_write_text


@dataclass
class Dataset:
    train: np.ndarray
    val: np.ndarray
    vocab_size: int
    content_hash: str
    """Identifies the data (part of parent cache keys)."""
    entropy_rate_nats: float | None = None
    """synthetic: exact entropy rate of the chain (the irreducible loss)."""
    tokenizer_path: str | None = None
    cache_file: str | None = None
    """The token cache file the arrays were read from (synthetic, text, stdlib)."""
    corpus_bytes: int | None = None
    """text/stdlib: bytes of the files read (``max_corpus_bytes`` bounds it)."""
    corpus_truncated: bool = False
    """text/stdlib: whether the bound cut the corpus (else every file was read whole)."""

    def val_batches(self, *, seq_len: int, batch_size: int, num_batches: int,
                    seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A fixed list of validation batches (same every call for the same arguments)."""
        rng = np.random.default_rng([seed, 7919])
        n = len(self.val) - seq_len - 1
        if n < 1:
            raise ConfigError(
                f"the validation split has {len(self.val)} tokens, fewer than data.seq_len+1="
                f"{seq_len + 1}; raise data.val_fraction or lower data.seq_len"
            )
        out = []
        for _ in range(num_batches):
            starts = rng.integers(0, n + 1, size=batch_size)
            out.append(_windows(self.val, starts, seq_len))
        return out


def _windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int):
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
    w = torch.from_numpy(np.asarray(tokens[idx], dtype=np.int64))
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()


def _split(tokens: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Contiguous split: the last ``val_fraction`` is validation (token files: no copy)."""
    n_val = max(1, int(len(tokens) * val_fraction))
    return tokens[:-n_val], tokens[-n_val:]


def _split_interleaved(tokens: np.ndarray, val_fraction: float,
                       block: int = 1 << 15) -> tuple[np.ndarray, np.ndarray]:
    """Every k-th block of ``block`` tokens (k ≈ 1/val_fraction) is validation, so train and
    validation cover the same mix of a sorted corpus (the stdlib's last files are not its
    typical ones). For corpora held in memory."""
    k = max(2, round(1 / val_fraction))
    n_blocks = max(k, len(tokens) // block)
    edges = np.linspace(0, len(tokens), n_blocks + 1).astype(np.int64)
    is_val = (np.arange(n_blocks) % k) == k - 1
    tr = [tokens[a:b] for a, b, v in zip(edges[:-1], edges[1:], is_val) if not v]
    va = [tokens[a:b] for a, b, v in zip(edges[:-1], edges[1:], is_val) if v]
    return np.concatenate(tr), np.concatenate(va)


def _npy_writer(arr: np.ndarray):
    def write(path: Path) -> None:
        with open(path, "wb") as f:  # a file object: np.save would append .npy to a path
            np.save(f, arr, allow_pickle=False)
    return write


def _hash_bytes(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
    return h.hexdigest()[:16]


# ---- corpora ------------------------------------------------------------------------------------


def read_corpus(files: list[Path], max_bytes: int) -> bytes:
    return read_corpus_counted(files, max_bytes)[0]


def read_corpus_counted(files: list[Path], max_bytes: int) -> tuple[bytes, int, bool]:
    """(text, bytes of the files read, whether ``max_bytes`` cut the corpus)."""
    chunks, total = [], 0
    for f in files:
        try:
            b = f.read_bytes()
        except OSError:
            continue
        if total + len(b) > max_bytes:
            b = b[: max_bytes - total]
        chunks.append(b)
        total += len(b)
        if total >= max_bytes:
            return b"\n".join(chunks), total, True
    return b"\n".join(chunks), total, False


# ---- tokenizers ----------------------------------------------------------------------------------


def train_bpe(text: bytes, vocab_size: int, out: Path):
    """Byte-level BPE trained offline with `tokenizers`; deterministic for a given corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False, special_tokens=[],
    )
    lines = text.decode("utf-8", errors="replace").splitlines(keepends=True)
    tok.train_from_iterator(lines, trainer=trainer, length=len(lines))
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))
    return tok


def tokenize(text: bytes, cfg: DataConfig, cache: Path) -> tuple[np.ndarray, int, str | None]:
    """Tokenize a corpus (cached as .npy keyed by corpus hash + tokenizer settings); the array
    is the cache file's, memory-mapped."""
    hf = cfg.hf_tokenizer
    tok_id = (b"hf:" + cfg.tokenizer_file.read_bytes()) if hf else cfg.tokenizer.encode()
    key = _hash_bytes(text, tok_id, str(cfg.bpe_vocab_size).encode())
    d = cache / f"corpus-{key}"
    npy, meta = d / "tokens.npy", d / "meta.json"
    if npy.exists() and meta.exists():
        m = json.loads(meta.read_text())
        return np.load(npy, mmap_mode="r"), m["vocab_size"], m.get("tokenizer")
    d.mkdir(parents=True, exist_ok=True)
    tok_path = None
    if cfg.tokenizer == "bytes":
        arr = np.frombuffer(text, dtype=np.uint8).astype(np.uint16)
        vocab = 256
    else:
        tok_path = d / "tokenizer.json"
        if hf:  # a pretrained model's own tokenizer, through ``tokenizers``
            from tokenizers import Tokenizer

            tok_path.write_bytes(cfg.tokenizer_file.read_bytes())
            tok = Tokenizer.from_file(str(tok_path))
        else:
            tok = train_bpe(text, cfg.bpe_vocab_size, tok_path)
        vocab = tok.get_vocab_size()
        lines = text.decode("utf-8", errors="replace").splitlines(keepends=True)
        ids = [i for enc in tok.encode_batch(lines) for i in enc.ids]
        arr = np.asarray(ids, dtype=np.uint16 if vocab < 65536 else np.uint32)
        tok_path = str(tok_path)
    atomic_write(npy, _npy_writer(arr))
    atomic_write_text(meta, json.dumps({"vocab_size": vocab, "tokenizer": tok_path,
                                        "tokens": int(len(arr))}))
    return np.load(npy, mmap_mode="r"), vocab, tok_path


# ---- synthetic Markov chain ---------------------------------------------------------------


def markov_chain(vocab: int, concentration: float, seed: int) -> np.ndarray:
    """Transition matrix P[i, j] = p(next=j | current=i), rows ~ Dirichlet(concentration)."""
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(vocab, concentration), size=vocab)
    return np.clip(P, 1e-12, None) / np.clip(P, 1e-12, None).sum(1, keepdims=True)


def stationary(P: np.ndarray) -> np.ndarray:
    """Stationary distribution π = πP (left eigenvector for eigenvalue 1)."""
    w, v = np.linalg.eig(P.T)
    pi = np.real(v[:, np.argmin(np.abs(w - 1.0))])
    return pi / pi.sum()


def entropy_rate(P: np.ndarray) -> float:
    """H = Σ_i π_i H(P_i) in nats: the loss of the ideal order-1 predictor."""
    pi = stationary(P)
    row_h = -(P * np.log(P)).sum(1)
    return float(pi @ row_h)


CHAIN_CHUNK = 1 << 20
"""Tokens :func:`sample_chain` holds as Python objects at once (about 32 MB of them)."""


def sample_chain(P: np.ndarray, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed + 1)
    cum = np.cumsum(P, axis=1)
    u = rng.random(n)
    out = np.empty(n, dtype=np.uint16 if len(P) < 65536 else np.uint32)
    s = int(rng.integers(len(P)))
    last = len(P) - 1
    rows: list = [None] * len(P)  # cum's rows as float lists on first visit: bisect is C
    for a in range(0, n, CHAIN_CHUNK):  # Python lists of a chunk only: 32 B a token, not n's
        seq = []
        for x in u[a:a + CHAIN_CHUNK].tolist():  # sequential by nature; bisect_right is
            r = rows[s]  # searchsorted(side="right") on the same doubles, ~5x faster than a
            if r is None:  # numpy call per step
                r = rows[s] = cum[s].tolist()
            s = min(bisect_right(r, x), last)
            seq.append(s)
        out[a:a + len(seq)] = seq
    return out


# ---- entry point ---------------------------------------------------------------------------


def load_dataset(cfg: DataConfig) -> Dataset:
    """Load (and cache) the tokens of ``cfg`` and split them into train/val."""
    cache = cfg.resolved_cache_dir
    if cfg.source == "synthetic":
        key = _hash_bytes(json.dumps([cfg.synthetic_vocab, cfg.synthetic_concentration,
                                      cfg.synthetic_seed, cfg.synthetic_tokens]).encode())
        P = markov_chain(cfg.synthetic_vocab, cfg.synthetic_concentration, cfg.synthetic_seed)
        f = cache / f"synthetic-{key}.npy"
        if f.exists():
            toks = np.load(f, mmap_mode="r")
        else:
            f.parent.mkdir(parents=True, exist_ok=True)
            toks = sample_chain(P, cfg.synthetic_tokens, cfg.synthetic_seed)
            atomic_write(f, _npy_writer(toks))
        tr, va = _split_interleaved(toks, cfg.val_fraction)
        return Dataset(tr, va, cfg.synthetic_vocab, f"synthetic-{key}", entropy_rate(P),
                       cache_file=str(f))
    if cfg.source == "tokens":
        p = Path(cfg.path)
        dt = np.dtype(cfg.dtype)
        if p.is_dir():
            if not (p / "train.bin").exists() or not (p / "val.bin").exists():
                raise ConfigError(f"data.path={p} must contain train.bin and val.bin")
            tr = np.memmap(p / "train.bin", dtype=dt, mode="r")
            va = np.memmap(p / "val.bin", dtype=dt, mode="r")
        elif p.is_file():
            tr, va = _split(np.memmap(p, dtype=dt, mode="r"), cfg.val_fraction)
        else:
            raise ConfigError(f"data.path={p} does not exist")
        vocab = cfg.token_vocab_size or int(max(tr.max(), va.max())) + 1
        st = (p / "train.bin").stat() if p.is_dir() else p.stat()
        h = _hash_bytes(str(p.resolve()).encode(), str(st.st_size).encode(),
                        np.asarray(tr[:4096]).tobytes())
        return Dataset(tr, va, vocab, f"tokens-{h}")
    files = stdlib_files() if cfg.source == "stdlib" else text_files(cfg.path)
    text, nbytes, cut = read_corpus_counted(files, cfg.max_corpus_bytes)
    toks, vocab, tok_path = tokenize(text, cfg, cache)
    tr, va = _split_interleaved(toks, cfg.val_fraction)
    return Dataset(tr, va, vocab, f"{cfg.source}-{_hash_bytes(text)}-{cfg.tokenizer}",
                   tokenizer_path=tok_path, cache_file=getattr(toks, "filename", None),
                   corpus_bytes=nbytes, corpus_truncated=cut)

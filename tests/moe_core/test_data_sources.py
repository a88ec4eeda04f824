"""Token sources and batching: determinism, rank/micro-batch invariance, caches, entropy."""

import numpy as np
import pytest
import torch

from moe_core.data import DataConfig, TokenBatcher, load_dataset
from moe_core.data.sources import entropy_rate, markov_chain, sample_chain, stationary
from moe_core.errors import ConfigError


def test_batches_deterministic_and_shifted():
    toks = np.arange(10_000, dtype=np.uint16)
    b = TokenBatcher(toks, seq_len=16, global_batch=8, micro_batch=4, seed=3)
    x1, y1 = b.batch(5, 1)
    x2, y2 = TokenBatcher(toks, seq_len=16, global_batch=8, micro_batch=4, seed=3).batch(5, 1)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert torch.equal(y1[:, :-1], x1[:, 1:])
    x3, _ = TokenBatcher(toks, seq_len=16, global_batch=8, micro_batch=4, seed=4).batch(5, 1)
    assert not torch.equal(x1, x3)


def test_global_batch_independent_of_ranks_and_micro_batches():
    toks = np.random.default_rng(0).integers(0, 100, 50_000).astype(np.uint16)
    one = TokenBatcher(toks, seq_len=8, global_batch=8, micro_batch=8, seed=1).batch(7, 0)[0]
    parts = []
    for r in range(2):
        b = TokenBatcher(toks, seq_len=8, global_batch=8, micro_batch=2, seed=1, rank=r,
                         world_size=2)
        parts += [b.batch(7, m)[0] for m in range(b.num_micro_batches)]
    assert torch.equal(torch.cat(parts), one)


def test_batcher_rules():
    with pytest.raises(ConfigError, match="must split into 3 ranks"):
        TokenBatcher(np.zeros(100), seq_len=4, global_batch=8, micro_batch=2, seed=0,
                     world_size=3)
    with pytest.raises(ConfigError, match="fewer than data.seq_len"):
        TokenBatcher(np.zeros(5), seq_len=8, global_batch=2, micro_batch=2, seed=0)


def test_token_files_memmap(tmp_path):
    for dtype in ("uint16", "uint32"):
        arr = (np.arange(20_000) % 70_000 if dtype == "uint32" else np.arange(20_000) % 500)
        arr = arr.astype(dtype)
        d = tmp_path / dtype
        d.mkdir()
        arr[:15_000].tofile(d / "train.bin")
        arr[15_000:].tofile(d / "val.bin")
        ds = load_dataset(DataConfig(source="tokens", path=str(d), dtype=dtype, seq_len=16))
        assert isinstance(ds.train, np.memmap) and len(ds.train) == 15_000
        assert ds.vocab_size == int(arr.max()) + 1
        one = tmp_path / f"one-{dtype}.bin"
        arr.tofile(one)
        ds1 = load_dataset(DataConfig(source="tokens", path=str(one), dtype=dtype,
                                      val_fraction=0.1))
        assert len(ds1.val) == 2_000 and ds1.val[0] == arr[18_000]


def test_text_bpe_roundtrip_and_cache(tmp_path):
    from tokenizers import Tokenizer

    text = ("def add(a, b):\n    return a + b\n\n" * 800 + "class Foo:\n    pass\n" * 500)
    (tmp_path / "t.txt").write_text(text)
    cfg = DataConfig(source="text", path=str(tmp_path / "t.txt"), tokenizer="bpe",
                     bpe_vocab_size=300, cache_dir=str(tmp_path / "c"), seq_len=8)
    ds = load_dataset(cfg)
    assert ds.vocab_size <= 300 and ds.tokenizer_path
    tok = Tokenizer.from_file(ds.tokenizer_path)
    enc = tok.encode("def add(a, b):\n")
    assert tok.decode(enc.ids) == "def add(a, b):\n"
    caches = list((tmp_path / "c").glob("corpus-*"))
    ds2 = load_dataset(cfg)  # cache hit: same tokens, no new cache directory
    assert list((tmp_path / "c").glob("corpus-*")) == caches
    assert np.array_equal(np.asarray(ds.train), np.asarray(ds2.train))


def test_stdlib_corpus_bytes(tmp_path):
    ds = load_dataset(DataConfig(source="stdlib", tokenizer="bytes", max_corpus_bytes=200_000,
                                 cache_dir=str(tmp_path)))
    assert ds.vocab_size == 256
    assert len(ds.train) + len(ds.val) >= 199_000
    text = bytes(np.asarray(ds.train[:2000], dtype=np.uint8)).decode("utf-8", "replace")
    assert "import" in text or "def " in text


def test_synthetic_entropy_rate_is_exact(tmp_path):
    P = markov_chain(8, 0.5, seed=0)
    pi = stationary(P)
    assert np.allclose(pi @ P, pi) and pi.sum() == pytest.approx(1.0)
    h = entropy_rate(P)
    x = sample_chain(P, 200_000, seed=0).astype(np.int64)
    nll = -np.log(P[x[:-1], x[1:]]).mean()
    # Monte-Carlo estimate of the entropy rate; std of per-token NLL / sqrt(n) is ~0.003 here
    assert nll == pytest.approx(h, abs=0.02)
    ds = load_dataset(DataConfig(source="synthetic", synthetic_vocab=8,
                                 synthetic_concentration=0.5, synthetic_tokens=20_000,
                                 synthetic_seed=0, cache_dir=str(tmp_path)))
    assert ds.entropy_rate_nats == pytest.approx(h)


def test_val_batches_fixed(tmp_path):
    ds = load_dataset(DataConfig(source="synthetic", synthetic_tokens=20_000,
                                 cache_dir=str(tmp_path)))
    a = ds.val_batches(seq_len=16, batch_size=4, num_batches=3, seed=0)
    b = ds.val_batches(seq_len=16, batch_size=4, num_batches=3, seed=0)
    assert all(torch.equal(p[0], q[0]) for p, q in zip(a, b))


@pytest.mark.parametrize("kwargs, match", [
    (dict(source="web"), r"data\.source='web' is not known"),
    (dict(source="tokens"), r"data\.path is required for data\.source=tokens"),
    (dict(tokenizer="wordpiece"), r"data\.tokenizer='wordpiece'"),
    (dict(seq_len=0), r"data\.seq_len=0"),
    (dict(val_fraction=1.0), r"data\.val_fraction=1\.0 must lie in \(0, 1\)"),
    (dict(bpe_vocab_size=100), r"data\.bpe_vocab_size=100"),
    (dict(synthetic_vocab=1), r"data\.synthetic_vocab=1"),
    (dict(synthetic_concentration=0), r"data\.synthetic_concentration=0"),
    (dict(dtype="int8"), r"data\.dtype='int8'"),
])
def test_data_rules(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        DataConfig(**kwargs)


def test_missing_paths(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_dataset(DataConfig(source="tokens", path=str(tmp_path / "nope.bin")))
    with pytest.raises(ConfigError, match="has no .txt files"):
        load_dataset(DataConfig(source="text", path=str(tmp_path)))


def test_sample_chain_is_the_same_chain_whatever_its_chunk(monkeypatch):
    # the chain is carried across chunks: a chunk of 7 tokens (boundaries mid-chain and one
    # partial last chunk) gives the tokens of one chunk of all of them
    from moe_core.data import sources

    P = markov_chain(16, 0.3, seed=4)
    whole = sample_chain(P, 1000, seed=4)
    monkeypatch.setattr(sources, "CHAIN_CHUNK", 7)
    assert np.array_equal(sample_chain(P, 1000, seed=4), whole)

"""The parent cache trusts only what the run that trained it wrote (issue #32): a damaged or
foreign entry (a flipped byte, a meta.json with no checksums, another parent's meta.json, a
symbolic link) is moved aside with a warning and the parent is trained again, never used and
never a failed trial."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from moe_core.train.config import train_config_from_dict
from moe_core.train.runner import parent_key, train_parent

CFG = {
    "model": {"preset": "debug"},
    "moe": {"num_experts": 4, "top_k": 2},
    "data": {"source": "synthetic", "synthetic_vocab": 32, "synthetic_tokens": 20000,
             "seq_len": 16},
    "batch": {"global_batch": 4, "micro_batch": 4},
    "eval": {"every_steps": 2, "batches": 1},
    "tokens": 128,
    "parent": {"tokens": 128},
    "upcycle": {"method": "dense_to_moe"},
}


def _flip(entry):
    f = next(entry.glob("model*.safetensors"))
    b = bytearray(f.read_bytes())
    b[-1] ^= 0xFF
    f.write_bytes(bytes(b))


def _no_checksums(entry):
    m = json.loads((entry / "meta.json").read_text())
    m["sha256"] = {}
    (entry / "meta.json").write_text(json.dumps(m))
    _flip(entry)


def _other_key(entry):
    m = json.loads((entry / "meta.json").read_text())
    m["parent_key"] = "0123456789abcdef"
    (entry / "meta.json").write_text(json.dumps(m))


def _symlink(entry):
    f = next(entry.glob("model*.safetensors"))
    real = entry.parent / "elsewhere.safetensors"
    f.rename(real)
    f.symlink_to(real)


@pytest.mark.parametrize("damage", [_flip, _no_checksums, _other_key, _symlink],
                         ids=["flipped_byte", "no_checksums", "another_parent", "symlink"])
def test_damaged_cache_entry_is_moved_aside_and_retrained(tmp_path, caplog, damage):
    cfg = train_config_from_dict(CFG)
    cache = tmp_path / "cache"
    first, trained = train_parent(cfg, cache)
    assert trained
    entry = cache / parent_key(cfg)
    damage(entry)
    with caplog.at_level(logging.WARNING):
        again, trained = train_parent(cfg, cache)
    assert trained  # not used: trained again
    aside = list(cache.glob(f".corrupt-{entry.name}-*"))
    assert len(aside) == 1 and "moved it to" in caplog.text
    assert {k: tuple(v.shape) for k, v in first.model_state.items()} == \
        {k: tuple(v.shape) for k, v in again.model_state.items()}
    assert all(torch.isfinite(torch.as_tensor(v)).all() for v in again.model_state.values())
    _, trained = train_parent(cfg, cache)
    assert not trained  # the fresh entry is trusted

"""Hostile Hugging Face folders are refused in one line before anything uses them, in bounded
time and memory (``moe_core.hf_check``): a huge or absurd config.json, header bombs, truncated,
garbage and wrong-shape safetensors, NaN weights, integer embeddings."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from moe_core.errors import ConfigError
from moe_core.hf.load import load_pretrained
from moe_core.hf_check import MAX_CONFIG_BYTES
from moe_core.hf_config import check_checkpoint
from tests.hf_util import tiny_dense


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return tiny_dense("llama", tmp_path_factory.mktemp("hf") / "llama")


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _edit_tensors(folder: Path, edit) -> Path:
    f = folder / "model.safetensors"
    t = load_file(str(f))
    edit(t)
    save_file(t, str(f), metadata={"format": "pt"})
    return folder


def _edit_config(folder: Path, **kw) -> Path:
    c = json.loads((folder / "config.json").read_text())
    c.update(kw)
    (folder / "config.json").write_text(json.dumps(c))
    return folder


def _header_bomb(folder: Path) -> Path:
    f = folder / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(struct.pack("<Q", 2**62) + data[8:])
    return folder


def _truncate(folder: Path) -> Path:
    f = folder / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    return folder


def _garbage(folder: Path) -> Path:
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    return folder


def _nan(t):
    t["model.layers.1.mlp.down_proj.weight"][0, 0] = float("nan")


def _int_emb(t):
    t["model.embed_tokens.weight"] = t["model.embed_tokens.weight"].to(torch.int32)


def _wrong_shape(t):
    t["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(8, 32)


def _huge_config(folder: Path) -> Path:
    c = (folder / "config.json").read_text()
    (folder / "config.json").write_text(c[:-2] + ', "pad": "' + "x" * MAX_CONFIG_BYTES + '"}')
    return folder


# (id, how the folder is damaged, regex of the one-line refusal)
CASES = [
    ("header_bomb", _header_bomb, r"header claims 4,611,686,018,427,387,904 bytes"),
    ("truncated", _truncate, r"truncated or corrupt"),
    ("garbage", _garbage, r"header claims .* bytes|not JSON|truncated or corrupt"),
    ("nan_weights", lambda d: _edit_tensors(d, _nan),
     r"'model\.layers\.1\.mlp\.down_proj\.weight' holds 1 non-finite values"),
    ("int32_embeddings", lambda d: _edit_tensors(d, _int_emb),
     r"'model\.embed_tokens\.weight' is (I32|torch\.int32); weights must be floating point"),
    ("wrong_shape", lambda d: _edit_tensors(d, _wrong_shape),
     r"q_proj\.weight' has shape \(8, 32\) but config\.json implies \(32, 32\)"),
    ("huge_config", _huge_config, r"config\.json is 1,04\d,\d+ bytes, more than 1,048,576"),
    ("layers_1e9", lambda d: _edit_config(d, num_hidden_layers=1e9),
     r"num_hidden_layers=1000000000\.0 must be an integer in \[1, 1,024\]"),
    ("vocab_negative", lambda d: _edit_config(d, vocab_size=-5),
     r"vocab_size=-5 must be an integer in \[1, "),
    ("hidden_text", lambda d: _edit_config(d, hidden_size="32"),
     r"hidden_size='32' must be an integer"),
    ("extra_layer", lambda d: _edit_config(d, num_hidden_layers=1),
     r"model\.layers\.1\.[\w.]+' is beyond config\.json's num_hidden_layers=1"),
]


@pytest.mark.parametrize("name, damage, match", CASES, ids=[c[0] for c in CASES])
def test_damaged_checkpoint_is_refused_in_one_line(good, tmp_path, name, damage, match):
    folder = damage(_copy(good, tmp_path / name))
    with pytest.raises(ConfigError, match=match) as e:
        check_checkpoint(folder)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name, damage, match",
                         [c for c in CASES if c[0] in ("nan_weights", "int32_embeddings",
                                                        "huge_config", "layers_1e9")],
                         ids=["nan_weights", "int32_embeddings", "huge_config", "layers_1e9"])
def test_load_refuses_what_the_check_refuses(good, tmp_path, name, damage, match):
    """The loader itself (``moe_core.hf upcycle``, a pretrained parent) refuses them too: NaN
    weights and integer embeddings are never upcycled and written. It runs the same streamed
    check first (issue #43), so its message is the check's."""
    folder = damage(_copy(good, tmp_path / name))
    with pytest.raises(ConfigError, match=match):
        load_pretrained(folder)


def test_good_checkpoint_passes(good):
    r = check_checkpoint(good)
    assert r.files == 1 and r.tensors > 10 and r.elements > 1000
    assert "all finite" in r.summary()

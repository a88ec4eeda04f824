"""Exports ship the tokenizer the run used: ``transformers.AutoTokenizer`` and
``AutoModelForCausalLM`` load the folder (local files only) and generate."""

from __future__ import annotations

import json

import pytest

from moe_core.errors import ConfigError
from moe_core.hf.__main__ import main
from moe_core.hf.tokenizer import byte_tokenizer, save_run_tokenizer
from moe_core.train import Trainer, train_config_from_dict


def test_byte_tokenizer_ids_are_the_bytes():
    tok = byte_tokenizer()
    text = "def f(x):\n    return 'é' + x  # ünïcode"
    ids = tok.encode(text).ids
    assert ids == list(text.encode("utf-8")) and tok.decode(ids) == text
    assert tok.get_vocab_size() == 256


def _train(tmp_path, data):
    cfg = train_config_from_dict({
        "name": "x", "seed": 0, "model": {"preset": "debug"},
        "moe": {"num_experts": 4, "top_k": 2, "router": {"order": "topk_softmax"}},
        "data": {**data, "seq_len": 32, "cache_dir": str(tmp_path / "cache")},
        "batch": {"global_batch": 4, "micro_batch": 4}, "optim": {"lr": 3e-3},
        "eval": {"every_steps": 2, "batches": 1}, "tokens": 2 * 4 * 32})
    Trainer(cfg, out_dir=tmp_path / "ck", checkpoint_steps=[2]).fit()
    return tmp_path / "ck" / "step_00000002"


def _load_and_generate(folder, prompt):
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True,
                                                              dtype=torch.float32)
    ids = tok(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert out.shape[1] == ids.shape[1] + 5
    return tok, ids, out


@pytest.mark.slow
def test_export_of_a_bytes_run_ships_a_byte_tokenizer(tmp_path, capsys):
    ck = _train(tmp_path, {"source": "stdlib", "tokenizer": "bytes",
                           "max_corpus_bytes": 200_000})
    assert main(["export", str(ck), str(tmp_path / "hf"), "--no-verify"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["tokenizer"].startswith("bytes")
    tok, ids, out = _load_and_generate(tmp_path / "hf", "import os\n")
    assert ids[0].tolist() == list(b"import os\n")
    assert tok.decode(out[0, :ids.shape[1]]) == "import os\n"


@pytest.mark.slow
def test_export_of_a_synthetic_run_ships_its_symbols(tmp_path, capsys):
    ck = _train(tmp_path, {"source": "synthetic", "synthetic_vocab": 32,
                           "synthetic_tokens": 20_000})
    assert main(["export", str(ck), str(tmp_path / "hf"), "--no-verify"]) == 0
    capsys.readouterr()
    _, ids, _ = _load_and_generate(tmp_path / "hf", "s3 s17 s31")
    assert ids[0].tolist() == [3, 17, 31]


def test_token_files_name_no_tokenizer_and_a_missing_override_is_one_line(tmp_path):
    from moe_core.data import DataConfig

    (tmp_path / "t.bin").write_bytes(b"\0" * 64)
    data = DataConfig(source="tokens", path=str(tmp_path / "t.bin"))
    assert save_run_tokenizer(tmp_path, data).startswith("none: data.source=tokens")
    with pytest.raises(ConfigError, match="tokenizer .*nope does not exist"):
        save_run_tokenizer(tmp_path, data, override=tmp_path / "nope")


def test_a_from_pretrained_runs_export_copies_the_parents_tokenizer(tmp_path):
    """Synthetic data on a checkpoint's vocabulary: the parent's tokenizer files are the
    model's; a data.tokenizer folder (text data) wins over them."""
    import transformers

    from moe_core.data import DataConfig

    parent = tmp_path / "parent"
    parent.mkdir()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=byte_tokenizer(),
                                                eos_token="ÿ")
    fast.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    fast.save_pretrained(str(parent))
    transformers.GenerationConfig(eos_token_id=255, max_new_tokens=7).save_pretrained(
        str(parent))
    out = tmp_path / "out"
    out.mkdir()
    synth = DataConfig(source="synthetic", synthetic_vocab=32)
    line = save_run_tokenizer(out, synth, parent_dir=str(parent))
    assert line.startswith(f"the parent's, copied from {parent}")
    assert (out / "tokenizer.json").read_bytes() == (parent / "tokenizer.json").read_bytes()
    tok = transformers.AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert tok("ab").input_ids == [97, 98] and tok.eos_token == "ÿ"
    # the chat template and the generation config travel with the tokenizer (#39)
    for name in ("chat_template.jinja", "generation_config.json"):
        assert (out / name).read_bytes() == (parent / name).read_bytes(), name
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == \
        "<user>hi"
    text = tmp_path / "t.txt"
    text.write_text("hello " * 3000)
    other = tmp_path / "out2"
    other.mkdir()
    line = save_run_tokenizer(other, DataConfig(source="text", path=str(text),
                                                tokenizer=str(parent)), parent_dir="/nowhere")
    assert line.startswith(f"copied from {parent}")

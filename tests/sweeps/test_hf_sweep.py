"""parent.from_pretrained: a tiny random Llama (transformers' config classes, save_pretrained
to a temporary folder) is the parent of a sweep; trials export Hugging Face checkpoints."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import torch

from moe_core.config import MoEConfig, RouterConfig
from moe_core.errors import ConfigError
from moe_core.hf import load_dense, load_moe, save_moe
from moe_core.model import build_model
from moe_core.train import Trainer
from moe_core.train.config import train_config_from_dict
from moe_core.train.evaluate import evaluate
from moe_core.train.runner import parent_key, train_parent
from moe_core.upcycle import dense_to_moe_state
from tests.hf_util import hf_logits, rel_err, tiny_dense, train_steps

BASE = {
    "moe": {"num_experts": 4, "top_k": 2, "router": {"order": "topk_softmax"}},
    "data": {"source": "synthetic", "synthetic_vocab": 32, "synthetic_tokens": 20000,
             "seq_len": 16},
    "batch": {"global_batch": 4, "micro_batch": 4},
    "tokens": 256,
    "upcycle": {"method": "dense_to_moe", "lr_policy": {"policy": "reset", "peak": 1e-3}},
}


def cfg_with(path, **over):
    d = json.loads(json.dumps(BASE))
    d["parent"] = {"from_pretrained": str(path)}
    for k, v in over.items():
        node = d
        *head, last = k.split(".")
        for h in head:
            node = node.setdefault(h, {})
        node[last] = v
    return train_config_from_dict(d)


def test_pretrained_parent_config_key_and_cache(tmp_path):
    path = tiny_dense("llama", tmp_path / "llama")
    cfg = cfg_with(path)
    mc = cfg.model_config()
    assert (mc.d_model, mc.n_layer, mc.n_kv_heads, mc.vocab_size) == (32, 2, 2, 97)
    assert mc.max_seq_len == 16 and mc.moe.num_experts == 4
    key = parent_key(cfg)
    assert key.startswith("hf-") and parent_key(cfg) == key
    state, loaded = train_parent(cfg, tmp_path / "cache")
    assert loaded and state.tokens == 0
    state2, loaded2 = train_parent(cfg, tmp_path / "cache")
    assert not loaded2  # cached
    _, dense = load_dense(path)
    assert all(torch.equal(torch.as_tensor(state2.model_state[k]), v) for k, v in dense.items())
    # another checkpoint (other weights) is another parent
    other = tiny_dense("llama", tmp_path / "llama2", seed=1)
    assert parent_key(cfg_with(other)) != key


@pytest.mark.parametrize("key, value, match", [
    ("model.preset", "tiny", "model.preset='tiny' contradicts parent.from_pretrained"),
    ("parent.tokens", 0, r"parent.tokens=0 must be >= 1 \(with parent.from_pretrained"),
    ("parent.seed", 1, "parent.seed contradicts parent.from_pretrained"),
    ("parent.lr", 1e-3, "parent.lr contradicts parent.from_pretrained"),
    ("upcycle.lr_policy", {"policy": "constant"}, "upcycle.lr_policy.policy=constant needs"),
    ("data.seq_len", 128, "data.seq_len .*=128 exceeds the checkpoint's 64 positions"),
    ("moe.granularity", 3, "moe.granularity=3 does not divide model.d_ff=64"),
])
def test_contradictory_settings_are_refused(tmp_path, key, value, match):
    path = tiny_dense("llama", tmp_path / "llama")
    with pytest.raises(ConfigError, match=match) as e:
        cfg_with(path, **{key: value})
    assert "\n" not in str(e.value)


def test_a_pretrained_parent_may_state_its_d1(tmp_path):
    """#38: parent.tokens with from_pretrained is the checkpoint's known pretraining tokens
    (recorded as D1, nothing trained), so the D1 × D2 laws apply to the user's own model."""
    cfg = cfg_with(tiny_dense("llama", tmp_path / "llama"), **{"parent.tokens": 2_000_000})
    assert cfg.parent.tokens == 2_000_000 and cfg.parent.from_pretrained


def test_an_export_keeps_the_checkpoints_positions(tmp_path):
    """The model is built with the run's 16 positions; the export says the checkpoint's 64
    (RoPE does not depend on the table's length), unless model.max_seq_len asked for a length
    or the checkpoint is no longer there."""
    from moe_core.hf.export import exported_config

    path = tiny_dense("llama", tmp_path / "llama")
    cfg = cfg_with(path)
    assert cfg.model_config().max_seq_len == 16
    assert exported_config(cfg, cfg.model_config()).max_seq_len == 64
    asked = cfg_with(path, **{"model.max_seq_len": 32})
    assert exported_config(asked, asked.model_config()).max_seq_len == 32
    built = cfg.model_config()
    (path / "config.json").unlink()
    assert exported_config(cfg, built).max_seq_len == 16


@pytest.mark.slow
@pytest.mark.distributed  # a sweep on a Ray of its own
def test_pretrained_sweep_end_to_end_exports_hf(tmp_path):
    path = tiny_dense("llama", tmp_path / "llama")
    sets = [f"base.parent.from_pretrained={path}", "base.data.source=synthetic",
            "base.data.tokenizer=bytes", "base.data.synthetic_vocab=32",
            "base.data.synthetic_tokens=20000", "base.data.seq_len=16",
            "base.batch.global_batch=4", "base.batch.micro_batch=4", "base.tokens=128",
            "base.optim.dtype=fp32", "base.eval.every_steps=4", "base.eval.batches=1",
            "base.moe.num_experts=4", f"results={tmp_path / 'results'}",
            # the spec's offline W&B runs are not what this test reads: each trial's would
            # cost two more Ray actors (the W&B logger and its queue)
            "logging.wandb.enabled=false"]
    env = dict(os.environ, WANDB_MODE="offline", UPCYCLE_CACHE=str(tmp_path / "cache"))
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-m", "sweeps.run",
                          "search_spaces/upcycle_pretrained.yaml", "--json",
                          *[a for s in sets for a in ("--set", s)]],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    res = tmp_path / "results" / "upcycle_pretrained"
    rows = pq.read_table(res / "results.parquet").to_pylist()
    trials = sorted({r["trial_id"] for r in rows})
    assert len(trials) == 3 and {r["status"] for r in rows} == {"ok"}
    assert len({r["parent_key"] for r in rows}) == 1 and rows[0]["parent_key"].startswith("hf-")
    for t in trials:  # the parent's loss in every row: the trial's step-0 eval (#38)
        mine = [r for r in rows if r["trial_id"] == t]
        step0 = next(r["val_loss"] for r in mine if r["step"] == 0)
        assert {(r["parent_val_loss"], r["parent_loss_source"]) for r in mine} == {
            (step0, "step-0 eval")}
    tokens = torch.randint(0, 32, (2, 16), generator=torch.Generator().manual_seed(0))
    for t in trials:
        folder = res / "export" / t
        hf_cfg = json.loads((folder / "config.json").read_text())
        assert hf_cfg["architectures"] == ["MixtralForCausalLM"]
        assert hf_cfg["max_position_embeddings"] == 64  # the checkpoint's, not seq_len 16
        assert (folder / "tokenizer.json").is_file()  # synthetic symbols: the parent has none
        cfg, state = load_moe(folder)
        m = build_model(cfg)
        m.load_state_dict(state)
        m.eval()
        with torch.no_grad():
            assert rel_err(hf_logits(folder, tokens), m(tokens).logits) < 1e-5


@pytest.mark.parametrize("arch", ["qwen3", "llama31"])
def test_qwen3_and_llama31_parents_upcycle_train_and_export(tmp_path, arch):
    """A Qwen3 parent (q/k norms, decoupled head_dim) and a Llama 3.1 parent (llama3 RoPE
    scaling) upcycle in the Trainer on the DeepSpeed engine: the first eval is the dense
    checkpoint's loss on the same batches (function preservation), two steps train, and the
    trained MoE exports as Qwen3-MoE / Mixtral with transformers' logits equal to ours."""
    path = tiny_dense(arch, tmp_path / arch)
    cfg = cfg_with(path, **{"eval.every_steps": 2, "eval.batches": 2, "tokens": 128})
    mc = cfg.model_config()
    assert (mc.qk_norm, mc.head_dim) == ((True, 16) if arch == "qwen3" else (False, None))
    assert (mc.rope_scaling is not None) == (arch == "llama31")
    parent, _ = train_parent(cfg, tmp_path / "cache")
    t = Trainer(cfg, parent=parent)
    res = t.fit()
    dense_cfg, dense_state = load_dense(path)
    dense = build_model(dataclasses.replace(dense_cfg, max_seq_len=16))
    dense.load_state_dict(dense_state)
    assert abs(res.initial_val_loss - evaluate(dense, t.val, torch.device("cpu"))["val_loss"]) \
        < 1e-5
    assert res.steps == 2 and abs(res.val_loss - res.initial_val_loss) > 1e-4  # it trained
    want = save_moe(t.full_model_state(), t.model.config, tmp_path / "hf")
    assert want == ("Qwen3MoeForCausalLM" if arch == "qwen3" else "MixtralForCausalLM")
    x = t.val[0][0]
    t.model.eval()
    with torch.no_grad():
        mine = t.model(x).logits
    assert rel_err(hf_logits(tmp_path / "hf", x), mine) < 1e-5


def _hf_moe(tmp_path, top_k=1):
    """A Mixtral folder: a tiny random Llama upcycled to 4 coarse experts (top-1, so that
    doubling the experts preserves the function exactly: 003 Def. 3.1, see
    tests/moe_core/test_upcycle_experts.py) and lightly trained so the experts differ."""
    cfg, state = load_dense(tiny_dense("llama", tmp_path / "src"))
    moe = MoEConfig(num_experts=4, top_k=top_k, router=RouterConfig(order="topk_softmax"))
    st, mc = dense_to_moe_state(state, cfg, moe, seed=0)
    m = build_model(mc)
    m.load_state_dict(st)
    train_steps(m, torch.optim.AdamW(m.parameters(), lr=1e-2), 32)
    assert save_moe(m, None, tmp_path / "mixtral") == "MixtralForCausalLM"
    return tmp_path / "mixtral", m


def test_an_hf_moe_checkpoint_grows_its_experts(tmp_path):
    """parent.from_pretrained names a Mixtral folder: the parent is the checkpoint's MoE
    (its experts and routing read from config.json), ``expand_experts`` doubles them in the
    Trainer (the first eval equals the checkpoint's own loss on the same batches), training
    goes on, and the 8-expert model exports as Mixtral with transformers' logits equal ours."""
    path, src = _hf_moe(tmp_path)
    over = {"moe": {"num_experts": 8, "top_k": 1, "router": {"order": "topk_softmax"}},
            "upcycle.method": "expand_experts", "upcycle.factor": 2,
            "eval.every_steps": 2, "eval.batches": 2, "tokens": 128}
    cfg = cfg_with(path, **over)
    assert cfg.parent_moe().num_experts == 4
    assert cfg.model_config(moe="parent").moe.num_experts == 4
    parent, _ = train_parent(cfg, tmp_path / "cache")
    assert parent.model_config.moe.num_experts == 4
    t = Trainer(cfg, parent=parent)
    res = t.fit()
    ref = build_model(dataclasses.replace(src.config, max_seq_len=16))
    ref.load_state_dict(src.state_dict())
    assert abs(res.initial_val_loss - evaluate(ref, t.val, torch.device("cpu"))["val_loss"]) \
        < 1e-5
    assert abs(res.val_loss - res.initial_val_loss) > 1e-4  # it trained
    assert save_moe(t.full_model_state(), t.model.config, tmp_path / "hf") == "MixtralForCausalLM"
    x = t.val[0][0]
    t.model.eval()
    with torch.no_grad():
        assert rel_err(hf_logits(tmp_path / "hf", x), t.model(x).logits) < 1e-5


@pytest.mark.parametrize("over, match", [
    ({"moe": {"num_experts": 8, "top_k": 1}},  # dense_to_moe, the default method
     "dense_to_moe needs a dense parent .*; this checkpoint is an MoE: use expand_experts"),
    ({"moe": {"num_experts": 12, "top_k": 1}, "upcycle.method": "expand_experts",
      "upcycle.factor": 2},
     "moe.num_experts=12 must equal the parent.from_pretrained checkpoint's num_experts=4 × "
     r"upcycle.factor = 8"),
    ({"moe": {"num_experts": 4, "top_k": 2, "router": {"order": "topk_softmax"}},
      "upcycle.method": "continue"},
     "continue from an MoE checkpoint needs moe with its experts and routing: num_experts=4, "
     "top_k=1"),
])
def test_an_hf_moe_parent_refuses_what_contradicts_it(tmp_path, over, match):
    path, _ = _hf_moe(tmp_path)
    with pytest.raises(ConfigError, match=match) as e:
        cfg_with(path, **over)
    assert "\n" not in str(e.value)
    # continue with its own routing (and a training knob of the child's choosing) is fine
    cfg_with(path, **{"moe": {"num_experts": 4, "top_k": 1, "router": {
        "order": "topk_softmax", "aux_coef": 0.05}}, "upcycle.method": "continue"})

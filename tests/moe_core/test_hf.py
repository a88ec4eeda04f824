"""moe_core.hf against transformers' own Llama (2, 3.1) / Mistral / Qwen2 / Qwen3 / Mixtral /
Qwen2-MoE / Qwen3-MoE code:
tiny random models built with transformers' config classes, saved to a temporary folder."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from moe_core.config import MoEConfig, RopeScaling, RouterConfig
from moe_core.errors import ConfigError
from moe_core.hf import load_dense, load_moe, load_tokenizer, save_moe
from moe_core.hf_config import model_config, moe_config
from moe_core.model import build_model
from moe_core.nn import rope_inv_freq
from moe_core.params import count_params
from moe_core.upcycle import dense_to_moe_state
from tests.hf_util import VOCAB, hf_logits, rel_err, tiny_dense, train_steps

TOL = 1e-5
TOKENS = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))
# (name, tie embeddings): Llama with GQA, Mistral (GQA, sliding window), Qwen2 (q/k/v biases),
# Qwen3 (q/k norms, decoupled head_dim), Llama 3.1 (llama3 RoPE scaling), Phi-3 (fused projections)
ARCHS = [("llama", False), ("mistral", False), ("qwen2", True), ("qwen3", True),
         ("llama31", False), ("phi3", False)]
MOES = {
    "coarse_e8_top2": MoEConfig(num_experts=8, top_k=2, router=RouterConfig(order="topk_softmax")),
    "granular_g2": MoEConfig(num_experts=8, top_k=4, granularity=2,
                             router=RouterConfig(order="topk_softmax")),
    "shared_1": MoEConfig(num_experts=8, top_k=2, num_shared_experts=1,
                          router=RouterConfig(order="topk_softmax")),
    "interleave_2_softmax_topk_renorm": MoEConfig(
        num_experts=4, top_k=2, interleave=2,
        router=RouterConfig(order="softmax_topk", renormalize=True)),
}
EXPECTED_ARCH = {"coarse_e8_top2": "MixtralForCausalLM", "granular_g2": "Qwen2MoeForCausalLM",
                 "shared_1": "Qwen2MoeForCausalLM",
                 "interleave_2_softmax_topk_renorm": "Qwen2MoeForCausalLM"}


def ours(cfg, state, tokens=TOKENS) -> torch.Tensor:
    m = build_model(cfg)
    m.load_state_dict(state)
    m.eval()
    with torch.no_grad():
        return m(tokens).logits


@pytest.fixture(scope="module", params=ARCHS, ids=[a for a, _ in ARCHS])
def dense(request, tmp_path_factory):
    arch, tie = request.param
    path = tiny_dense(arch, tmp_path_factory.mktemp(arch) / "src", tie=tie)
    cfg, state = load_dense(path)
    return arch, path, cfg, state, hf_logits(path, TOKENS)


def test_import_matches_transformers(dense):
    arch, _, cfg, state, ref = dense
    assert cfg.n_kv_heads == 2 and cfg.n_head == 4  # GQA
    assert cfg.qkv_bias == (arch == "qwen2")
    assert cfg.qk_norm == (arch == "qwen3") and cfg.head_dim == (16 if arch == "qwen3" else None)
    assert cfg.rope_theta == (500.0 if arch == "llama31" else 5000.0) and cfg.norm_eps == 1e-5
    assert (cfg.rope_scaling is not None) == (arch == "llama31")
    assert rel_err(ours(cfg, state), ref) < TOL
    # every parameter is counted (GQA, biases, tied embeddings)
    assert count_params(cfg).total == sum(p.numel() for p in build_model(cfg).parameters())


@pytest.mark.parametrize("name", list(MOES))
def test_export_matches_ours_and_the_dense_source(dense, name, tmp_path):
    arch, _, cfg, state, ref = dense
    moe_state, moe_cfg = dense_to_moe_state(state, cfg, MOES[name], seed=0)
    mine = ours(moe_cfg, moe_state)
    if arch == "qwen3" and name == "shared_1":  # q/k norms and a shared expert: no HF MoE
        _refused(r"model\.qk_norm=true \(Qwen3-MoE\) cannot express moe\.num_shared_experts=1",
                 save_moe, moe_state, moe_cfg, tmp_path / "moe")
        return
    written = save_moe(moe_state, moe_cfg, tmp_path / "moe")
    want = {"qwen2": "Qwen2MoeForCausalLM",  # q/k/v biases
            "qwen3": "Qwen3MoeForCausalLM"}.get(arch, EXPECTED_ARCH[name])  # q/k norms
    assert written == want
    assert json.loads((tmp_path / "moe" / "config.json").read_text())["architectures"] == [want]
    theirs = hf_logits(tmp_path / "moe", TOKENS)
    assert rel_err(theirs, mine) < TOL
    assert rel_err(theirs, ref) < TOL  # function preservation, in transformers' MoE code
    cfg2, state2 = load_moe(tmp_path / "moe")  # and back
    assert (cfg2.qk_norm, cfg2.head_dim, cfg2.rope_scaling) == (
        moe_cfg.qk_norm, moe_cfg.head_dim, moe_cfg.rope_scaling)
    assert rel_err(ours(cfg2, state2), mine) < TOL


def test_export_softmax_topk_is_exact_but_not_function_preserving(dense, tmp_path):
    """softmax → top-K without renormalisation: Qwen2-MoE's norm_topk_prob=false is the same
    function (logits match ours), while 004's weight scaling only approximates the dense model
    (random router, not uniform probabilities), so the dense comparison must show a gap."""
    arch, _, cfg, state, ref = dense
    moe = MoEConfig(num_experts=8, top_k=2, router=RouterConfig(order="softmax_topk"))
    moe_state, moe_cfg = dense_to_moe_state(state, cfg, moe, seed=0)
    assert save_moe(moe_state, moe_cfg, tmp_path / "m") == (
        "Qwen3MoeForCausalLM" if arch == "qwen3" else "Qwen2MoeForCausalLM")
    theirs = hf_logits(tmp_path / "m", TOKENS)
    assert rel_err(theirs, ours(moe_cfg, moe_state)) < TOL
    assert rel_err(theirs, ref) > 1e-3


def test_round_trip_after_training(tmp_path):
    """An MoE trained a few steps here exports; transformers' logits match ours and a
    re-import into our model matches too (sharded files, shared expert, tied embeddings)."""
    path = tiny_dense("qwen2", tmp_path / "src", tie=True)
    cfg, state = load_dense(path)
    moe_state, moe_cfg = dense_to_moe_state(
        state, cfg, MoEConfig(num_experts=4, top_k=2, num_shared_experts=2, granularity=2,
                              router=RouterConfig(order="softmax_topk")), seed=0)
    model = build_model(moe_cfg)
    model.load_state_dict(moe_state)
    train_steps(model, torch.optim.AdamW(model.parameters(), lr=1e-2), VOCAB)
    trained = ours(moe_cfg, model.state_dict())
    assert rel_err(trained, ours(moe_cfg, moe_state)) > 1e-3  # it did train
    save_moe(model, None, tmp_path / "out", max_shard_bytes=20_000)
    assert (tmp_path / "out" / "model.safetensors.index.json").is_file()
    assert rel_err(hf_logits(tmp_path / "out", TOKENS), trained) < TOL
    cfg2, state2 = load_moe(tmp_path / "out")
    assert cfg2.moe.num_shared_experts == 2 and cfg2.tie_embeddings
    assert rel_err(ours(cfg2, state2), trained) < TOL


@pytest.mark.parametrize("arch, want", [("qwen2", "LlamaForCausalLM"),
                                        ("qwen3", "Qwen3ForCausalLM")])
def test_dense_export_round_trip(tmp_path, arch, want):
    path = tiny_dense(arch, tmp_path / "src")
    cfg, state = load_dense(path)
    assert save_moe(state, cfg, tmp_path / "out") == want
    ref = ours(cfg, state)
    assert rel_err(hf_logits(tmp_path / "out", TOKENS), ref) < TOL
    cfg2, state2 = load_dense(tmp_path / "out")
    assert cfg2 == dataclasses.replace(cfg, name=cfg2.name)
    assert rel_err(ours(cfg2, state2), ref) < TOL
    other = "llama" if arch == "qwen3" else "qwen3"  # Qwen3's q/k norms cannot be switched off
    _refused(f"arch='{other}' cannot express model.qk_norm={arch == 'qwen3'}", save_moe, state,
             cfg, tmp_path / "o2", arch=other)


@pytest.mark.parametrize("rope", [
    {"rope_type": "linear", "rope_theta": 500.0, "factor": 4.0},
    {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
    {"rope_type": "llama3", "rope_theta": 10.0, "factor": 2.0, "low_freq_factor": 2.0,
     "high_freq_factor": 3.0, "original_max_position_embeddings": 16},
], ids=["linear", "llama3", "llama3_other_bands"])
def test_rope_scaling_equals_transformers(tmp_path, rope):
    """The frequencies equal transformers' own RoPE initialisers, and a checkpoint with the
    scaling gives transformers' logits; by hand for the llama3 test model (head_dim 8, θ 500,
    L 32): wavelength 2π (< L/4) kept, 2π·500^¼ ≈ 29.7 blended, the two longer divided by 8."""
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    path = tiny_dense("llama", tmp_path / "src", rope=rope)
    cfg, state = load_dense(path)
    hf_cfg = transformers.AutoConfig.from_pretrained(str(path))
    theirs, factor = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf_cfg, "cpu")
    mine = rope_inv_freq(8, cfg.rope_theta, cfg.rope_scaling)
    assert factor == 1.0 and torch.allclose(mine, theirs.double(), rtol=1e-6, atol=0)
    assert rel_err(ours(cfg, state), hf_logits(path, TOKENS)) < TOL
    if rope["rope_type"] == "llama3" and rope["rope_theta"] == 500.0:
        inv = 500.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
        s = (32 / (2 * math.pi / inv[1]) - 1) / 3
        want = torch.stack([inv[0], (1 - s) * inv[1] / 8 + s * inv[1], inv[2] / 8, inv[3] / 8])
        assert 0 < s < 1 and torch.allclose(mine, want, rtol=1e-12, atol=0)


QWEN3_06B = {  # the Hub's Qwen/Qwen3-0.6B config.json (transformers 4 format), abridged
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 128,
    "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8,
    "intermediate_size": 3072, "num_hidden_layers": 28, "vocab_size": 151936,
    "rope_theta": 1000000, "rope_scaling": None, "sliding_window": None,
    "use_sliding_window": False, "tie_word_embeddings": True, "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-06, "attention_bias": False, "hidden_act": "silu"}
QWEN3_30B_A3B = {**QWEN3_06B, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                 "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 4,
                 "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
                 "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1,
                 "mlp_only_layers": [], "num_hidden_layers": 48, "tie_word_embeddings": False}
LLAMA32_1B = {  # meta-llama/Llama-3.2-1B, abridged
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
    "intermediate_size": 8192, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_hidden_layers": 16, "vocab_size": 128256, "head_dim": 64, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": True, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
    "hidden_act": "silu", "mlp_bias": False, "attention_bias": False}


def test_hub_configs_give_the_model_cards_parameter_counts():
    """Hub config.json files (transformers 4's ``rope_scaling``/``rope_theta`` format) read
    into configs whose parameter counts are the model cards': Qwen3-0.6B "0.6B, non-embedding
    0.44B", Qwen3-30B-A3B "30.5B in total and 3.3B activated, non-embedding 29.9B",
    Llama-3.2-1B 1,235,814,400."""
    q = model_config(QWEN3_06B)
    assert (q.head_dim, q.qk_norm, q.rope_scaling, q.max_seq_len) == (128, True, None, 40960)
    pc = count_params(q)
    assert (round(pc.total / 1e9, 1), round(pc.non_embedding_total / 1e9, 2)) == (0.6, 0.44)
    moe = model_config(QWEN3_30B_A3B, moe_config(QWEN3_30B_A3B, "Qwen3MoeForCausalLM"))
    assert (moe.moe.num_experts, moe.moe.top_k, moe.moe.expert_d_ff) == (128, 8, 768)
    assert moe.moe.router.renormalize and moe.moe.router.order == "softmax_topk"
    pc = count_params(moe)
    active = pc.non_embedding_active + pc.embedding + pc.lm_head
    # the card truncates to 0.1B: 30.53B, 3.353B (embedding, LM head and the active
    # non-embedding parameters) and 29.91B
    assert (int(pc.total / 1e8), int(active / 1e8), int(pc.non_embedding_total / 1e8)) == (
        305, 33, 299)
    llama = model_config(LLAMA32_1B)
    assert count_params(llama).total == 1_235_814_400 and llama.head_dim is None
    assert llama.rope_scaling == RopeScaling(kind="llama3", factor=32.0,
                                             original_max_position=8192)
    assert llama.rope_theta == 5e5 and llama.tie_embeddings


# ---- refusals: one line each ---------------------------------------------------------------


def _refused(match: str, fn, *args, **kw) -> str:
    with pytest.raises(ConfigError, match=match) as e:
        fn(*args, **kw)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_refuses_an_unsupported_architecture(tmp_path):
    path = tiny_dense("llama", tmp_path / "m")
    hf = json.loads((path / "config.json").read_text())
    hf["architectures"] = ["GPT2LMHeadModel"]
    (path / "config.json").write_text(json.dumps(hf))
    _refused("GPT2LMHeadModel is not supported", load_dense, path)
    hf["architectures"] = ["MixtralForCausalLM"]
    (path / "config.json").write_text(json.dumps(hf))
    _refused("MixtralForCausalLM is a mixture of experts", load_dense, path)


def test_refuses_missing_files(tmp_path):
    _refused("is not a directory", load_dense, tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    _refused("config.json is missing", load_dense, tmp_path / "empty")
    path = tiny_dense("llama", tmp_path / "m")
    (path / "model.safetensors").unlink()
    _refused("has no model.safetensors", load_dense, path)
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}}))
    _refused("model-00001-of-00002.safetensors is missing", load_dense, path)


def test_refuses_a_shape_mismatch_and_a_missing_tensor(tmp_path):
    path = tiny_dense("llama", tmp_path / "m")
    hf = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**hf, "intermediate_size": 48}))
    # the loader runs the dry run's streamed check first (issue #43): HF names, before any load
    _refused(r"tensor 'model\.layers\.0\.mlp\.\w+_proj\.weight' has shape \(\d+, \d+\) but "
             r"config.json implies", load_dense, path)
    (path / "config.json").write_text(json.dumps({**hf, "num_hidden_layers": 3}))
    _refused("no tensor 'model.layers.2", load_dense, path)
    (path / "config.json").write_text(json.dumps({**hf, "rope_parameters": {
        "rope_type": "yarn", "rope_theta": 5e5, "factor": 4.0}}))
    _refused("rope_type='yarn' .* supported: default, linear, llama3", load_dense, path)
    (path / "config.json").write_text(json.dumps({**hf, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}}))
    _refused("rope_type='llama3' needs low_freq_factor", load_dense, path)
    (path / "config.json").write_text(json.dumps({**hf, "rope_parameters": {
        "rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.75}}))
    _refused("partial_rotary_factor=0.75 .* RoPE rotates whole heads", load_dense, path)


@pytest.mark.parametrize("moe, match", [
    (MoEConfig(num_experts=4, top_k=2, router=RouterConfig(logit_norm_lambda=1.0)),
     "logit_norm_lambda=1.0 .* has no Hugging Face form"),
    (MoEConfig(num_experts=4, top_k=2, router=RouterConfig(loss_free_rate=1e-3)),
     "loss_free_rate=0.001 .* has no Hugging Face form"),
    (MoEConfig(num_experts=4, top_k=2, capacity_factor=1.25),
     "capacity_factor=1.25 drops tokens"),
])
def test_refuses_configs_with_no_exact_hf_form(tmp_path, moe, match):
    path = tiny_dense("llama", tmp_path / "m")
    cfg, state = load_dense(path)
    moe_state, moe_cfg = dense_to_moe_state(state, cfg, moe, seed=0)
    _refused(match, save_moe, moe_state, moe_cfg, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_refuses_a_selection_bias_and_what_mixtral_cannot_express(tmp_path):
    path = tiny_dense("llama", tmp_path / "m")
    cfg, state = load_dense(path)
    moe = MoEConfig(num_experts=4, top_k=2, interleave=2,
                    router=RouterConfig(order="topk_softmax"))
    moe_state, moe_cfg = dense_to_moe_state(state, cfg, moe, seed=0)
    _refused("arch='mixtral' cannot express moe.interleave=2", save_moe, moe_state, moe_cfg,
             tmp_path / "out", arch="mixtral")
    _refused("arch='qwen3_moe' cannot express model.qk_norm=false", save_moe, moe_state,
             moe_cfg, tmp_path / "out", arch="qwen3_moe")
    q_cfg, q_state = load_dense(tiny_dense("qwen3", tmp_path / "q"))
    coarse = MoEConfig(num_experts=4, top_k=2, router=RouterConfig(order="topk_softmax"))
    q_moe_state, q_moe_cfg = dense_to_moe_state(q_state, q_cfg, coarse, seed=0)
    for arch in ("mixtral", "qwen2_moe"):
        _refused(f"arch='{arch}' cannot express model.qk_norm=true", save_moe, q_moe_state,
                 q_moe_cfg, tmp_path / "out", arch=arch)
    moe_state["blocks.1.mlp.expert_bias"][0] = 0.25
    _refused("blocks.1.mlp.expert_bias is nonzero", save_moe, moe_state, moe_cfg,
             tmp_path / "out")


def test_cli_upcycle_prints_the_measured_error(tmp_path, capsys):
    from moe_core.hf.__main__ import main

    path = tiny_dense("mistral", tmp_path / "src")
    assert main(["upcycle", str(path), str(tmp_path / "out"), "--experts", "8", "--top-k", "2",
                 "--batches", "2", "--seq-len", "16"]) == 0
    out = capsys.readouterr().out
    res = json.loads(out.strip().splitlines()[-1])
    assert res["architecture"] == "MixtralForCausalLM" and "our MoE vs our dense" in out
    assert res["moe_vs_dense"] < TOL and res["transformers_vs_dense"] < TOL
    assert main(["upcycle", str(path), str(tmp_path / "o2"), "--experts", "8", "--top-k", "2",
                 "--shared", "1", "--arch", "mixtral", "--no-verify"]) == 2
    assert "Mixtral has no shared expert" in capsys.readouterr().err


def test_cli_upcycle_grows_an_hf_moe(tmp_path, capsys):
    """An MoE source (a top-1 Mixtral) grows 4 → 8 experts (003 Def. 3.1, exact at top-1):
    our model and transformers' load of the result equal the source's logits; an expert
    count that is not a multiple, or another top-K, is one error line, exit 2."""
    from moe_core.hf.__main__ import main

    cfg, state = load_dense(tiny_dense("llama", tmp_path / "src"))
    moe = MoEConfig(num_experts=4, top_k=1, router=RouterConfig(order="topk_softmax"))
    moe_state, moe_cfg = dense_to_moe_state(state, cfg, moe, seed=0)
    moe_state = {k: v + 0.01 * torch.randn_like(v) if ".mlp.w_" in k else v
                 for k, v in moe_state.items()}  # experts that differ
    assert save_moe(moe_state, moe_cfg, tmp_path / "mixtral") == "MixtralForCausalLM"
    assert main(["upcycle", str(tmp_path / "mixtral"), str(tmp_path / "out"), "--experts", "8",
                 "--top-k", "1", "--batches", "2", "--seq-len", "16"]) == 0
    out = capsys.readouterr().out
    res = json.loads(out.strip().splitlines()[-1])
    assert res["architecture"] == "MixtralForCausalLM" and res["source_experts"] == 4
    assert res["moe_vs_source"] < TOL and res["transformers_vs_source"] < TOL
    cfg8, _ = load_moe(tmp_path / "out")
    assert cfg8.moe.num_experts == 8 and cfg8.moe.top_k == 1
    for argv, err in [(["--experts", "6", "--top-k", "1"], "give a multiple of them"),
                      (["--experts", "8", "--top-k", "2"], "expert upcycling keeps top-K")]:
        assert main(["upcycle", str(tmp_path / "mixtral"), str(tmp_path / "o2"), *argv,
                     "--no-verify"]) == 2
        assert err in capsys.readouterr().err


def test_cli_export_writes_a_training_checkpoint(tmp_path, capsys):
    """``export`` turns a Trainer checkpoint into an HF folder that transformers reads with our
    logits; a folder that is not a checkpoint is one error line, exit 2."""
    from moe_core.hf.__main__ import main
    from moe_core.train import Trainer, train_config_from_dict

    cfg = train_config_from_dict({
        "name": "x", "seed": 0, "model": {"preset": "debug"},
        "moe": {"num_experts": 4, "top_k": 2, "router": {"order": "softmax_topk",
                                                          "renormalize": True}},
        "data": {"source": "synthetic", "synthetic_vocab": 32, "synthetic_tokens": 20_000,
                 "seq_len": 32, "cache_dir": str(tmp_path / "cache")},
        "batch": {"global_batch": 4, "micro_batch": 4}, "optim": {"lr": 3e-3},
        "eval": {"every_steps": 2, "batches": 1}, "tokens": 2 * 4 * 32})
    t = Trainer(cfg, out_dir=tmp_path / "ck", checkpoint_steps=[2])
    t.fit()
    assert main(["export", str(tmp_path / "ck" / "step_00000002"), str(tmp_path / "hf"),
                 "--batches", "2", "--seq-len", "16"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["architecture"] == "MixtralForCausalLM" and res["step"] == 2
    assert res["ranks"] == 1 and res["transformers_vs_ours"] < TOL
    _, state = load_moe(tmp_path / "hf")
    for k, v in state.items():
        assert torch.equal(v, t.model.state_dict()[k]), k
    assert main(["export", str(tmp_path / "cache"), str(tmp_path / "no")]) == 2
    assert "is not a checkpoint" in capsys.readouterr().err


def test_tokenizer_loads_through_tokenizers(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tiny_dense("llama", tmp_path / "m")
    _refused("tokenizer.json is missing", load_tokenizer, path)
    tok.save(str(path / "tokenizer.json"))
    assert load_tokenizer(path).encode("hello world again").ids == [1, 2, 0]


def _tree(root):
    """Every file under ``root`` with its bytes (hidden ones included)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_cli_upcycle_never_destroys_what_it_did_not_write(tmp_path, capsys):
    """#32: an existing OUT folder, OUT = SRC, OUT inside SRC, OUT a file and OUT a symlink are
    refused in one line before any work, exit 2, nothing touched; --overwrite replaces only a
    folder this project wrote, and says so."""
    from moe_core.hf.__main__ import main
    from moe_core.outdir import MARKER as WRITER_MARK

    src = tiny_dense("llama", tmp_path / "src")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    afile = tmp_path / "afile"
    afile.write_text("data")
    (tmp_path / "link").symlink_to(mine)
    before = _tree(tmp_path)
    capsys.readouterr()
    up = ["--experts", "4", "--top-k", "2", "--batches", "1", "--seq-len", "8", "--no-verify"]
    cases = [(mine, "exists and is not empty"), (src, "is the source"),
             (src / "sub", "is inside the source"), (afile, "is a file"),
             (tmp_path / "link", "is a symlink"), (tmp_path, "holds the source")]
    for out, msg in cases:
        for extra in ([], ["--overwrite"]):
            assert main(["upcycle", str(src), str(out), *up, *extra]) == 2, (out, extra)
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and "nothing was written" in err, err
            assert msg in err or "was not written by this project" in err, err
    assert _tree(tmp_path) == before  # nothing deleted, renamed, hidden or added
    assert not list(tmp_path.glob(".old-*")) and not list(tmp_path.glob(".tmp-*"))

    out = tmp_path / "moe"
    assert main(["upcycle", str(src), str(out), *up]) == 0
    assert (out / WRITER_MARK).is_file() and "replacing" not in capsys.readouterr().out
    assert main(["upcycle", str(src), str(out), *up]) == 2  # ours, but no --overwrite
    assert "--overwrite" in capsys.readouterr().err
    assert main(["upcycle", str(src), str(out), *up, "--overwrite"]) == 0
    assert f"replacing {out}, written by moe_core.hf.save_moe" in capsys.readouterr().out
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["upcycle", str(src), str(empty), *up]) == 0  # an empty folder is fine
    assert _tree(src) == {k[len("src/"):]: v for k, v in before.items() if k.startswith("src/")}

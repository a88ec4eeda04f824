"""Exact parameter counts: 000 Table 3 and sum(p.numel()) of built models."""

import pytest

from moe_core import build_model
from moe_core.config import ModelConfig, MoEConfig
from moe_core.params import count_params
from moe_core.presets import PRESETS, model_config

# 000 Table 3: N_dense and N_MoE^total (8 experts), non-embedding, counting norms and routers.
TABLE3 = {
    "15M": (14_751_680, 92_189_120),
    "44M": (44_248_800, 276_538_080),
    "0.1B": (98_323_840, 614_496_640),
    "0.2B": (232_623_040, 1_453_845_952),
    "0.5B": (521_889_760, 3_261_732_320),
    "1B": (1_085_859_424, 6_786_500_704),
}


@pytest.mark.parametrize("name", list(TABLE3))
def test_table3_counts(name):
    dense, moe8 = TABLE3[name]
    assert count_params(model_config(name, vocab_size=50_000)).non_embedding_total == dense
    cfg = model_config(name, vocab_size=50_000, moe=MoEConfig(num_experts=8, top_k=2))
    assert count_params(cfg).non_embedding_total == moe8


def test_table3_shapes_match_presets():
    p = PRESETS["0.1B"]
    assert (p.n_layer, p.d_model, p.n_head, p.init_std) == (15, 640, 8, 0.025)


def _built_counts(cfg: ModelConfig) -> tuple[int, int]:
    model = build_model(cfg)
    total = sum(p.numel() for p in model.parameters())
    emb = model.tok_emb.weight.numel() + model.lm_head.weight.numel()
    return total, total - emb


CASES = {
    "dense": None,
    "moe": MoEConfig(num_experts=4, top_k=2),
    "granular": MoEConfig(num_experts=16, top_k=4, granularity=4),
    "shared": MoEConfig(num_experts=4, top_k=1, num_shared_experts=2),
    "interleaved": MoEConfig(num_experts=4, top_k=2, interleave=2),
    "expert_d_ff": MoEConfig(num_experts=6, top_k=3, expert_d_ff=40),
}


@pytest.mark.parametrize("case", list(CASES))
def test_count_matches_built_model(case):
    cfg = model_config("debug", vocab_size=97, moe=CASES[case])
    total, non_emb = _built_counts(cfg)
    pc = count_params(cfg)
    assert pc.total == total
    assert pc.non_embedding_total == non_emb


def test_active_counts_by_hand():
    # debug: 2 layers, d=64, d_ff=256. Interleave 2 -> layer 1 is MoE, layer 0 dense.
    cfg = model_config("debug", vocab_size=10, moe=MoEConfig(num_experts=4, top_k=2, interleave=2))
    d, f = 64, 256
    per_block = 4 * d * d + 2 * d
    dense_layer = per_block + 3 * d * f
    moe_active = per_block + 4 * d + 2 * 3 * d * f
    moe_total = per_block + 4 * d + 4 * 3 * d * f
    pc = count_params(cfg)
    assert pc.non_embedding_active == d + dense_layer + moe_active
    assert pc.non_embedding_total == d + dense_layer + moe_total
    assert pc.num_moe_layers == 1
    assert pc.sparsity == pytest.approx(pc.non_embedding_total / pc.non_embedding_active)


def test_granular_active_equals_coarse_active_when_iso_flop():
    # E8G1T2 vs E8G8T16 (64 experts of d_ff/8, top-16): same active parameters, bar the router.
    coarse = model_config("debug", vocab_size=10, moe=MoEConfig(num_experts=8, top_k=2))
    fine = model_config(
        "debug", vocab_size=10, moe=MoEConfig(num_experts=64, top_k=16, granularity=8)
    )
    d, L = 64, 2
    diff = count_params(fine).non_embedding_active - count_params(coarse).non_embedding_active
    assert diff == L * (64 - 8) * d

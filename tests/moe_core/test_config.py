"""Every validation rule of the model/MoE/router configs, with its message."""

import pytest

from moe_core.config import (
    ModelConfig,
    MoEConfig,
    RopeScaling,
    RouterConfig,
    model_config_from_dict,
    moe_config_from_dict,
)
from moe_core.errors import ConfigError
from moe_core.presets import model_config


def test_defaults_construct():
    cfg = MoEConfig(
        num_experts=8, top_k=2, granularity=1, router=RouterConfig(order="topk_softmax")
    )
    assert cfg.router.order == "topk_softmax"
    assert cfg.capacity_factor is None


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(order="topk"), r"router\.order='topk'"),
        (dict(aux_loss="l2"), r"router\.aux_loss='l2'"),
        (dict(logit_norm_lambda=0.0), r"router\.logit_norm_lambda=0\.0 must be > 0"),
        (dict(aux_coef=-1.0), r"router\.aux_coef=-1\.0 must be a finite value >= 0"),
        (dict(z_loss_coef=float("nan")), r"router\.z_loss_coef=nan"),
        (dict(loss_free_rate=-0.1), r"router\.loss_free_rate"),
        (dict(adaptive_xi=0.0), r"router\.adaptive_xi"),
        (dict(adaptive_alpha_max=0.0), r"router\.adaptive_alpha_max"),
        (dict(adaptive_beta=1.0), r"router\.adaptive_beta=1\.0 must lie in \[0, 1\)"),
        (dict(init_std=0.0), r"router\.init_std"),
    ],
)
def test_router_rules(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        RouterConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_experts=0), r"moe\.num_experts=0 must be >= 1"),
        (dict(top_k=0), r"moe\.top_k=0 must be >= 1"),
        (dict(num_experts=8, top_k=16), r"moe\.top_k=16 exceeds moe\.num_experts=8; lower top_k"),
        (dict(granularity=0), r"moe\.granularity=0"),
        (dict(expert_d_ff=0), r"moe\.expert_d_ff=0"),
        (dict(num_shared_experts=-1), r"moe\.num_shared_experts=-1"),
        (dict(capacity_factor=0.0), r"moe\.capacity_factor=0\.0 must be > 0, or null"),
        (dict(interleave=0), r"moe\.interleave=0"),
        (dict(router={"order": "x"}), r"moe\.router must be a mapping"),
    ],
)
def test_moe_rules(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        MoEConfig(**kwargs)


def test_granularity_must_divide_d_ff():
    with pytest.raises(ConfigError, match=r"moe\.granularity=3 does not divide model\.d_ff=256"):
        model_config("debug", vocab_size=10, moe=MoEConfig(num_experts=6, top_k=3, granularity=3))


def test_interleave_beyond_layers():
    with pytest.raises(ConfigError, match=r"moe\.interleave=3 exceeds model\.n_layer=2"):
        model_config("debug", vocab_size=10, moe=MoEConfig(interleave=3))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(vocab_size=0), r"model\.vocab_size=0"),
        (dict(n_head=5), r"model\.n_head=5 does not divide model\.d_model=64"),
        (dict(n_head=64), r"must be even for RoPE"),
        (dict(d_ff=0), r"model\.d_ff=0"),
        (dict(init_std=0.0), r"model\.init_std"),
        (dict(n_layer=1.5), r"model\.n_layer=1\.5 must be an integer"),
        (dict(head_dim=7), r"model\.head_dim=7 must be an even integer >= 2"),
        (dict(n_head=5, head_dim=0), r"model\.head_dim=0 must be an even integer"),
        (dict(rope_scaling={"kind": "linear"}), r"model\.rope_scaling must be a RopeScaling"),
    ],
)
def test_model_rules(kwargs, match):
    base = dict(vocab_size=10, n_layer=2, d_model=64, n_head=4)
    base.update(kwargs)
    with pytest.raises(ConfigError, match=match):
        ModelConfig(**base)


def test_unknown_preset():
    with pytest.raises(ConfigError, match=r"model\.preset='2B' is not known"):
        model_config("2B", vocab_size=10)


def test_from_dict_rejects_unknown_keys_and_nests():
    m = moe_config_from_dict({"num_experts": 4, "top_k": 1, "router": {"order": "topk_softmax"}})
    assert m.router.order == "topk_softmax"
    with pytest.raises(ConfigError, match=r"unknown key moe\.router\.ordr; known keys under "
                                          r"moe\.router: adaptive_alpha_max"):
        moe_config_from_dict({"router": {"ordr": "x"}})
    with pytest.raises(ConfigError, match=r"unknown key model\.layers"):
        model_config_from_dict({"vocab_size": 5, "n_layer": 1, "d_model": 8, "n_head": 2,
                                "layers": 3})
    cfg = model_config_from_dict({"vocab_size": 5, "n_layer": 1, "d_model": 8, "n_head": 2,
                                  "moe": {"num_experts": 2, "top_k": 1}})
    assert cfg.moe.num_experts == 2


def test_decoupled_head_dim_and_rope_scaling_from_a_mapping():
    cfg = model_config_from_dict({"vocab_size": 5, "n_layer": 1, "d_model": 8, "n_head": 3,
                                  "head_dim": 4, "qk_norm": True,
                                  "rope_scaling": {"kind": "llama3", "factor": 8}})
    assert (cfg.resolved_head_dim, cfg.qkv_dim) == (4, 36)  # 3 q + 3 k + 3 v heads of 4
    assert cfg.rope_scaling == RopeScaling(kind="llama3", factor=8.0)
    assert model_config_from_dict({"vocab_size": 5, "n_layer": 1, "d_model": 8,
                                   "n_head": 2}).resolved_head_dim == 4


@pytest.mark.parametrize("kwargs, match", [
    (dict(kind="yarn", factor=2.0), r"model\.rope_scaling\.kind='yarn' must be one of linear, "
                                    r"llama3"),
    (dict(kind="llama3", factor=8.0, low_freq_factor=4.0),
     r"need 0 < low_freq_factor=4\.0 < high_freq_factor=4\.0"),
    (dict(kind="linear", factor=0.0), r"model\.rope_scaling\.factor=0\.0 must be > 0"),
])
def test_rope_scaling_rules(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        RopeScaling(**kwargs)

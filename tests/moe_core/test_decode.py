"""The generic decoder ``moe_core.config.from_mapping``: nested mappings into config dataclasses."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pytest

from moe_core.config import (
    ModelConfig,
    MoEConfig,
    RouterConfig,
    from_mapping,
    model_config_from_dict,
    router_config_from_dict,
)
from moe_core.errors import ConfigError
from moe_core.presets import model_config
from moe_core.train.config import OptimConfig, TrainConfig, train_config_from_dict


@dataclass(frozen=True, kw_only=True)
class Leaf:
    mode: Literal["a", "b"] = "a"
    level: Literal[1, 2, 3] = 1
    rate: float = 0.5
    count: int = 1
    label: str = "x"
    flag: bool = False


@dataclass(frozen=True, kw_only=True)
class Mid:
    leaf: Leaf = field(default_factory=Leaf)
    maybe: Leaf | None = None
    sizes: tuple[int, ...] = ()
    pair: tuple[float, float] = (0.0, 1.0)
    limit: int | None = None


@dataclass(frozen=True, kw_only=True)
class Top:
    required: int
    mid: Mid = field(default_factory=Mid)


def test_nested_mappings_recurse_and_instances_pass_through():
    top = from_mapping(Top, {"required": 1, "mid": {"leaf": {"count": 4}}})
    assert top == Top(required=1, mid=Mid(leaf=Leaf(count=4)))
    leaf = Leaf(mode="b")
    assert from_mapping(Top, {"required": 1, "mid": {"leaf": leaf}}).mid.leaf is leaf
    mid = Mid(limit=3)
    assert from_mapping(Top, {"required": 1, "mid": mid}).mid is mid
    assert from_mapping(Top, top) is top


def test_optional_fields():
    assert from_mapping(Mid, {"maybe": None, "limit": None}) == Mid()
    assert from_mapping(Mid, {"maybe": {"rate": "2"}}).maybe == Leaf(rate=2)
    assert from_mapping(Mid, {"limit": "7"}).limit == 7
    cfg = train_config_from_dict({"moe": {"num_experts": 4, "top_k": 1}})
    assert cfg.moe == MoEConfig(num_experts=4, top_k=1)
    assert train_config_from_dict({"moe": None}).moe is None
    with pytest.raises(ConfigError, match=r"^moe must be a mapping, got int$"):
        train_config_from_dict({"moe": 3})


def test_tuples_from_lists_with_coerced_elements():
    mid = from_mapping(Mid, {"sizes": [1, "2", "3e1"], "pair": ["1e-4", 2]})
    assert mid.sizes == (1, 2, 30.0) and isinstance(mid.sizes, tuple)
    assert mid.pair == (1e-4, 2) and isinstance(mid.pair[0], float)
    assert from_mapping(Mid, {"pair": (0.5, 0.25)}).pair == (0.5, 0.25)
    assert train_config_from_dict({"optim": {"betas": ["0.8", 0.9]}}).optim.betas == (0.8, 0.9)
    with pytest.raises(ConfigError, match=r"^mid\.pair=\[1\.0\] must be a list of 2 values$"):
        from_mapping(Top, {"required": 1, "mid": {"pair": [1.0]}})
    with pytest.raises(ConfigError, match=r"^mid\.sizes\[1\]='x' must be an integer$"):
        from_mapping(Top, {"required": 1, "mid": {"sizes": [1, "x"]}})
    with pytest.raises(ConfigError, match=r"^pair=3 must be a list of 2 values$"):
        from_mapping(Mid, {"pair": 3})
    # a dataclass's own rule keeps its message
    with pytest.raises(ConfigError, match=r"optim\.betas=\[0\.9\] must be two numbers in \[0, 1\)"):
        train_config_from_dict({"optim": {"betas": [0.9]}})


def test_literals():
    leaf = from_mapping(Leaf, {"mode": "b", "level": "2"})
    assert leaf.mode == "b" and leaf.level == 2
    with pytest.raises(ConfigError, match=r"^mode='c' must be one of 'a', 'b'$"):
        from_mapping(Leaf, {"mode": "c"})
    with pytest.raises(ConfigError, match=r"^level=4 must be one of 1, 2, 3$"):
        from_mapping(Leaf, {"level": 4})
    # a string-only Literal does not coerce; __post_init__ messages come first
    assert router_config_from_dict({"order": "topk_softmax"}).order == "topk_softmax"
    with pytest.raises(ConfigError, match=r"^router\.order='1' is not known; use 'softmax_topk'"):
        router_config_from_dict({"order": "1"})


def test_yaml_number_coercion():
    leaf = from_mapping(Leaf, {"rate": "1e-4", "count": "3", "label": "123"})
    assert leaf.rate == 1e-4 and type(leaf.rate) is float
    assert leaf.count == 3 and type(leaf.count) is int
    assert leaf.label == "123"  # a str field keeps its string
    assert type(from_mapping(Leaf, {"rate": "2.0"}).rate) is float
    assert type(from_mapping(Leaf, {"rate": 2}).rate) is int  # ints are accepted for floats
    assert type(from_mapping(Leaf, {"count": "1e3"}).count) is float  # integral: accepted as-is
    assert from_mapping(Leaf, {"count": np.int64(5)}).count == 5  # Ray/numpy samples
    cfg = train_config_from_dict({"optim": {"lr": "1e-4", "eps": "1e-8"}, "tokens": "4096"})
    assert cfg.optim.lr == 1e-4 and cfg.optim.eps == 1e-8 and cfg.tokens == 4096
    assert type(cfg.tokens) is int


def test_wrong_scalar_types_name_the_key():
    with pytest.raises(ConfigError, match=r"^optim\.lr='fast' must be a number$"):
        train_config_from_dict({"optim": {"lr": "fast"}})
    with pytest.raises(ConfigError, match=r"^moe\.top_k=1\.5 must be an integer$"):
        train_config_from_dict({"moe": {"top_k": 1.5}})
    with pytest.raises(ConfigError, match=r"^count=\[1\] must be an integer$"):
        from_mapping(Leaf, {"count": [1]})
    with pytest.raises(ConfigError, match=r"^limit='x' must be an integer or null$"):
        from_mapping(Mid, {"limit": "x"})
    # where the dataclass checks the type itself, its message stands
    with pytest.raises(ConfigError, match=r"^model\.n_layer=1\.5 must be an integer >= 1$"):
        model_config_from_dict({"vocab_size": 5, "n_layer": 1.5, "d_model": 8, "n_head": 2})


def test_unknown_key_is_named_by_its_full_dotted_path():
    raw = {"moe": {"num_experts": 4, "top_k": 2},
           "parent": {"tokens": 10, "moe": {"router": {"ordr": "x"}}}}
    with pytest.raises(ConfigError) as e:
        train_config_from_dict(raw)
    known = ", ".join(sorted(f.name for f in dataclasses.fields(RouterConfig)))
    assert str(e.value) == (
        f"unknown key parent.moe.router.ordr; known keys under parent.moe.router: {known}"
    )
    with pytest.raises(ConfigError, match=r"^unknown key optim\.foo; known keys under optim: "
                                          r"betas, bf16_mode, dtype, eps"):
        train_config_from_dict({"optim": {"foo": 1}})
    with pytest.raises(ConfigError, match=r"^unknown key modle; known keys at the top level: "):
        train_config_from_dict({"modle": {}})
    with pytest.raises(ConfigError, match=r"^unknown key mid\.leaf\.colour; known keys under "
                                          r"mid\.leaf: count, flag, label, level, mode, rate$"):
        from_mapping(Top, {"required": 1, "mid": {"leaf": {"colour": 1}}})


def test_missing_required_field():
    with pytest.raises(ConfigError, match=r"^missing required key required$"):
        from_mapping(Top, {"mid": {}})
    with pytest.raises(ConfigError, match=r"^missing required key parent\.tokens "
                                          r"\(or give parent\.from_pretrained\)$"):
        train_config_from_dict({"parent": {"lr": 1e-3}})
    with pytest.raises(ConfigError, match=r"^missing required key model\.n_head$"):
        model_config_from_dict({"vocab_size": 5, "n_layer": 1, "d_model": 8})


def test_non_mapping_where_a_mapping_is_required():
    with pytest.raises(ConfigError, match=r"^optim must be a mapping, got list$"):
        train_config_from_dict({"optim": [1, 2]})
    with pytest.raises(ConfigError, match=r"^parent\.moe\.router must be a mapping, got list$"):
        train_config_from_dict({"parent": {"tokens": 1, "moe": {"router": ["x"]}}})
    with pytest.raises(ConfigError, match=r"^the config must be a mapping, got list$"):
        train_config_from_dict([1])
    with pytest.raises(ConfigError, match=r"^mid\.leaf must be a mapping, got RouterConfig$"):
        from_mapping(Top, {"required": 1, "mid": {"leaf": RouterConfig()}})


def _upcycled() -> TrainConfig:
    return train_config_from_dict({
        "name": "rt", "seed": 3,
        "moe": {"num_experts": 8, "top_k": 2, "granularity": 2,
                "router": {"order": "topk_softmax", "aux_coef": "1e-2", "logit_norm_lambda": 2}},
        "data": {"source": "synthetic", "synthetic_vocab": 32, "seq_len": 32},
        "optim": {"lr": "1e-3", "betas": [0.9, 0.99]},
        "schedule": {"kind": "cosine", "warmup_steps": 2},
        "batch": {"global_batch": 8, "micro_batch": 4},
        "tokens": 4096,
        "parent": {"tokens": 2048, "moe": {"num_experts": 4, "top_k": 2, "granularity": 2},
                   "schedule": {"kind": "wsd"}, "batch": {"global_batch": 4, "micro_batch": 4}},
        "upcycle": {"method": "expand_experts", "lr_policy": {"policy": "ratio", "ratio": 0.5}},
    })


def test_train_config_round_trips_through_asdict():
    cfg = _upcycled()
    assert cfg.moe.router.aux_coef == 1e-2 and cfg.parent.moe.num_experts == 4
    assert train_config_from_dict(dataclasses.asdict(cfg)) == cfg
    assert train_config_from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg  # lists
    dense = train_config_from_dict({})
    assert train_config_from_dict(dataclasses.asdict(dense)) == dense == TrainConfig()


def test_model_config_round_trips_through_asdict():
    cfg = _upcycled()
    for mc in (cfg.model_config(), cfg.model_config(moe="parent"), cfg.model_config(moe=None),
               model_config("debug", vocab_size=64,
                            moe=MoEConfig(num_experts=4, top_k=1, capacity_factor=1.25,
                                          router=RouterConfig(renormalize=True)))):
        back = model_config_from_dict(dataclasses.asdict(mc))
        assert back == mc and isinstance(back, ModelConfig)
        assert model_config_from_dict(json.loads(json.dumps(dataclasses.asdict(mc)))) == mc
    assert cfg.model_config().moe is not None


def test_optim_config_decodes_alone():
    assert from_mapping(OptimConfig, {"lr": "3e-4"}, "optim") == OptimConfig(lr=3e-4)


def test_numbers_are_finite_int64_and_never_bools():
    """true is not 1, NaN and inf are no numbers, integers fit int64: refused before a
    dataclass's own rules, which would take them (``moe.num_experts: true`` made E = 1)."""
    with pytest.raises(ConfigError, match=r"^count=True is true/false, not a number; use an "
                                          r"integer$"):
        from_mapping(Leaf, {"count": True})
    with pytest.raises(ConfigError, match=r"^moe\.num_experts=True is true/false"):
        train_config_from_dict({"moe": {"num_experts": True, "top_k": 1}})
    with pytest.raises(ConfigError, match=r"^rate=nan is not finite; use a number$"):
        from_mapping(Leaf, {"rate": float("nan")})
    with pytest.raises(ConfigError, match=r"^tokens=inf is not finite; use an integer$"):
        train_config_from_dict({"tokens": "inf"})
    with pytest.raises(ConfigError, match=r"^tokens=1e\+30 is out of range"):
        train_config_from_dict({"tokens": 1e30})
    with pytest.raises(ConfigError, match=r"^limit=9223372036854775808 is out of range"):
        from_mapping(Mid, {"limit": 2**63})
    assert from_mapping(Mid, {"limit": 2**63 - 1}).limit == 2**63 - 1
    assert from_mapping(Leaf, {"rate": 1e300}).rate == 1e300  # floats: finite is enough
    with pytest.raises(ConfigError, match=r"^pair\[1\]=inf is not finite"):
        from_mapping(Mid, {"pair": [0.5, float("inf")]})
    with pytest.raises(ConfigError, match=r"^level=True is true/false, not a number; use one "
                                          r"of 1, 2, 3$"):
        from_mapping(Leaf, {"level": True})


def test_bool_and_string_fields_are_strict():
    with pytest.raises(ConfigError, match=r"^flag='maybe' must be true or false$"):
        from_mapping(Leaf, {"flag": "maybe"})
    with pytest.raises(ConfigError, match=r"^flag=1 must be true or false$"):
        from_mapping(Leaf, {"flag": 1})
    with pytest.raises(ConfigError, match=r"^label=None must be a string$"):
        from_mapping(Leaf, {"label": None})
    assert from_mapping(Leaf, {"label": 123}).label == 123  # taken as YAML typed it


def test_messages_show_at_most_200_characters_of_a_value():
    with pytest.raises(ConfigError) as e:
        from_mapping(Leaf, {"count": "x" * 10**6})
    assert len(str(e.value)) < 300 and "(1,000,002 characters)" in str(e.value)

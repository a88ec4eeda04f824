"""The search-space family (``sweeps.spec.space``): each distribution's YAML form, its Ray Tune
form, its corners (what validation builds a trial config for), and the grid a space spans."""

from __future__ import annotations

import pytest
from ray import tune
from ray.tune.search.sample import Categorical, Float, Integer, LogUniform, Uniform

from moe_core.errors import SearchSpaceError
from moe_core.train.config import TrainConfig
from sweeps.spec.space import (
    Choice,
    Expr,
    Grid,
    IntRange,
    SearchSpace,
    parse_param,
)
from sweeps.spec.space import LogUniform as LogU
from sweeps.spec.space import Uniform as Uni


def _p(key, raw):
    return parse_param(key, raw, TrainConfig)


def test_each_kind_parses_to_its_class_with_the_old_attributes():
    cases = [
        ("optim.lr", {"grid": [1, "1e-3"]}, Grid, "grid", (1, 1e-3)),
        ("optim.lr", [1e-3, 2e-3], Grid, "grid", (1e-3, 2e-3)),  # a list is a grid
        ("moe.top_k", {"choice": [1, 2]}, Choice, "choice", (1, 2)),
        ("optim.lr", {"uniform": [0, 1]}, Uni, "uniform", (0, 1)),
        ("optim.lr", {"loguniform": ["1e-4", 1e-2]}, LogU, "loguniform", (1e-4, 1e-2)),
        ("moe.top_k", {"int": [1, 4.0]}, IntRange, "int", (1, 4.0)),
    ]
    for key, raw, cls, kind, values in cases:
        p = _p(key, raw)
        assert type(p) is cls and p.kind == kind and p.values == values and p.expr is None
    e = _p("moe.num_experts", {"expr": "8 * moe.granularity", "when": {"moe.granularity": 2}})
    assert type(e) is Expr and e.kind == "expr" and e.values == () and \
        e.expr == "8 * moe.granularity" and e.when == (("moe.granularity", (2,)),)
    assert e.applies({"moe": {"granularity": 2}}) and not e.applies({"moe": {"granularity": 1}})


def test_tune_forms():
    g = _p("optim.lr", {"grid": [1, 2]}).tune()
    assert g == tune.grid_search([1, 2])
    c = _p("moe.top_k", {"choice": [1, 2]}).tune()
    assert isinstance(c, Categorical) and c.categories == [1, 2]
    u = _p("optim.lr", {"uniform": [0.1, 0.2]}).tune()
    assert isinstance(u, Float) and isinstance(u.get_sampler(), Uniform) and \
        (u.lower, u.upper) == (0.1, 0.2)
    lu = _p("optim.lr", {"loguniform": [1e-4, 1e-2]}).tune()
    assert isinstance(lu, Float) and isinstance(lu.get_sampler(), LogUniform) and \
        (lu.lower, lu.upper) == (1e-4, 1e-2)
    i = _p("moe.top_k", {"int": [1, 4]}).tune()  # both bounds drawn: randint's upper excluded
    assert isinstance(i, Integer) and (i.lower, i.upper) == (1, 5)
    assert _p("moe.top_k", {"expr": "1 + 1"}).tune() is None


def test_corners():
    assert _p("optim.lr", {"grid": [1, 2, 3]}).corners() == (1, 2, 3)
    assert _p("moe.top_k", {"choice": [1, 2]}).corners() == (1, 2)
    assert _p("optim.lr", {"uniform": [0.1, 0.2]}).corners() == (0.1, 0.2)
    assert _p("optim.lr", {"loguniform": [1e-4, 1e-2]}).corners() == (1e-4, 1e-2)
    c = _p("moe.top_k", {"int": [1.0, 4.0]}).corners()
    assert c == (1, 4) and all(type(x) is int for x in c)
    assert _p("moe.top_k", {"expr": "2"}).corners() == ()


@pytest.mark.parametrize("key, raw, match", [
    ("optim.lr", {"grid": []}, r"^search\.optim\.lr\.grid must be a non-empty list of values$"),
    ("optim.lr", {"choice": 3}, r"^search\.optim\.lr\.choice must be a non-empty list"),
    ("optim.lr", {"uniform": [1]}, r"^search\.optim\.lr\.uniform must be \[low, high\]$"),
    ("optim.lr", {"uniform": [1, "x"]}, r"uniform=\[1, 'x'\] must be two numbers"),
    ("optim.lr", {"uniform": [2, 1]}, r"uniform: low=2 must be < high=1"),
    ("optim.lr", {"loguniform": [0, 1]}, r"loguniform needs low > 0, got 0"),
    ("moe.top_k", {"int": [1.5, 3]}, r"int bounds must be integers"),
    ("moe.top_k", {"expr": 3}, r"expr must be a string"),
    ("moe.top_k", {"gird": [1]}, r"search\.moe\.top_k\.gird is not known"),
    ("moe.top_k", {"grid": [1], "int": [1, 2]}, r"needs exactly one of grid, choice"),
    ("moe.top_k", 3, r"must be a mapping like \{grid: \[...\]\} or a list"),
    ("moe.top_kk", [1], r"search\.moe\.top_kk: unknown key moe\.top_kk"),
    ("moe..top_k", [1], r"search key 'moe\.\.top_k' must be a dotted key"),
    ("moe.top_k", {"grid": [1], "when": [1]}, r"when must map config keys to allowed values"),
    ("moe.top_k", {"grid": [1], "when": {"moe.bogus": 1}}, r"when: unknown key moe\.bogus"),
    ("moe.top_k", {"grid": [1], "when": {"moe.granularity": {"a": 1}}},
     r"when\.moe\.granularity=\{'a': 1\} must be a value or a list"),
])
def test_parse_errors_name_the_key(key, raw, match):
    with pytest.raises(SearchSpaceError, match=match):
        _p(key, raw)


def test_search_space_grid_corners_and_tune_space():
    space = SearchSpace.parse({
        "moe.granularity": {"grid": [1, 2]},
        "moe.top_k": {"choice": [1, 2]},
        "optim.lr": {"loguniform": [1e-4, 1e-2]},
        "moe.num_experts": {"expr": "8 * moe.granularity"},
    }, TrainConfig, seeds=(0, 1))
    assert [p.key for p in space] == ["moe.granularity", "moe.top_k", "optim.lr",
                                      "moe.num_experts"]
    assert [p.key for p in space.grid()] == ["moe.granularity"]
    assert [p.key for p in space.sampled()] == ["moe.top_k", "optim.lr"]
    assert [p.key for p in space.exprs()] == ["moe.num_experts"]
    assert list(space.grid_points()) == [
        {"moe.granularity": g, "seed": s} for g in (1, 2) for s in (0, 1)]
    corners = space.corner_points()
    assert len(corners) == 4 * 2 * 2
    assert {(c["moe.top_k"], c["optim.lr"]) for c in corners} == {
        (k, lr) for k in (1, 2) for lr in (1e-4, 1e-2)}
    ts = space.tune_space()
    assert set(ts) == {"moe.granularity", "moe.top_k", "optim.lr", "seed"}  # expr: per trial
    assert ts["seed"] == tune.grid_search([0, 1])
    with pytest.raises(SearchSpaceError, match="search must map dotted config keys"):
        SearchSpace.parse([1], TrainConfig)
    assert SearchSpace.parse(None, TrainConfig).params == ()

"""The ``law:`` block (``sweeps.law.config``): the flat shape decoded by the one decoder, the old
shape read with a one-line deprecation, and refusals that name the ``law.`` key."""

from __future__ import annotations

import dataclasses

import pytest

from moe_core.errors import SearchSpaceError
from sweeps.law.config import OLD_SHAPE, LawSearchConfig, parse_law_block

NEW = {"law": "eq8", "target": "loss_at", "loss_at": {"D1": 40000, "D2": "3e5"},
       "candidates": "box", "box": {"parent.tokens": [20000, 3e5], "tokens": ["4e4", 6e5]},
       "points": 4, "variables": {"D1": "parent.tokens"}, "fix": {"E": 1e-4},
       "scratch": {"A": 40, "alpha": 0.25, "E": 0}, "ci_width": 0.5, "max_trials": 10,
       "dstar_range": [1000, 1e17]}
OLD = {k: v for k, v in NEW.items() if k not in ("target", "loss_at", "candidates", "box",
                                                    "points")}
OLD.update(target={"loss_at": NEW["loss_at"]},
           candidates={"box": NEW["box"], "points": NEW["points"]})


def test_new_shape_decodes_into_the_held_form(capsys):
    cfg = parse_law_block(NEW)
    assert isinstance(cfg, LawSearchConfig)
    assert cfg.target == "loss_at" and cfg.loss_at == (("D1", 40000.0), ("D2", 300000.0))
    assert all(type(v) is float for _, v in cfg.loss_at)
    assert cfg.candidates == "box" and cfg.points == 4
    assert cfg.box == (("parent.tokens", 20000.0, 300000.0), ("tokens", 40000.0, 600000.0))
    assert cfg.variables == (("D1", "parent.tokens"),)
    assert cfg.fix == (("E", 1e-4),) and cfg.scratch == (("A", 40.0), ("alpha", 0.25),
                                                          ("E", 0.0))
    assert cfg.dstar_range == (1000.0, 1e17) and type(cfg.dstar_range[0]) is float
    assert cfg.widen == "auto"  # #38: the calibrated factor of the noise model
    assert capsys.readouterr().err == ""  # no deprecation for the new shape


def test_old_shape_is_read_with_one_deprecation_line(capsys):
    old = parse_law_block(OLD)
    err = capsys.readouterr().err
    assert err == OLD_SHAPE + "\n" and len(err.splitlines()) == 1
    assert "loss_at" in err and "box" in err and "points" in err
    assert old == parse_law_block(NEW)
    # only one of the two old forms: still one line
    parse_law_block({"target": {"loss_at": {"D1": 1e9, "D2": 2e9}}})
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_the_held_form_is_what_the_run_record_hashes():
    """``sweeps.run.guard.spec_record`` hashes ``dataclasses.asdict`` of the block: pairs and
    triples of floats, as before the flat shape (``test_guard_fingerprint`` pins the hash)."""
    rec = dataclasses.asdict(parse_law_block(NEW))
    assert rec["loss_at"] == (("D1", 40000.0), ("D2", 300000.0))
    assert rec["box"][0] == ("parent.tokens", 20000.0, 300000.0)


@pytest.mark.parametrize("raw, match", [
    ({"target": "alpha3", "bogus": 1}, r"^unknown key law\.bogus; known keys under law: "),
    ({"target": "loss_at", "loss_at": {"D1": 1e9}}, r"^law\.loss_at must give D1, D2"),
    ({"target": "loss_at", "loss_at": {"D1": "x", "D2": 1}},
     r"^law\.loss_at\.D1='x' must be a finite number$"),
    ({"target": "alpha3", "candidates": "box", "box": {"tokens": [1e3]}},
     r"^law\.box\.tokens=\[1000\.0\] must be \[low, high\], two numbers$"),
    ({"target": "alpha3", "candidates": "box", "box": {"tokens": [10, 1]}},
     r"^law\.box\.tokens=\[10\.0, 1\.0\] needs 0 < low < high$"),
    ({"target": "alpha3", "candidates": "box", "box": {"tokens": [1, 2]}, "points": 1},
     r"^law\.points=1 must be an integer >= 2$"),
    ({"target": "alpha3", "candidates": "cube"}, r"^law\.candidates='cube': use grid, or box"),
    ({"target": "alpha3", "widen": 0.5},
     r"^law\.widen=0\.5 must be >= 1 \(a calibrated widening of the target's interval\)$"),
    ({"target": "alpha3", "ci": "high"}, r"^law\.ci='high' must be a number$"),
    ({"target": "alpha3", "dstar_range": [1e3, float("inf")]},
     r"^law\.dstar_range=\[1000, inf\] must be finite"),
    ({"target": {"loss_at": {"D1": 1, "D2": 1}}, "loss_at": {"D1": 1, "D2": 1}},
     r"^law\.target must be dstar, alpha3 or loss_at"),
    ({"target": "alpha3", "candidates": {"box": {"tokens": [1, 2]}, "cube": 1}},
     r"^law\.candidates must be grid or box"),
    ([1], r"^law must be a mapping"),
])
def test_refusals_name_the_key(raw, match):
    with pytest.raises(SearchSpaceError, match=match):
        parse_law_block(raw)

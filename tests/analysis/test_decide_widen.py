"""``analysis.decide --widen F`` (issue #30): the D* interval widened F times about D̂* in ln D*
(:func:`scaling.interval.widen`, the function ``law.widen`` and studies/law_search.py use),
said on stdout and in ``--json`` next to ``noise_model``."""

from __future__ import annotations

import json
import math

import pytest

from analysis.cli import decide_main
from tests.analysis.test_decide_noise_model import _frame


def test_widen_moves_the_dstar_interval_and_says_so(tmp_path, capsys):
    f = tmp_path / "three_seeds.csv"
    _frame(3).to_csv(f, index=False)
    base = [str(f), "--bootstrap", "20", "--noise", "fading", "--icc", "0.9", "--length", "2"]
    assert decide_main(base + ["--json", "--widen", "1"]) == 0  # an explicit number wins
    plain = json.loads(capsys.readouterr().out)
    assert plain["widen"]["factor"] == 1 and "ci_unwidened" not in plain["d_star"]
    assert plain["widen"]["source"] == "given"
    assert decide_main(base + ["--json", "--widen", "1.3"]) == 0
    wide = json.loads(capsys.readouterr().out)
    v = wide["d_star"]["value"]
    assert v == pytest.approx(plain["d_star"]["value"])
    assert wide["d_star"]["ci_unwidened"] == pytest.approx(plain["d_star"]["ci"])
    lo, hi = plain["d_star"]["ci"]
    # by hand: ln end ↦ ln D̂* + 1.3·(ln end − ln D̂*)
    assert math.log(wide["d_star"]["ci"][0]) == pytest.approx(
        math.log(v) + 1.3 * (math.log(lo) - math.log(v)))
    if hi is not None:
        assert math.log(wide["d_star"]["ci"][1]) == pytest.approx(
            math.log(v) + 1.3 * (math.log(hi) - math.log(v)))
    assert wide["widen"]["factor"] == 1.3 and "×1.3" in wide["widen"]["how"]
    assert wide["loss"] == plain["loss"]  # only D*'s interval is widened
    assert decide_main(base + ["--widen", "1.3"]) == 0
    out = capsys.readouterr().out
    assert "D* interval widened ×1.3" in out and "intervals assume:" in out
    assert decide_main(base + ["--widen", "1"]) == 0
    assert "D* interval not widened (×1, given)" in capsys.readouterr().out


def test_widen_auto_is_the_calibrated_factor_of_the_noise_model(tmp_path, capsys):
    """#38: no --widen is ``auto``: fading ×1.35, groups ×1.55, trials 1 (the committed
    studies' factors, docs/intervals.md), said on stdout and in --json."""
    from analysis.decide.labels import widen_lines
    from scaling.interval import noise_model_name, resolve_widen
    assert [resolve_widen("auto", noise_model_name(n, ln))[0] for n, ln in
            (("fading", 2.0), ("groups", None), ("trials", None))] == [1.35, 1.55, 1.0]
    assert resolve_widen(1.2, "fading") == (1.2, "given")  # an explicit number wins
    f = tmp_path / "three_seeds.csv"
    _frame(3).to_csv(f, index=False)
    assert decide_main([str(f), "--bootstrap", "20", "--noise", "fading", "--icc", "0.9",
                        "--length", "2", "--json"]) == 0
    w = json.loads(capsys.readouterr().out)["widen"]
    assert w["factor"] == 1.35 and w["source"].startswith("auto: calibrated for fading noise")
    assert widen_lines(w)[0].startswith("D* interval widened ×1.35 (auto: calibrated for fading")
    assert widen_lines({"factor": 1.0, "source": "given"}) == [
        "D* interval not widened (×1, given)"]


def test_widen_below_one_is_refused(tmp_path, capsys):
    f = tmp_path / "three_seeds.csv"
    _frame(3).to_csv(f, index=False)
    assert decide_main([str(f), "--bootstrap", "20", "--widen", "0.8"]) == 2
    assert "--widen 0.8: must be >= 1" in capsys.readouterr().err

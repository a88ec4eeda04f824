"""studies/hold_out_seed.py (issue #30, "show it on the real grid"): on a simulated replicated
grid, each seed is held out once, its own D* is the joint fit of its trials alone, and the
held-in fit never sees its trials (the noise is measured on the held-in seeds)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.analysis.test_decide_noise_model import _frame
from tests.studies.test_studies import _load

ROOT = Path(__file__).resolve().parents[2]


def _study():
    return _load("hold_out_seed")


@pytest.mark.slow
def test_each_seed_is_held_out_and_judged_by_the_others(tmp_path):
    ho = _study()
    df = _frame(3)
    up, base = tmp_path / "grid.csv", tmp_path / "base.csv"
    df[df["kind"] == "upcycled"].to_csv(up, index=False)
    df[df["kind"] == "moe"].to_csv(base, index=False)
    rows = ho.hold_out(str(up), str(base), bootstrap=12)
    assert sorted({r["held_out"] for r in rows}) == [0, 1, 2]
    assert {r["model"] for r in rows} >= {"trials", "groups"}
    assert any(r["holds"] is not None for r in rows)
    for r in rows:
        held_out = df[(df["seed"] == r["held_out"]) | (df["kind"] == "moe")]
        own = ho.own_dstar(held_out[held_out["kind"] == "upcycled"],
                           held_out[held_out["kind"] == "moe"])
        lo, hi = r["ci"]
        if own is None:  # the held-out seed's laws do not cross once: nothing to hold
            assert r["held_out_dstar"] is None and r["holds"] is None
            continue
        assert r["held_out_dstar"] == pytest.approx(own)
        assert r["holds"] == ((lo or 0.0) <= own <= (hi or math.inf))
        # measured on the two held-in seeds only
        assert r["measured"] is not None

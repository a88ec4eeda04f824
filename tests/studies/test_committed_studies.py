"""The committed coverage studies (docs/intervals.md) are what their committed rows say: each
summary in ``studies_out/`` is recomputed from ``studies_out/rows/<model>.jsonl.gz`` with the
noise flags it was run with, and every figure the docs quote from it must match."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.studies.test_studies import _load

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "studies_out"
FADING = ["--sigma", "0.00095", "--sigma-group", "0.00285", "--group-length", "2.73",
          "--icc", "0.9", "--length", "2.73"]
MODELS = {  # the flags each model's studies ran with (docs/intervals.md, Commands)
    "independent": ["--sigma", "0.003", "--icc", "0"],
    "equicorrelated": ["--sigma", "0.0017", "--sigma-group", "0.0025", "--icc", "0.68"],
    "fading": FADING,
    "parent_fixed": ["--sigma", "0.0051", "--icc", "0"],
    "fading_widen135_oos": FADING + ["--widen", "1.35"],
}


def _same(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(MODELS))
def test_summary_is_recomputed_from_its_rows(model, capsys):
    law_search = _load("law_search")
    rows = OUT / "rows" / f"{model}.jsonl.gz"
    got = law_search.main(["--from-rows", str(rows), "--noise", "groups", *MODELS[model]])
    capsys.readouterr()
    committed = json.loads((OUT / f"summary_{model}.json").read_text())
    got.pop("wall_s"), committed.pop("wall_s")
    got = json.loads(json.dumps(got, default=lambda v: None))  # as the file was written
    assert _same(got, committed), model
    assert got["studies"] == 60 and got["grid_studies"] == 60

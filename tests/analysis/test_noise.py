"""``analysis.noise``: the seed-to-seed noise of ln L and its share common to a group, recovered
from replicated sweeps drawn with a known split (``sweeps.testing.simulate``'s own noise model)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from analysis.cli import noise_main
from analysis.noise import format_noise, noise_structure
from moe_core.errors import FitError
from sweeps.testing.simulate import SimulatedStudy

GRID = np.geomspace(0.5e9, 8e9, 5)


def _replicated(sigma: float, sigma_group: float, seeds: int) -> pd.DataFrame:
    """A 5 × 5 D1 × D2 sweep run with ``seeds`` seeds; each (D1, seed) is one parent and one
    WSD stable run, whose trials share exp(sigma_group·η)."""
    rows = []
    for s in range(seeds):
        study = SimulatedStudy(sigma=sigma, sigma_group=sigma_group, seed=1000 + s)
        for i, d1 in enumerate(GRID):
            for d2 in GRID:
                x = {"D1": d1, "D2": d2}
                rows.append({"trial_id": f"t{s}_{i}_{d2:.0f}", "seed": s, "step": 10,
                             "status": "ok", "parent_key": f"p{i}_s{s}", "D1": d1, "D2": d2,
                             "val_loss": study.loss(x, group=f"g{i}")})
    return pd.DataFrame(rows)


def test_recovers_a_known_split():
    n = noise_structure(_replicated(0.006, 0.008, seeds=24))
    assert n.sigma == pytest.approx(0.010, rel=0.1)
    assert n.icc == pytest.approx(0.64, abs=0.1)
    assert n.sigma_group == pytest.approx(0.008, rel=0.15)
    assert n.sigma_own == pytest.approx(0.006, rel=0.2)
    assert (n.points, n.seeds, n.groups, n.pairs) == (25, 24, 120, 50)
    # the group effect is the same at every distance (the simulator's exchangeable model)
    assert [d["distance"] for d in n.by_distance] == [1.0, 2.0, 3.0, 4.0]
    assert all(abs(d["corr"] - 0.64) < 0.15 for d in n.by_distance)


def test_independent_trials_share_nothing():
    n = noise_structure(_replicated(0.01, 0.0, seeds=24))
    assert n.sigma == pytest.approx(0.01, rel=0.1)
    assert abs(n.icc) < 0.1
    assert any("no shared component" in line or "ICC" in line for line in format_noise(n))


def test_a_parent_fixed_across_seeds_is_said_and_left_out_of_sigma():
    """parent.seed set: every seed upcycles the same parent, whose effect (here 0.03 in ln L,
    ten times the trials' own noise) is one constant per D1: it cannot show in the seed-to-seed
    spread, and the report says the figures are the noise given the parent."""
    effect = np.random.default_rng(5).normal(0.0, 0.03, size=len(GRID))
    rows = []
    for s in range(12):
        study = SimulatedStudy(sigma=0.003, seed=2000 + s)
        for i, d1 in enumerate(GRID):
            for d2 in GRID:
                x = {"D1": d1, "D2": d2}
                rows.append({"trial_id": f"t{s}_{i}_{d2:.0f}", "seed": s, "parent_key": f"p{i}",
                             "D1": d1, "D2": d2,
                             "val_loss": study.loss(x) * math.exp(effect[i])})
    n = noise_structure(pd.DataFrame(rows))
    assert n.group_fixed and n.groups == len(GRID)
    assert n.sigma == pytest.approx(0.003, rel=0.15) and abs(n.icc) < 0.15
    text = "\n".join(format_noise(n))
    assert "one parent_key in all its seeds" in text and "given the parent_key" in text
    assert not noise_structure(_replicated(0.006, 0.008, seeds=4)).group_fixed


def test_the_estimate_matches_a_hand_computation():
    """Two points of one group, three seeds: sigma² = Σ dev² / Σ (n − 1), cov = Σ dev_a·dev_b /
    (n − 1)."""
    ya, yb = np.array([0.1, 0.3, 0.2]), np.array([0.5, 0.8, 0.5])
    rows = [{"trial_id": f"{p}{s}", "seed": s, "parent_key": f"g{s}", "D1": 1.0, "D2": d2,
             "val_loss": math.exp(v)}
            for p, d2, ys in (("a", 1.0, ya), ("b", 4.0, yb)) for s, v in enumerate(ys)]
    n = noise_structure(pd.DataFrame(rows))
    var = (np.sum((ya - ya.mean()) ** 2) + np.sum((yb - yb.mean()) ** 2)) / 4
    cov = np.sum((ya - ya.mean()) * (yb - yb.mean())) / 2
    assert n.sigma == pytest.approx(math.sqrt(var))
    assert n.icc == pytest.approx(cov / var)
    assert n.by_distance == [{"distance": 2.0, "corr": pytest.approx(cov / var), "pairs": 1}]


def test_one_seed_is_refused_with_the_fix(tmp_path, capsys):
    df = _replicated(0.01, 0.0, seeds=1)
    with pytest.raises(FitError, match="seeds"):
        noise_structure(df)
    f = tmp_path / "one.csv"
    df.to_csv(f, index=False)
    assert noise_main([str(f)]) == 2
    assert capsys.readouterr().err.startswith("error: no point was run with two or more seeds")


def test_cli_json(tmp_path, capsys):
    f = tmp_path / "rep.parquet"
    _replicated(0.006, 0.008, seeds=6).to_parquet(f)
    assert noise_main([str(f), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["seeds"] == 6 and out["group"] == "parent_key" and out["sigma"] > 0
    assert noise_main([str(f)]) == 0
    assert "ICC" in capsys.readouterr().out

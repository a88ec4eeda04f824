"""``analysis.decide`` says which noise model its intervals assume and why (issue #30): from the
results' own seed replicates when they have them, as an assumption when they do not; and
``--noise fading --length L`` bootstraps with a group effect that fades along D2."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from analysis.cli import decide_main
from sweeps.testing.simulate import SimulatedStudy

GRID = np.geomspace(0.5e9, 8e9, 5)


def _frame(seeds: int, group_length: float | None = 1.5) -> pd.DataFrame:
    rows = []
    for s in range(seeds):
        st = SimulatedStudy(N1=1e9, sigma=0.002, sigma_group=0.006, seed=40 + s,
                            group_length=group_length)
        for i, d1 in enumerate(GRID):
            for d2 in GRID:
                rows.append({"trial_id": f"u{s}_{i}_{d2:.0f}", "kind": "upcycled", "seed": s,
                             "parent_key": f"p{i}_s{s}", "upcycle.method": "dense_to_moe",
                             "N1": 1e9, "N2": 1.75e9, "D1": d1, "D2": d2, "tokens": d2,
                             "val_loss": st.loss({"D1": d1, "D2": d2}, group=f"p{i}")})
    sc = SimulatedStudy(N1=1e9).scratch
    for d in np.geomspace(0.5e9, 16e9, 6):
        rows.append({"trial_id": f"s{d:.0f}", "kind": "moe", "seed": 0, "parent_key": "",
                     "N1": 8e9, "N2": 1.75e9, "D1": 0, "D2": d, "tokens": d,
                     "val_loss": sc["A"] * d ** -sc["alpha"] + sc["E"]})
    return pd.DataFrame(rows)


def test_without_replicates_it_says_the_model_is_assumed(tmp_path, capsys):
    f = tmp_path / "one_seed.csv"
    _frame(1).drop(columns=["seed"]).to_csv(f, index=False)
    args = [str(f), "--bootstrap", "20", "--noise", "fading", "--icc", "0.9", "--length", "2"]
    assert decide_main(args + ["--json"]) == 0
    nm = json.loads(capsys.readouterr().out)["noise_model"]
    assert nm["model"] == "fading" and nm["length"] == 2 and nm["measured"] is None
    assert "cannot be estimated" in nm["why"] and "assumption" in nm["why"]
    assert decide_main(args) == 0
    out = capsys.readouterr().out
    assert "intervals assume: " in out and "fades along D2" in out and "assumption" in out
    assert decide_main([str(f), "--noise", "fading"]) == 2  # no length
    assert "--length" in capsys.readouterr().err


def test_with_replicates_it_says_what_they_measured(tmp_path, capsys):
    f = tmp_path / "three_seeds.csv"
    _frame(3).to_csv(f, index=False)
    assert decide_main([str(f), "--bootstrap", "20", "--json"]) == 0
    nm = json.loads(capsys.readouterr().out)["noise_model"]
    assert nm["model"] == "trials" and nm["measured"]["pairs"] > 0
    assert nm["measured"]["icc"] > 0.3
    assert "misses" in nm["why"]  # trials against a measured shared part


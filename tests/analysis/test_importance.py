"""Parameter importance (analysis.importance): one knob that decides the loss ranks first, with
its spread over seeds, through optuna.importance (PED-ANOVA; fANOVA on request)."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from analysis.importance import importance, main
from moe_core.errors import FitError
from sweeps.store.results import RESULTS_FILE, read_rows, write_rows


def _dominated_sweep(tmp_path, seeds=(0, 1, 2)):
    """lr (log-spaced) moves the loss by ~1 nat; aux_coef and top_k by ~1e-3 (noise)."""
    rng = np.random.default_rng(0)
    rows = []
    for i, (lr, aux, k, seed) in enumerate(itertools.product(
            [1e-4, 3e-4, 1e-3, 3e-3, 1e-2], [0.0, 0.01, 0.1], [1, 2], seeds)):
        L = 2.0 + (math.log10(lr) + 3) ** 2 / 2 + 1e-3 * rng.standard_normal()
        base = {"sweep": "dom", "trial_id": f"t{i}", "status": "ok", "seed": seed,
                "knob.seed": seed, "knob.optim.lr": lr, "knob.moe.router.aux_coef": aux,
                "knob.moe.top_k": k}
        rows += [dict(base, step=0, tokens=0, val_loss=L + 1), dict(base, step=5, tokens=9,
                                                                    val_loss=L)]
    write_rows(tmp_path / "dom" / RESULTS_FILE, rows)
    return read_rows(tmp_path / "dom" / RESULTS_FILE)  # through the Parquet file


def test_the_knob_that_decides_the_loss_ranks_first_in_every_seed(tmp_path):
    t = importance(_dominated_sweep(tmp_path))
    assert t.evaluator == "ped_anova" and t.trials == 90 and t.seeds == (0, 1, 2)
    top = t.knobs[0]
    assert top.knob == "optim.lr" and top.importance > 0.8
    assert {k.knob for k in t.knobs} == {"optim.lr", "moe.router.aux_coef", "moe.top_k"}
    assert math.isclose(sum(k.importance for k in t.knobs), 1.0)
    assert len(top.per_seed) == 3 and min(top.per_seed) > 0.6
    assert top.seed_mean == pytest.approx(np.mean(top.per_seed))
    assert top.seed_std == pytest.approx(np.std(top.per_seed, ddof=1))
    assert all(k.importance < 0.2 for k in t.knobs[1:])
    md = "\n".join(t.markdown())
    assert "| `optim.lr` |" in md and "per seed" in md


def test_fanova_agrees_and_a_one_seed_sweep_has_no_spread(tmp_path):
    pytest.importorskip("sklearn", reason="fANOVA needs scikit-learn (the fanova extra)")
    t = importance(_dominated_sweep(tmp_path, seeds=(0,)), evaluator="fanova")
    assert t.knobs[0].knob == "optim.lr" and t.knobs[0].importance > 0.8
    assert t.seeds == (0,) and math.isnan(t.knobs[0].seed_std)
    with pytest.raises(FitError, match="evaluator 'x' is not known; use one of ped_anova"):
        importance(_dominated_sweep(tmp_path, seeds=(0,)), evaluator="x")


def test_the_command_prints_the_table(tmp_path, capsys):
    _dominated_sweep(tmp_path, seeds=(0,))
    assert main([str(tmp_path / "dom")]) == 0
    assert "| `optim.lr` |" in capsys.readouterr().out
    assert main([str(tmp_path / "none")]) == 2
    assert "no results.parquet" in capsys.readouterr().err


def test_a_two_by_two_grid_ranks_the_knob_that_splits_the_losses_first():
    """The final losses of a real 2 × 2 sweep (lr_aux_2knob, two seeds): the LR policy splits
    them (reset 1.66–1.68, constant 1.71–1.72), aux_coef does not. With Optuna's defaults
    (a 0.1 quantile: one trial of eight; aux_coef as a log range of two points) PED-ANOVA gave
    aux_coef 0.994."""
    finals = [(0.001, "reset", 1, 1.6597), (0.1, "reset", 1, 1.6607),
              (0.1, "reset", 0, 1.6732), (0.001, "reset", 0, 1.6807),
              (0.001, "constant", 1, 1.7054), (0.1, "constant", 1, 1.7076),
              (0.1, "constant", 0, 1.7186), (0.001, "constant", 0, 1.7189)]
    rows = [{"trial_id": f"t{i}", "status": "ok", "step": 10, "seed": s, "knob.seed": s,
             "knob.moe.router.aux_coef": a, "val_loss": v,
             "knob.upcycle.lr_policy": json.dumps({"policy": p})}
            for i, (a, p, s, v) in enumerate(finals)]
    t = importance(rows)
    assert [k.knob for k in t.knobs] == ["upcycle.lr_policy", "moe.router.aux_coef"]
    assert t.knobs[0].importance > 0.9 and min(t.knobs[0].per_seed) > 0.9

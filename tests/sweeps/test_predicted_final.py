"""predicted_final: what a trial reports live (sweeps.run.trial.PostDecayPredictor, from its own
run_schedule) equals what bench/ and the calibration rebuild from its result rows
(sweeps.run.curves), for every LR policy; and the calibration refuses an unusable file."""

import math

import pytest

from moe_core.errors import ConfigError
from moe_core.schedules import Phase, run_schedule
from moe_core.train import Trainer
from moe_core.train.callbacks import ParentState
from moe_core.train.checkpoint import load_checkpoint
from scaling.predict import Calibration, predict_final
from sweeps.plan.build import build_plan
from sweeps.run.curves import curves_from_rows, load_calibration
from sweeps.run.trial import PostDecayPredictor, TrialReporter
from sweeps.spec.sweep import parse_spec
from sweeps.store.results import config_columns, write_rows
from tests.sweeps.tiny import tiny_base

SPEC = {
    "sweep": "pf",
    "base": {"model": {"preset": "debug"}, "moe": {"num_experts": 4, "top_k": 2},
             "data": {"source": "synthetic"}, "batch": {"global_batch": 8, "micro_batch": 8},
             "schedule": {"kind": "wsd", "warmup_steps": 3, "decay_frac": 0.2},
             "eval": {"every_steps": 5}, "tokens": 8 * 256 * 40,
             "parent": {"tokens": 8 * 256 * 10, "lr": 5e-3}, "upcycle": {"method": "dense_to_moe"}},
    "search": {"upcycle.lr_policy": {"grid": [{"policy": "constant"},
                                              {"policy": "reset", "peak": 2e-3},
                                              {"policy": "ratio", "ratio": 0.5}]}},
}
CAL = Calibration(alpha=0.3, A=0.5, gain=(math.log(30.0), 1.0, 0.0), mpl=(200.0, 2.0, 0.5, 0.5),
                  ratio=(-0.05, 0.02, 0.1))


def _rows(t, parent, trial_id):
    plan = run_schedule(t.config, parent, Phase.full())
    out = []
    for step in range(0, plan.end_step + 1, 5):
        lr = plan.lr(max(step - 1, 0))
        out.append({"trial_id": trial_id, "step": step, "D1": parent.tokens,
                    "val_loss": 3.0 - 0.02 * step, "lr": lr, **config_columns(t.config.to_dict())})
    return out


@pytest.mark.parametrize("method", ["branch_gain", "multi_power", "ratio"])
def test_live_prediction_equals_the_one_rebuilt_from_rows(method, tmp_path):
    spec = parse_spec(SPEC)
    plan = build_plan(spec)
    parent = ParentState(model_state={}, model_config=None, peak_lr=5e-3, final_lr=5e-4,
                         tokens=8 * 256 * 10)
    for i, t in enumerate(plan.trials):
        rows = _rows(t, parent, f"t{i}")
        live = PostDecayPredictor.for_trial(method, CAL, t, parent)
        got = [live.observe(r["step"], r["val_loss"]) for r in rows]
        curve = curves_from_rows(rows)[f"t{i}"]
        assert curve.lrs == live.curve.lrs and curve.decay_start == live.curve.decay_start
        want = [predict_final(curve.upto(r["step"]), CAL, method) for r in rows]
        assert got == want
        assert got[-1] == rows[-1]["val_loss"]  # finished: its own loss
        decays = t.config.upcycle.lr_policy.policy != "constant"
        assert (curve.decay_start < curve.total) == decays
        if method != "ratio" and decays:  # the decay's gain is credited before it happens
            assert got[4] < rows[4]["val_loss"] - 0.01
    write_rows(tmp_path / "results.parquet", [dict(r, status="running") for r in rows])
    with pytest.raises(ConfigError, match="holds no finished trial"):
        load_calibration(tmp_path)


def test_a_restarted_trial_predicts_from_its_whole_curve(tmp_path):
    """A trial restarted from its checkpoint (a failure, a resumed sweep) reports the same
    ``predicted_final`` as the run that never stopped: the checkpoint records the lineage's
    evals (``Trainer.evals``) and the Trainer hands them to the reporter's predictor
    (``Callback.on_resume``). Without them the predictor sees only the evals after the
    checkpoint and predicts otherwise."""
    base = tiny_base(moe={"num_experts": 4, "top_k": 2}, tokens=8 * 32 * 16)
    spec = parse_spec({"sweep": "pfr", "base": base, "search": {"seed": {"grid": [0]}}})
    t = build_plan(spec).trials[0]

    def run(resume=None, checkpoint_steps=()):
        rows = []
        rep = TrialReporter({"N2": 1}, lambda row, checkpoint=None: rows.append(row), None,
                            attach=False,
                            predictor=PostDecayPredictor.for_trial("branch_gain", CAL, t, None))
        tr = Trainer(t.config, resume_from=resume, out_dir=tmp_path / "ck",
                     checkpoint_steps=checkpoint_steps, callbacks=(rep,))
        tr.fit()
        return tr, rows

    full, rows = run(checkpoint_steps=(8,))
    assert [r["step"] for r in rows] == list(range(0, 17, 2))
    ck = load_checkpoint(tmp_path / "ck" / "step_00000008")
    assert ck.meta["evals"] == [[r["step"], r["val_loss"]] for r in rows[:5]]
    again, replayed = run(resume=tmp_path / "ck" / "step_00000008", checkpoint_steps=(12,))
    assert [r["step"] for r in replayed] == [10, 12, 14, 16]
    assert [r["val_loss"] for r in replayed] == [r["val_loss"] for r in rows[5:]]
    assert [r["predicted_final"] for r in replayed] == [r["predicted_final"]
                                                       for r in rows[5:]]
    # a checkpoint of the resumed run records the whole lineage, not just its own evals
    assert [s for s, _ in load_checkpoint(tmp_path / "ck" / "step_00000012").meta["evals"]] \
        == list(range(0, 13, 2))
    blind = PostDecayPredictor.for_trial("branch_gain", CAL, t, None)
    assert [blind.observe(r["step"], r["val_loss"]) for r in replayed][0] != \
        replayed[0]["predicted_final"]

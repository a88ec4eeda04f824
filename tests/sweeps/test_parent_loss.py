"""#38: a ``parent.from_pretrained`` parent is loaded, never evaluated; the trial records its
step-0 eval (the freshly upcycled model) as the parent's loss in every row, with
``parent_loss_source: step-0 eval``, from that eval or, after a restart, from the lineage's
evals its checkpoint recorded. A trained parent's final eval is left as it is."""

from __future__ import annotations

from sweeps.run.prune import rule_value
from sweeps.run.trial import TrialReporter
from sweeps.store.results import FINAL_EVAL, STEP0_EVAL


def _reporter(lp, source) -> tuple[TrialReporter, list[dict]]:
    rows: list[dict] = []
    static = {"N2": 10, "parent_val_loss": lp, "parent_loss_source": source}
    return TrialReporter(static, lambda row, checkpoint=None: rows.append(row), None,
                         attach=False), rows


def _eval(step: int, loss: float) -> dict:
    return {"step": step, "tokens": 8 * step, "val_loss": loss}


def test_a_pretrained_parents_loss_is_the_step0_eval_in_every_row():
    rep, rows = _reporter(None, STEP0_EVAL)
    rep.on_eval(_eval(0, 3.25), None)
    rep.on_eval(_eval(4, 2.5), None)
    assert [(r["parent_val_loss"], r["parent_loss_source"]) for r in rows] == [
        (3.25, STEP0_EVAL)] * 2
    # no jump is read off it: step 0 is the parent's loss itself
    assert rule_value("transition_jump", rows[0]) is None


def test_a_restarted_trial_takes_it_from_the_lineages_evals():
    rep, rows = _reporter(None, STEP0_EVAL)
    rep.on_resume([(0, 3.25), (4, 2.5)])
    rep.on_eval(_eval(8, 2.25), None)
    assert rows[0]["parent_val_loss"] == 3.25


def test_a_trained_parents_final_eval_stays():
    rep, rows = _reporter(2.0, FINAL_EVAL)
    rep.on_eval(_eval(0, 3.25), None)
    assert (rows[0]["parent_val_loss"], rows[0]["parent_loss_source"]) == (2.0, FINAL_EVAL)
    assert rule_value("transition_jump", rows[0]) == 1.25

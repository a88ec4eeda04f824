"""The knob audit inside the one trial path (``sweeps.run.trial.run_trial``): each row records
the effective values read back at set-up, and a planted override fails the trial once, in one
line naming the key (``moe_core.train.audit``, docs/audit.md)."""

from __future__ import annotations

import dataclasses

import pytest

from moe_core.moe.layer import MoELayer
from sweeps.plan.build import build_plan
from sweeps.run.trial import TrialContext, run_trial
from sweeps.spec.sweep import parse_spec
from tests.sweeps.tiny import tiny_base


def _run(tmp_path) -> list[dict]:
    base = tiny_base(moe={"num_experts": 4, "top_k": 2, "router": {"aux_coef": 0.1}})
    spec = parse_spec({"sweep": "a", "base": base, "resources": {"gpus": 0},
                       "search": {"moe.top_k": {"grid": [1]}}})
    plan = build_plan(spec)
    rows: list[dict] = []
    t = plan.trials[0]
    run_trial(dict(t.point), TrialContext(
        spec, plan, {}, str(tmp_path),
        report=lambda row, checkpoint=None: rows.append(row)))
    return rows


def test_every_row_records_the_effective_knobs(tmp_path):
    rows = _run(tmp_path)
    assert rows and all(r["status"] != "failed" for r in rows)
    for r in rows:
        assert r["effective.moe.top_k"] == 1 == r["knob.moe.top_k"]
        assert r["effective.moe.router.aux_coef"] == pytest.approx(0.1, rel=1e-6)
        assert r["effective.moe.num_experts"] == 4


def test_a_planted_override_fails_the_trial_in_one_line(tmp_path, monkeypatch):
    """A layer built with another top-K than its config's (as the old ``aux_coef`` bug did
    with a coefficient): the trial fails once, its row naming the key."""
    real = MoELayer.__init__

    def planted(self, d_model, d_ff, cfg, init_std):
        real(self, d_model, d_ff, dataclasses.replace(cfg, top_k=2), init_std)

    monkeypatch.setattr(MoELayer, "__init__", planted)
    rows = _run(tmp_path)
    assert len(rows) == 1 and rows[0]["status"] == "failed"
    assert "knob audit: moe.top_k is 2 in the live run but the config asks for 1" in \
        rows[0]["reason"]
    assert "\n" not in rows[0]["reason"]

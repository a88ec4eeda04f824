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


def _run(tmp_path, top_k: int = 1, **over) -> list[dict]:
    base = tiny_base(moe={"num_experts": 4, "top_k": 2, "router": {"aux_coef": 0.1}}, **over)
    spec = parse_spec({"sweep": "a", "base": base, "resources": {"gpus": 0},
                       "search": {"moe.top_k": {"grid": [top_k]}}})
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


def test_an_expand_experts_trial_records_and_trains_its_own_aux_coef(tmp_path):
    """Issue 38's case through the trial path: a parent at aux_coef 0.001 (trained here, to
    the cache, at τ = 2 steps), its expanded child asks for 0.1; the row says 0.1 and τ."""
    rows = _run(tmp_path, top_k=2, tokens=512, parent={
        "tokens": 512, "decay": False,
        "moe": {"num_experts": 2, "top_k": 2, "router": {"aux_coef": 1e-3}}},
        upcycle={"method": "expand_experts", "factor": 2})
    assert rows and all(r["status"] != "failed" for r in rows), rows[-1].get("reason")
    assert rows[-1]["effective.moe.router.aux_coef"] == pytest.approx(0.1, rel=1e-6)
    assert rows[-1]["effective.parent.tokens"] == 512 and rows[-1]["effective.parent.moe"] == 2
    assert rows[-1]["effective.upcycle.factor"] == 2
    # the parent's batch and seed, recorded by its live batcher through the parent cache
    assert rows[-1]["effective.parent.seed"] == rows[-1]["seed"]
    assert rows[-1]["effective.parent.batch"] == 512 // 2  # 2 steps of D1 = 512 tokens
    counts = rows[-1]["effective.upcycle.strategy"]  # uniform: every expert copied twice
    assert counts and all(c == [2, 2] for c in counts)


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

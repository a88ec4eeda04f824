"""``algorithm: law`` trials as WSD branches: each trial trains its branch group's stable run
on demand, only as far as its own decay start (``sweeps.run.parents.extend_stable``), under the
group's file lock, with a manifest that stays consistent through a crash; the searcher charges
the stable run once per group. The law sweep whose rows equal the grid's with branches is in
tests/sweeps/test_wsd_branches.py, beside the grid sweep it is compared with."""

from __future__ import annotations

import json
import threading

import pytest
import torch

import sweeps.run.parents as parents
from moe_core.errors import DivergenceError
from moe_core.train.checkpoint import load_checkpoint
from moe_core.train.wsd import train_stable
from sweeps.law.candidates import candidates_from_plan
from sweeps.law.design import Ledger
from sweeps.plan.build import build_plan, extends_stable, on_demand_starts
from sweeps.spec.sweep import parse_spec
from tests.sweeps.test_wsd_branches import LAW, SPEC


def _law_spec(**kw):
    return parse_spec({**SPEC, "algorithm": "law", "law": LAW, **kw})


def _state(path):
    return {k: torch.as_tensor(v) for k, v in load_checkpoint(path).model_state().items()}


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_law_plan_has_the_grids_groups_and_candidates_share_the_stable_run():
    spec = _law_spec()
    plan = build_plan(spec)
    g = next(iter(plan.branch_groups.values()))
    assert g.starts == {1024: 3, 1536: 4, 2048: 6}  # as in the grid's plan
    assert all(extends_stable(spec, t) for t in plan.trials)
    assert not any(extends_stable(parse_spec(SPEC), t) for t in plan.trials)  # grid: up front
    assert not any(extends_stable(_law_spec(wsd_branches=False), t) for t in plan.trials)
    # a candidate off the grid (a law.candidates box) joins its group's checkpoint steps
    off_grid = plan.trial(spec, {"tokens": 2560})
    assert on_demand_starts(spec, [*plan.trials, off_grid]) == {
        g.key: {1024: 3, 1536: 4, 2048: 6, 2560: 8}}
    c = candidates_from_plan(spec, plan)
    assert {x.branch for x in c} == {g.key}
    n = plan.trials[0].N_active
    assert [x.stable_flops for x in c] == [6.0 * n * s * 256 for s in (3, 4, 6)]
    assert [x.trial_flops for x in c] == [6.0 * n * t for t in (1024, 1536, 2048)]
    led = Ledger()
    assert led.add(c[1]) == c[1].trial_flops  # the first pays its stable phase
    assert led.marginal(c[0]) == pytest.approx(c[0].trial_flops - c[0].stable_flops)
    assert led.marginal(c[2]) == pytest.approx(c[2].trial_flops - c[1].stable_flops)
    off = candidates_from_plan(_law_spec(wsd_branches=False), plan)
    assert {x.branch for x in off} == {None} and {x.stable_flops for x in off} == {0.0}


def test_concurrent_extensions_train_the_stable_run_once(tmp_path, monkeypatch):
    """Four threads extend one group at once (decay starts 6, 4, 3, 6): the stable run is
    trained once, to step 6 (checkpoints at every planned start it passes), the manifest lists
    each checkpoint, and step 6 is the stable run trained in one go."""
    spec = parse_spec(SPEC)
    plan = build_plan(spec)
    trials = {t.config.tokens: t for t in plan.trials}
    trained = []
    real = parents.train_stable

    def counting(cfg, out_dir, steps, **kw):
        start = 0 if kw.get("resume_from") is None else load_checkpoint(kw["resume_from"]).step
        trained.append((start, max(steps)))
        return real(cfg, out_dir, steps, **kw)

    monkeypatch.setattr(parents, "train_stable", counting)
    out = tmp_path / "stable" / trials[2048].stable_key
    got, errors = {}, []

    def run(i, t):
        try:
            got[i] = parents.extend_stable(t, None, out, plan.branch_starts(t))
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i, trials[b]))
               for i, b in enumerate([2048, 1536, 1024, 2048])]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert sum(b - a for a, b in trained) == 6  # no step trained twice
    m = json.loads((out / "stable.json").read_text())
    assert sorted(int(s) for s in m["steps"]) == [3, 4, 6]
    assert {int(k): v for k, v in m["checkpoints"].items()} == {
        b: m["steps"][str(trials[b].decay_start)] for b in (1024, 1536, 2048)}
    assert [c["step"] for c in m["curve"]] == [0, 3, 6]  # the evals a single run makes
    for i, b in enumerate([2048, 1536, 1024, 2048]):
        assert got[i].checkpoints[b] == m["checkpoints"][str(b)]
    one = train_stable(trials[2048].config, tmp_path / "one", [3, 4, 6])
    for s in (3, 4, 6):
        assert _equal(_state(m["steps"][str(s)]), _state(one.checkpoints[s]))


def test_crash_mid_extension_keeps_a_consistent_manifest(tmp_path, monkeypatch):
    """A crash after the first checkpoint of an extension leaves a manifest that lists it (and
    only it); the next trial extends from there; a budget unknown to the plan whose start lies
    before the furthest checkpoint resumes from the furthest one below it; a divergence is
    recorded and sends later trials past it to train alone (None), not earlier ones."""
    spec = parse_spec(SPEC)
    plan = build_plan(spec)
    trials = {t.config.tokens: t for t in plan.trials}
    real = parents.train_stable

    class Crash(parents.Callback):
        def on_checkpoint(self, step, path):
            raise RuntimeError("killed")

    def crashing(cfg, out_dir, steps, **kw):
        return real(cfg, out_dir, steps, **{**kw, "callbacks": (*kw["callbacks"], Crash())})

    out = tmp_path / "g"
    monkeypatch.setattr(parents, "train_stable", crashing)
    with pytest.raises(RuntimeError, match="killed"):
        parents.extend_stable(trials[2048], None, out, plan.branch_starts(trials[2048]))
    m = parents.read_manifest(out)
    assert list(m["steps"]) == ["3"] and list(m["checkpoints"]) == ["1024"]
    trained = []

    def counting(cfg, out_dir, steps, **kw):
        start = 0 if kw.get("resume_from") is None else load_checkpoint(kw["resume_from"]).step
        trained.append((start, max(steps)))
        return real(cfg, out_dir, steps, **kw)

    monkeypatch.setattr(parents, "train_stable", counting)
    st = parents.extend_stable(trials[2048], None, out)  # the plan's other starts unknown
    assert trained == [(3, 6)] and sorted(st.checkpoints) == [1024, 2048]
    st = parents.extend_stable(trials[1536], None, out)  # start 4: no checkpoint there
    assert trained[-1] == (3, 4) and sorted(st.checkpoints) == [1024, 1536, 2048]
    one = train_stable(trials[2048].config, tmp_path / "one", [4, 6])
    assert _equal(_state(st.checkpoints[1536]), _state(one.checkpoints[4]))
    assert _equal(_state(st.checkpoints[2048]), _state(one.checkpoints[6]))

    def diverging(cfg, out_dir, steps, **kw):
        raise DivergenceError(5, "train loss is nan")

    monkeypatch.setattr(parents, "train_stable", diverging)
    big = parents.TrialPlan(**{**{f: getattr(trials[2048], f) for f in
                                  trials[2048].__dataclass_fields__}, "decay_start": 7})
    assert parents.extend_stable(big, None, out) is None
    assert parents.read_manifest(out)["diverged_at"] == 5
    assert parents.extend_stable(big, None, out) is None  # not tried again
    assert parents.extend_stable(trials[1536], None, out) is not None  # before the divergence

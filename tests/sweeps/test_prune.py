"""Health rules (sweeps.run.prune, sweeps.run.health): parsing, firing on synthetic router
statistics,
a pruned trial's rows, the summary, analysis leaving pruned trials out, ASHA's rung metric;
the stopper's streaks and ASHA's rungs across a trial's restart and a sweep's resume."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from ray.tune.schedulers import ASHAScheduler

from analysis.data import load_points, ok_trials
from moe_core.errors import SearchSpaceError
from sweeps.plan.build import build_plan
from sweeps.run.driver import ResultsCallback, scheduler
from sweeps.run.health import HealthStopper, ResumableASHA, RungMetricASHA
from sweeps.run.prune import PruneConfig, check, parse_prune
from sweeps.spec.sweep import parse_spec
from sweeps.store.results import PRUNE_COLUMNS, SCHEMA_VERSION, read_rows, read_table, summarize
from sweeps.store.sink import ResultsSink


def _row(step, tokens=None, **stats):
    return {"trial_id": "t", "step": step, "tokens": step * 100 if tokens is None else tokens,
            "val_loss": 2.0, **stats}


def test_parse_errors_name_the_key_and_the_fix():
    p = parse_prune({"max_load_fraction": {"above": 0.5, "for_evals": 3},
                     "expert_similarity": {"above": 0.99, "after_tokens": 2e6}})
    assert [n for n, _ in p.rules] == ["max_load_fraction", "expert_similarity"]
    assert p.metrics == ("router.max_load", "router.expert_similarity")
    assert not parse_prune(None)
    for raw, match in [
        ({"collapse": {"above": 1}}, r"prune\.collapse is not a known rule; use one of "
                                     r"max_load_fraction, dead_experts"),
        ({"dead_experts": 0}, r"prune\.dead_experts must be a mapping"),
        ({"dead_experts": {"below": 0}}, r"prune\.dead_experts needs above"),
        ({"drop_rate": {"above": 0.1, "for_evals": 0}}, r"prune\.drop_rate\.for_evals=0 must"),
        ({"drop_rate": {"above": 0.1, "after_tokens": -1}}, r"after_tokens=-1 must be"),
        ([1], r"prune must map rule names"),
        ({"max_vio": {"above": 1, "layers": "all"}}, r"prune\.max_vio\.layers='all' must be "
                                                     r"'mean' or 'worst'"),
        ({"transition_jump": {"above": 0.1, "layers": "worst"}},
         r"prune\.transition_jump\.layers=worst: transition_jump is not a per-layer"),
    ]:
        with pytest.raises(SearchSpaceError, match=match):
            parse_prune(raw)


def test_a_worst_layer_rule_fires_where_the_mean_hides_one_collapsed_layer():
    # two MoE layers: layer 1 sends every token to one expert (max load 1), layer 0 is healthy
    rows = [_row(i, **{"router.max_load": 0.65, "router.max_load.worst": 1.0,
                       "router.max_load.layer0": 0.3, "router.max_load.layer1": 1.0})
            for i in range(3)]
    mean = parse_prune({"max_load_fraction": {"above": 0.9}})
    worst = parse_prune({"max_load_fraction": {"above": 0.9, "layers": "worst",
                                               "for_evals": 2}})
    assert worst.metrics == ("router.max_load.worst",)
    state: dict = {}
    assert [check(mean, state, r) for r in rows] == [None] * 3
    state = {}
    got = [check(worst, state, r) for r in rows]
    assert got[0] is None and got[1] is not None
    assert got[1].metric == "router.max_load.worst" and got[1].values == (1.0, 1.0)
    assert got[1].reason == ("pruned by max_load_fraction: router.max_load.worst 1, 1 > 0.9 "
                             "for 2 evals (step 1)")


def test_rules_fire_on_synthetic_router_statistics():
    p = parse_prune({"max_load_fraction": {"above": 0.5, "for_evals": 3}})
    state: dict = {}
    loads = [0.6, 0.7, 0.4, 0.6, 0.55, 0.3]  # the streak breaks at 0.4, so no 3-in-a-row
    assert [check(p, state, _row(i, **{"router.max_load": v})) for i, v in
            enumerate(loads)] == [None] * 6
    state = {}
    got = [check(p, state, _row(i, **{"router.max_load": v}))
           for i, v in enumerate([0.2, 0.6, 0.7, 0.8, 0.9])]
    assert got[:3] == [None] * 3
    v = got[3]
    assert (v.rule, v.metric, v.values, v.threshold, v.step) == (
        "max_load_fraction", "router.max_load", (0.6, 0.7, 0.8), 0.5, 3)
    assert "0.6, 0.7, 0.8 > 0.5 for 3 evals" in v.reason

    p = parse_prune({"expert_similarity": {"above": 0.99, "after_tokens": 250}})
    state = {}  # similarity starts at 1 after upcycling: only checked from 250 tokens on
    assert [check(p, state, _row(i, **{"router.expert_similarity": 1.0})) is None
            for i in range(3)] == [True, True, True]
    assert check(p, state, _row(3, **{"router.expert_similarity": 0.995})).step == 3

    p = parse_prune({"dead_experts": {"above": 0}, "drop_rate": {"above": 0.1}})
    assert check(p, {}, _row(1, **{"router.dead_experts": 0.0, "router.drop_rate": 0.05})) is None
    assert check(p, {}, _row(1, **{"router.dead_experts": 2.0})).rule == "dead_experts"
    assert check(p, {}, _row(1, **{"router.dead_experts": 0.0,
                                   "router.drop_rate": 0.2})).rule == "drop_rate"
    assert check(p, {}, _row(1)) is None  # a dense trial reports no router statistics

    p = parse_prune({"transition_jump": {"above": 0.05}})
    assert check(p, {}, _row(0, transition_jump=0.02)) is None
    assert check(p, {}, _row(0, transition_jump=0.2)).values == (0.2,)
    # rows written before transition_jump was reported: val_loss - parent_val_loss at step 0
    assert check(p, {}, _row(0, parent_val_loss=1.9)).values == (pytest.approx(0.1),)
    assert check(p, {}, _row(5, parent_val_loss=1.9)) is None


def test_stopper_stops_and_remembers_the_verdict():
    s = HealthStopper(parse_prune({"max_load_fraction": {"above": 0.5, "for_evals": 2}}))
    assert not s(trial_id="a", result=_row(0, **{"router.max_load": 0.9}))
    assert not s(trial_id="b", result=_row(0, **{"router.max_load": 0.2}))
    assert s(trial_id="a", result=_row(1, **{"router.max_load": 0.8}))
    assert not s(trial_id="b", result=_row(1, **{"router.max_load": 0.3}))
    assert s("a", _row(2)) and s.verdict("a").values == (0.9, 0.8)
    assert s.verdict("b") is None and not s.stop_all()


def test_a_pruned_trial_row_contents_and_summary(tmp_path):
    s = HealthStopper(parse_prune({"dead_experts": {"above": 0}}))
    sink = ResultsSink(tmp_path, flush_s=1e9)
    for t, dead in (("sick", [0.0, 1.0]), ("well", [0.0, 0.0, 0.0])):
        for step, d in enumerate(dead):
            row = {"sweep": "s", "trial_id": t, "step": step, "tokens": step * 10,
                   "val_loss": 3.0 - step, "status": "running", "router.dead_experts": d}
            if s(t, row):  # what ResultsCallback does with the stopper's verdict
                row.update(s.verdict(t).columns())
            sink.add(row)
    sink.mark("sick", "pruned", s.verdict("sick").reason)
    sink.mark("sick", "ok")  # Tune reports the stopped trial as TERMINATED: it stays pruned
    sink.mark("well", "ok")
    sink.close()
    rows = read_rows(tmp_path)
    sick = sorted((r for r in rows if r["trial_id"] == "sick"), key=lambda r: r["step"])
    assert [r["step"] for r in sick] == [0, 1]  # its curve so far is kept
    for r in sick:
        assert r["status"] == "pruned"
        assert r["reason"] == "pruned by dead_experts: router.dead_experts 1 > 0 (step 1)"
        assert (r["prune_rule"], r["prune_metric"], r["prune_value"], r["prune_threshold"],
                r["prune_step"]) == ("dead_experts", "router.dead_experts", 1.0, 0.0, 1)
    assert all(r["status"] == "ok" and r["prune_rule"] is None for r in rows
               if r["trial_id"] == "well")
    table = pq.read_table(tmp_path / "results.parquet")
    assert table.schema.field("prune_value").type == pa.float64()
    assert table.schema.metadata[b"upcycle_sweeps.schema"] == str(SCHEMA_VERSION).encode()
    finals = [max((r for r in rows if r["trial_id"] == t), key=lambda r: r["step"])
              for t in ("sick", "well")]
    summ = summarize(finals, sweep="s", metric="val_loss", mode="min",
                     planned={"trials": 2, "parents": 0, "tokens_saved_by_sharing": 0,
                              "tokens_saved_by_branches": 0},
                     results="r", wall_s=1.0, parent_wall_s=0.0)
    assert (summ["ok"], summ["failed"], summ["pruned"], summ["complete"]) == (1, 0, 1, True)
    assert summ["best"] == 1.0  # the pruned trial's loss is not the best


def test_schema_2_files_gain_the_prune_columns(tmp_path):
    t = pa.table({"trial_id": ["a"], "step": [0], "status": ["ok"], "val_loss": [1.0]})
    pq.write_table(t.replace_schema_metadata({b"upcycle_sweeps.schema": b"2"}),
                   tmp_path / "results.parquet")
    out = read_table(tmp_path)
    for c in (*PRUNE_COLUMNS, "transition_jump", "predicted_final"):
        assert out[c].null_count == 1
    assert out.schema.field("prune_step").type == pa.int64()


def test_analysis_leaves_pruned_trials_out_of_fits_unless_asked():
    df = pd.DataFrame({"trial_id": ["a", "b", "c"], "step": [4, 4, 2],
                       "status": ["ok", "ok", "pruned"], "N1": [1e6, 2e6, 3e6],
                       "tokens": [1e5, 1e5, 5e4], "val_loss": [2.0, 1.9, 2.5]})
    assert set(ok_trials(df)["trial_id"]) == {"a", "b"}
    assert set(ok_trials(df, include_pruned=True)["trial_id"]) == {"a", "b", "c"}
    assert len(load_points(df, "chinchilla", columns={"N": "N1", "D": "tokens"}).L) == 2
    assert len(load_points(df, "chinchilla", columns={"N": "N1", "D": "tokens"},
                           include_pruned=True).L) == 3


def test_asha_rung_metric_is_its_own():
    base = {"model": {"preset": "debug"}, "moe": {"num_experts": 4, "top_k": 1},
            "data": {"source": "synthetic"}, "eval": {"every_steps": 2}, "tokens": 4096,
            "batch": {"global_batch": 8, "micro_batch": 8}}
    raw = {"sweep": "x", "base": base, "algorithm": "random", "num_samples": 3,
           "scheduler": {"kind": "asha", "rung_metric": "predicted_final",
                         "calibration": "results/upcycle_lr", "predictor": "ratio"},
           "prune": {"max_load_fraction": {"above": 0.9}}}
    spec = parse_spec(raw)
    assert spec.prune.rules[0][0] == "max_load_fraction"
    sch = scheduler(spec)
    assert isinstance(sch, RungMetricASHA) and sch._metric == "predicted_final"
    assert sch.set_search_properties("val_loss", "min")  # the Tuner's metric leaves it alone
    assert sch._metric == "predicted_final" and sch._mode == "min"
    plain = scheduler(parse_spec(dict(raw, scheduler={"kind": "asha"})))
    assert not isinstance(plain, RungMetricASHA)
    for sched, match in [
        ({"kind": "asha", "rung_metric": "predicted_final"}, r"needs scheduler\.calibration"),
        ({"kind": "asha", "rung_metric": "val"}, r"scheduler\.rung_metric='val' is not known"),
        ({"kind": "asha", "predictor": "crystal_ball"}, r"scheduler\.predictor='crystal_ball'"),
    ]:
        with pytest.raises(SearchSpaceError, match=match):
            parse_spec(dict(raw, scheduler=sched))
    assert not PruneConfig()


def test_a_trial_asha_stops_before_its_last_step_is_pruned_not_ok(tmp_path):
    """Tune reports an ASHA-stopped trial as completed: its last row is pre-decay, so the
    callback records it as pruned (rule ``asha``, the rung metric and its value), not ok; a
    trial that reached its last step stays ok."""
    from types import SimpleNamespace

    spec = parse_spec({
        "sweep": "asha_stop", "results": str(tmp_path),
        "base": {"model": {"preset": "debug"}, "data": {"source": "synthetic"},
                 "batch": {"global_batch": 4, "micro_batch": 4}, "tokens": 4096,
                 "eval": {"every_steps": 4}},
        "search": {"optim.lr": {"grid": [1e-3, 3e-3]}},
        "scheduler": {"kind": "asha", "grace_period": 1},
        "logging": {"wandb": {"mode": "disabled"}}})
    plan = build_plan(spec)
    cb = ResultsCallback(spec, plan, tmp_path / "asha_stop", flush_s=1e9)
    end = plan.trials[0].config.steps
    trials = [SimpleNamespace(trial_id=f"t{i}", config={"optim.lr": lr}, status="TERMINATED")
              for i, lr in enumerate((1e-3, 3e-3))]
    for tr, last in zip(trials, (4, end)):
        for step in range(0, last + 1, 4):
            cb.on_trial_result(0, trials, tr, {"sweep": "asha_stop", "step": step,
                                               "tokens": step * 512, "val_loss": 5.0 - step / 100,
                                               "status": "running"})
        cb.on_trial_complete(0, trials, tr)
    cb.sink.close()
    rows = {(r["trial_id"], r["step"]): r for r in read_rows(tmp_path / "asha_stop")}
    stopped = rows[("t0", 4)]
    assert stopped["status"] == "pruned" and rows[("t0", 0)]["status"] == "pruned"
    assert (stopped["prune_rule"], stopped["prune_metric"], stopped["prune_step"]) == (
        "asha", "val_loss", 4)
    assert stopped["prune_value"] == pytest.approx(4.96)
    assert stopped["reason"].startswith(f"stopped by ASHA at step 4 of {end}")
    assert {r["status"] for (t, _), r in rows.items() if t == "t1"} == {"ok"}


def test_a_replayed_eval_never_counts_twice():
    """A trial restarted from its last checkpoint re-reports the evals after it: the streak is
    rewound to the replayed step, so 2 evals over the threshold replayed once are still 2."""
    p = parse_prune({"max_load_fraction": {"above": 0.5, "for_evals": 3}})
    state: dict = {}
    for step, v in [(0, 0.2), (2, 0.9), (4, 0.8)]:
        assert check(p, state, _row(step, **{"router.max_load": v})) is None
    assert check(p, state, _row(4, **{"router.max_load": 0.8})) is None  # replayed: still 2
    assert check(p, state, _row(2, **{"router.max_load": 0.9})) is None  # from further back
    assert check(p, state, _row(4, **{"router.max_load": 0.8})) is None
    v = check(p, state, _row(6, **{"router.max_load": 0.7}))
    assert (v.values, v.step) == ((0.9, 0.8, 0.7), 6)
    # a replay may differ from the first report (nondeterministic kernels): the new value wins
    state = {}
    for step, v in [(2, 0.9), (4, 0.8), (4, 0.3), (6, 0.7), (8, 0.7)]:
        assert check(p, state, _row(step, **{"router.max_load": v})) is None


def test_a_resumed_sweep_keeps_each_unfinished_trials_streak(tmp_path):
    """``--resume``: Tune restores the stopper as it was pickled at the sweep's start (empty),
    in one pickle with the results callback that holds it; the callback's ``setup`` replays the
    recorded rows of every unfinished trial into it, so a streak that began before the crash
    ends where it would have without one."""
    rules = {"max_load_fraction": {"above": 0.5, "for_evals": 3}}
    sp = parse_spec({"sweep": "s", "base": {"model": {"preset": "debug"}},
                     "search": {"seed": {"grid": [0, 1]}}, "prune": rules,
                     "results": str(tmp_path)})
    res = tmp_path / "s"
    sink = ResultsSink(res, flush_s=1e9)
    for t, loads in (("a", [0.2, 0.9, 0.8]), ("done", [0.9, 0.9])):
        for step, v in enumerate(loads):
            sink.add({"sweep": "s", "trial_id": t, "step": step, "tokens": step * 10,
                      "val_loss": 2.0, "status": "running", "router.max_load": v})
    sink.mark("done", "ok")
    sink.close()

    stopper = HealthStopper(parse_prune(rules))
    cb = ResultsCallback(sp, build_plan(sp), res, flush_s=1e9, health=stopper)
    cb.setup(stop={}, num_samples=1)  # what Tune passes: its dict of stop criteria
    assert "done" not in stopper.state
    assert not stopper("a", _row(2, **{"router.max_load": 0.8}))  # the checkpoint's replay
    assert stopper("a", _row(3, **{"router.max_load": 0.7}))
    assert stopper.verdict("a").values == (0.9, 0.8, 0.7)
    cb.sink.close()
    # rows that already fire (the driver died between the stopper's decision and Tune's): the
    # trial stops at its first row after the resume, with the verdict of the recorded rows
    s2 = HealthStopper(parse_prune(rules))
    v = s2.restore("b", [_row(i, **{"router.max_load": 0.9}) for i in (2, 1, 0)])
    assert v is not None and v.step == 2 and s2("b", _row(1))


def test_asha_rungs_survive_a_resume(tmp_path):
    """Tune restores the scheduler as pickled at the sweep's start and hands it every restored
    trial (``on_trial_add``); ``ResumableASHA`` then replays each trial's ``result.json`` into
    its rungs. The rungs equal those of the scheduler that never stopped, and a trial going on
    after the resume is stopped where it would have been; Ray's own ASHA lets it through."""
    kw = dict(time_attr="training_iteration", metric="val_loss", mode="min", max_t=10,
              grace_period=1, reduction_factor=2)
    curves = {"a": [2.0, 1.8, 1.7, 1.6], "b": [1.9, 1.7, 1.6, 1.5], "c": [1.8, 1.6, 1.55]}
    live = ResumableASHA(**kw)
    trials = {}
    for tid, losses in curves.items():
        (tmp_path / tid).mkdir()
        trials[tid] = SimpleNamespace(trial_id=tid, path=str(tmp_path / tid))
        live.on_trial_add(None, trials[tid])
        with open(tmp_path / tid / "result.json", "w") as f:
            for it, v in enumerate(losses, 1):
                res = {"training_iteration": it, "val_loss": v}
                assert live.on_trial_result(None, trials[tid], res) == "CONTINUE"
                f.write(json.dumps(res) + "\n")
        f = tmp_path / tid / "result.json"
        f.write_text(f.read_text() + '{"training_iteration": 9, "val_lo')  # cut by a kill
    restored, plain = ResumableASHA(**kw), ASHAScheduler(**kw)
    for tid in curves:
        restored.on_trial_add(None, trials[tid])
        plain.on_trial_add(None, trials[tid])
    assert restored._brackets[0]._rungs == live._brackets[0]._rungs
    assert all(not rec for _, rec in plain._brackets[0]._rungs)
    nxt = {"training_iteration": 4, "val_loss": 1.7}  # c goes on: worse than a and b at 4
    assert live.on_trial_result(None, trials["c"], nxt) == "STOP"
    assert restored.on_trial_result(None, trials["c"], nxt) == "STOP"
    assert plain.on_trial_result(None, trials["c"], nxt) == "CONTINUE"
    new = SimpleNamespace(trial_id="d", path=str(tmp_path / "d"))  # no folder yet
    restored.on_trial_add(None, new)
    assert restored.on_trial_result(None, new, {"training_iteration": 1, "val_loss": 3.0}) == \
        "STOP"

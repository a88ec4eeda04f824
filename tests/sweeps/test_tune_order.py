"""The plan lists its trials in the order Ray Tune starts them (``SearchSpace.tune_points``),
so the ``--dry-run`` forecast schedules what runs: checked against Tune's own variant generator."""

from __future__ import annotations

from pathlib import Path

import pytest

from moe_core.train.config import TrainConfig
from sweeps.plan import cost
from sweeps.plan.build import build_plan
from sweeps.spec.space import SearchSpace
from sweeps.spec.sweep import load_spec, parse_spec
from sweeps.spec.trials import iter_grid
from tests.sweeps.tiny import tiny_base

ROOT = Path(__file__).parents[2]


def _spec(**over):
    base = tiny_base(parent={"tokens": 512, "seed": 0}, moe={"num_experts": 4, "top_k": 2},
                     upcycle={"method": "dense_to_moe"}, tokens=1024)
    return parse_spec({"sweep": "order", "base": base, **over})


def test_tune_points_sort_the_knobs_by_key_and_vary_the_first_fastest():
    space = SearchSpace.parse({"optim.lr": {"grid": [1, 2]}, "batch.global_batch": [8, 16],
                               "moe.top_k": {"choice": [1, 2]}}, TrainConfig, seeds=(0, 1))
    # sorted: batch.global_batch, optim.lr, seed; each point keeps the spec's key order
    assert list(space.tune_points()) == [
        {"optim.lr": lr, "batch.global_batch": b, "seed": s}
        for s in (0, 1) for lr in (1, 2) for b in (8, 16)]
    assert [list(p) for p in space.tune_points()][0] == ["optim.lr", "batch.global_batch", "seed"]
    assert sorted(map(str, space.tune_points())) == sorted(map(str, space.grid_points()))
    assert list(SearchSpace().tune_points()) == [{}]


def test_the_plan_and_the_forecast_take_the_trials_in_the_order_tune_starts_them():
    """Tune's BasicVariantGenerator (the grid and random algorithms) on the param_space the
    driver passes: its trials' grid values, and so their parents, in the plan's order, sample
    after sample; a sampled knob, a conditional grid and an expr knob leave the order alone."""
    from ray.tune.experiment import Experiment
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from sweeps.spec.algorithm import plugin

    spec = _spec(algorithm="random", num_samples=2, seeds=[0, 1], resources={"gpus": 1}, search={
        "parent.tokens": {"grid": [512, 1024]}, "moe.router.aux_coef": {"grid": [0.01, 0.02]},
        "upcycle.router_noise": {"grid": [0.0, 0.1], "when": {"parent.tokens": 1024}},
        "optim.lr": {"uniform": [1e-4, 1e-3]}, "eval.batches": {"expr": "1 + moe.top_k"}})
    plan = build_plan(spec)
    gen = BasicVariantGenerator()
    gen.add_configurations(Experiment("order", run=lambda c: None, num_samples=spec.num_samples,
                                      config=plugin(spec.algorithm).param_space(spec)))
    started = []
    while (trial := gen.next_trial()) is not None:
        started.append(trial.config)
    keys = list(plan.trials[0].point)
    assert len(started) == plan.num_trials == 2 * 2 * 2 * 2 * 2
    assert [{k: c[k] for k in keys} for c in started] == \
        [t.point for t in plan.trials] * spec.num_samples
    assert [list(iter_grid(spec))[i] for i in (0, 1)] != [t.point for t in plan.trials[:2]]
    jobs = cost.jobs_from_plan(spec, plan, "h100", 4)
    assert [j.key for j in jobs if j.kind == "trial"] == [
        plan.trial(spec, {k: c[k] for k in keys}).parent_key for c in started]


def test_the_forecast_of_two_parents_follows_tunes_order():
    """docs/cluster.md §4's proof shape: Tune runs the fast parent's trials first (aux_coef,
    first by name, varies fastest); the plan's old order interleaved the parents."""
    spec = _spec(search={"moe.router.aux_coef": {"grid": [0.01, 0.02]},
                         "parent.tokens": {"grid": [512, 4096]}}, resources={"gpus": 1})
    plan = build_plan(spec)
    assert [t.point["parent.tokens"] for t in plan.trials] == [512, 512, 4096, 4096]
    jobs = cost.jobs_from_plan(spec, plan, "h100", 2)
    f = cost.forecast(jobs, "h100", concurrency=2, parents_parallel=2, table=[],
                      policy="own_parent")
    secs = {j.key: j.tokens / (cost.rate([], "h100", j.preset, cost.moe_shape(j.cfg.moe),
                                          cost.flops_per_token(j.cfg, j.seq)).tokens_per_s)
            for j in jobs if j.kind == "parent"}
    trial = next(j for j in jobs if j.kind == "trial")
    t = trial.tokens / cost.rate([], "h100", trial.preset, cost.moe_shape(trial.cfg.moe),
                                 cost.flops_per_token(trial.cfg, trial.seq)).tokens_per_s
    fast, slow = sorted(secs.values())
    # both parents start at 0 on the 2 GPUs; the fast one's trials follow on its GPU, the slow
    # one's first trial takes the slow parent's GPU when it ends, the last the first free GPU
    assert slow > fast + 2 * t  # (so the fast parent's trials are done first)
    assert f.wall_h * 3600 == pytest.approx(slow + t)


def test_the_demo_runs_its_trials_in_the_same_order_as_before():
    """``make demo`` (upcycle_lr: the LR policy × seed; ``seed`` sorts first) and the cluster
    recipe list their trials as before, so their forecasts and finals do not move."""
    for f in ("upcycle_lr.yaml", "cluster/upcycle_lr_8xh100.yaml"):
        spec = load_spec(str(ROOT / "search_spaces" / f), results="/tmp/unused")
        assert list(spec.space.tune_points()) == list(iter_grid(spec))

"""Token-budget grids run as WSD decay branches of one shared stable run, with results equal
(bit for bit on CPU) to training each budget on its own; a law sweep's rows equal the grid's
with branches. One grid sweep (the module's fixture) serves both comparisons."""

import json

import pytest

from sweeps.plan.build import build_plan
from sweeps.spec.sweep import parse_spec
from tests.sweeps.tiny import run_sweep_cli

SPEC = {
    "sweep": "dgrid",
    "base": {
        "model": {"preset": "debug"},
        "moe": {"num_experts": 4, "top_k": 2},
        "data": {"source": "synthetic", "synthetic_vocab": 32, "synthetic_tokens": 60000,
                 "seq_len": 32},
        "batch": {"global_batch": 8, "micro_batch": 8},
        "optim": {"lr": 3e-3},
        "schedule": {"kind": "wsd", "warmup_steps": 2, "decay_frac": 0.25},
        # every 3 steps: budgets of 4 and 8 steps end between periodic evals (their final
        # eval must still be reported), the 4-step budget's decay starts after the last one
        "eval": {"every_steps": 3, "batches": 2},
        "tokens": 2048,
    },
    "search": {"tokens": {"grid": [1024, 1536, 2048]}},
    "logging": {"wandb": {"enabled": False}},
}
LAW = {"law": "chinchilla", "target": "loss_at", "loss_at": {"N": 8, "D": 1536},
       # the law's N is any positive config key here: two trials never reach a refit
       "variables": {"N": "batch.global_batch", "D": "tokens"},
       "seed_trials": 2, "max_trials": 2, "ci_width": None, "bootstrap": 10}


def test_plan_groups_budgets():
    spec = parse_spec(SPEC)
    plan = build_plan(spec)
    assert len(plan.branch_groups) == 1
    g = next(iter(plan.branch_groups.values()))
    # T = 4, 6, 8 steps; decay = round(0.25·T) = 1, 2, 2 → decay starts 3, 4, 6
    assert g.starts == {1024: 3, 1536: 4, 2048: 6} and g.steps == [3, 4, 6]
    assert g.representative.config.tokens == 2048  # the stable run covers every start
    assert plan.tokens_saved_by_branches == (3 + 4) * 256
    assert all(plan.branch_of(t) is g for t in plan.trials)
    assert [t.decay_start for t in plan.trials] == [3, 4, 6]
    off = build_plan(parse_spec(dict(SPEC, wsd_branches=False)))
    assert off.branch_groups == {} and off.tokens_saved_by_branches == 0


def test_multi_rank_trials_branch_at_zero_0_only():
    """A stable run trains on one rank; a multi-rank branch re-cuts its checkpoint for its
    ranks (``moe_core.train``), which ZeRO 1/2 partitions do not allow."""
    multi = dict(SPEC, resources={"ranks": 2},
                 base=dict(SPEC["base"], batch={"global_batch": 8, "micro_batch": 4}))
    assert len(build_plan(parse_spec(multi)).branch_groups) == 1
    zero1 = dict(multi, base=dict(multi["base"], optim={"lr": 3e-3, "zero_stage": 1}))
    assert build_plan(parse_spec(zero1)).branch_groups == {}


def test_plan_is_built_once_and_typed():
    """Every grid trial carries its TrainConfig; sampled points are planned on demand."""
    spec = parse_spec(dict(SPEC, num_samples=2))
    plan = build_plan(spec)
    assert plan.num_trials == 6 and len(plan.trials) == 3
    t = plan.trials[1]
    assert plan.trial(spec, {"tokens": 1536}) is t  # looked up, not rebuilt
    assert t.knobs == {"tokens": 1536} and t.config.tokens == 1536
    assert plan.trial_tokens == 2 * (1024 + 1536 + 2048)
    assert plan.estimates()["trials"] == 6
    other = plan.trial(spec, {"tokens": 512})  # e.g. a point a searcher sampled
    assert other.config.tokens == 512 and other not in plan.trials


def _run(tmp_path, name, branches):
    return run_sweep_cli(tmp_path, name, dict(SPEC, wsd_branches=branches))


@pytest.fixture(scope="module")
def with_branches(tmp_path_factory):
    """The grid as WSD branches of one stable run (sweep ``with``, under ``root/r``): its rows
    and ``root``; both sweep tests below compare with it."""
    root = tmp_path_factory.mktemp("with")
    return _run(root, "with", True), root


@pytest.mark.slow
@pytest.mark.distributed
def test_branches_equal_separate_runs(tmp_path, with_branches):
    br, root = with_branches
    sep = _run(tmp_path, "without", False)

    def curves(rows):
        out = {}
        for r in rows:
            out.setdefault(r["tokens_budget"], {})[r["step"]] = r["val_loss"]
        return out

    cb, cs = curves(br), curves(sep)
    assert set(cb) == set(cs) == {1024, 1536, 2048}
    for c in (cb, cs):  # every trial reports its final eval, at its last step
        assert {b: max(c[b]) for b in c} == {1024: 4, 1536: 6, 2048: 8}
        assert sorted(c[1024]) == [0, 3, 4] and sorted(c[2048]) == [0, 3, 6, 8]
    for budget in cs:
        assert cb[budget].keys() == cs[budget].keys()
        for step in cs[budget]:
            assert cb[budget][step] == cs[budget][step], (budget, step)
    for rows in (br, sep):  # wall_s counts from each trial's own start, branches included
        for t in {r["trial_id"] for r in rows}:
            walls = [r["wall_s"] for r in sorted((r for r in rows if r["trial_id"] == t),
                                                 key=lambda r: r["step"])]
            assert walls == sorted(walls), (t, walls)
    assert (root / "r" / "with" / "stable").is_dir()
    assert {r.get("branch_from_step") for r in br if r["tokens_budget"] == 2048} == {6}


@pytest.mark.slow
@pytest.mark.distributed
def test_law_trials_branch_from_an_on_demand_stable_run(tmp_path, with_branches):
    """A law sweep picks budgets 1024 and 1536 of the group {1024, 1536, 2048} (two trials at
    once): both branch from one stable run trained only to step 4 (1536's decay start, not
    2048's 6), and every row equals the same points run as a grid with WSD branches (the
    module's grid sweep: its stable run goes on to step 6, its first 4 steps are the same)."""
    law = {**SPEC, "algorithm": "law", "law": LAW, "max_concurrent": 2}
    lr = run_sweep_cli(tmp_path, "law", law)
    gr = [r for r in with_branches[0] if r["tokens_budget"] in (1024, 1536)]

    def curves(rows):
        out = {}
        for r in rows:
            out.setdefault(r["tokens_budget"], {})[r["step"]] = (r["val_loss"], r["train_loss"])
        return out

    cl, cg = curves(lr), curves(gr)
    assert set(cl) == set(cg) == {1024, 1536}
    assert cl == cg  # bit for bit, every eval of both trials
    assert {b: sorted(c) for b, c in cl.items()} == {1024: [0, 3, 4], 1536: [0, 3, 6]}
    assert {(r["tokens_budget"], r["branch_from_step"]) for r in lr} == {(1024, 3), (1536, 4)}
    for t in {r["trial_id"] for r in lr}:  # wall_s counts the stable run's seconds too
        walls = [r["wall_s"] for r in sorted((r for r in lr if r["trial_id"] == t),
                                             key=lambda r: r["step"])]
        assert walls == sorted(walls) and walls[-1] > walls[1] > 0, (t, walls)
    (st,) = (tmp_path / "r" / "law" / "stable").glob("*/stable.json")
    m = json.loads(st.read_text())
    assert sorted(int(s) for s in m["steps"]) == [3, 4]  # never trained to 2048's start (6)
    assert not (st.parent / "step_00000006").exists()
    summary = json.loads((tmp_path / "r" / "law" / "summary.json").read_text())
    assert summary["tokens_saved_by_branches"] == 3 * 256 and summary["complete"]
    assert summary["law"]["stop"] == "max_trials" and summary["law"]["trials"] == 2
    assert summary["law"]["estimate"] is None  # two trials never reach a refit

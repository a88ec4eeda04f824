"""sweeps.plan.schedule: trials start as soon as their own parent is ready (by hand), and the
forecast's idle share follows the policy."""

from __future__ import annotations

import pytest

from moe_core.presets import model_config
from sweeps.plan import cost
from sweeps.plan.schedule import BARRIER, OWN_PARENT, Task, makespan, policy_for, schedule

# two parents (A: 1 h, B: 3 h) on 1 GPU each, two 2-h trials of each, 4 GPUs in all
TASKS = [Task("A", 1.0, 1), Task("B", 3.0, 1)] + [
    Task(f"{p}{i}", 2.0, 1, p) for p in "AB" for i in range(2)]


def test_a_trial_whose_parent_is_ready_starts_before_the_other_parent_finishes():
    own = schedule(TASKS, 4, OWN_PARENT)
    # A's trials take the 3 GPUs free once A is done (t = 1), while B still trains
    assert own["A"] == (0, 1) and own["B"] == (0, 3)
    assert own["A0"] == (1, 3) and own["A1"] == (1, 3)
    assert own["B0"] == (3, 5) and own["B1"] == (3, 5) and makespan(own) == 5
    bar = schedule(TASKS, 4, BARRIER)  # every trial waits for B
    assert {bar[n][0] for n in ("A0", "A1", "B0", "B1")} == {3} and makespan(bar) == 5
    # on 3 GPUs the barrier runs the 4 trials in two waves after B: 7 h against 5 h
    own3, bar3 = schedule(TASKS, 3), schedule(TASKS, 3, BARRIER)
    assert (own3["A0"][0], own3["B1"][0], makespan(own3)) == (1, 3, 5)
    assert makespan(bar3) == 7


def test_a_trial_waiting_for_its_parent_holds_its_gpu_as_in_the_driver():
    # Tune starts B0 first: it takes the free GPU at 0 and waits there for B (3 h); A's trial
    # gets a GPU only when A is done
    s = schedule([Task("A", 1, 1), Task("B", 3, 1), Task("B0", 2, 1, "B"),
                  Task("A0", 2, 1, "A")], 3)
    assert s["B0"] == (3, 5) and s["A0"] == (1, 3)


def test_trials_without_a_trained_parent_start_at_once_and_wide_jobs_wait_for_room():
    s = schedule([Task("P", 2, 1), Task("x", 1, 2), Task("y", 1, 3, "P")], 3)
    assert s["P"] == (0, 2) and s["x"] == (0, 1) and s["y"] == (2, 3)
    with pytest.raises(ValueError, match="policy='fifo'"):
        schedule(TASKS, 4, "fifo")


def test_policy_for():
    assert policy_for(True, 0, 2, 64) == OWN_PARENT
    assert policy_for(False, 0, 2, 64) == BARRIER  # algorithm: law trains them in the trials
    assert policy_for(True, 1, 2, 64) == BARRIER  # WSD stable runs need every parent first
    assert policy_for(True, 0, 65, 64) == BARRIER  # not every parent task fits at once


def test_forecast_overlaps_parents_with_other_parents_trials():
    m = model_config("debug", vocab_size=512, max_seq_len=128)
    tps = 0.35 * 989e12 / cost.flops_per_token(m, 128)
    jobs = [cost.Job("parent", 10**6, m, "debug", 128, 1.0, "a"),
            cost.Job("parent", 3 * 10**6, m, "debug", 128, 1.0, "b")] + [
        cost.Job("trial", 2 * 10**6, m, "debug", 128, 1.0, k) for k in "aabb"]
    h = 1e6 / tps / 3600  # the 1-h unit of TASKS above
    bar = cost.forecast(jobs, "h100", concurrency=3, parents_parallel=3, table=[])
    own = cost.forecast(jobs, "h100", concurrency=3, parents_parallel=3, table=[],
                        policy=OWN_PARENT)
    assert bar.wall_h == pytest.approx(7 * h) and own.wall_h == pytest.approx(5 * h)
    assert own.gpu_hours == pytest.approx(bar.gpu_hours) and bar.gpu_hours == pytest.approx(12 * h)
    assert own.idle_share == pytest.approx(1 - 12 / 15)
    assert bar.idle_share == pytest.approx(1 - 12 / 21)
    assert own.pre_wall_h == pytest.approx(3 * h)
    assert "each trial starts once its own parent is ready" in own.lines()[1]


def _recipe_64(tmp_path, parent_ranks):
    """docs/preflight-and-cost.md's 8x8 H100 recipe at 64 one-GPU trials (32 LRs x 2 seeds) of
    one parent."""
    from pathlib import Path

    import yaml

    from sweeps.plan.build import build_plan
    from sweeps.spec.sweep import load_spec

    src = Path(__file__).parents[2] / "search_spaces" / "cluster" / "upcycle_lr_8xh100.yaml"
    s = yaml.safe_load(src.read_text())
    s["search"] = {"upcycle.lr_policy": {"grid": [
        {"policy": "reset", "peak": float(f"{1e-3 * 1.08 ** i:.4g}")} for i in range(32)]}}
    s["resources"]["ranks"], s["max_concurrent"] = 1, 64
    s["resources"]["parent_ranks"] = parent_ranks
    s["base"]["optim"]["expert_parallel"], s["results"] = 1, str(tmp_path / "r")
    (tmp_path / "r64.yaml").write_text(yaml.safe_dump(s))
    spec = load_spec(str(tmp_path / "r64.yaml"))
    return spec, build_plan(spec)


def test_the_8x8_h100_recipe_idles_37_percent_with_a_one_rank_parent_6_with_auto(tmp_path):
    """docs/preflight-and-cost.md's figures: with its one parent on one GPU (parent_ranks 1,
    the default) the 64 trials idle 37.5 % of the reserved GPU-hours whether or not they wait
    for all parents (there is one); with parent_ranks auto the parent trains on 8 ranks (the
    cap; 512 sequences split into 8 x 4 micro-batches of 16) and the idle share is 6.3 %, the
    GPU-hours unchanged (linear scaling assumed)."""
    spec, plan = _recipe_64(tmp_path, 1)
    jobs = cost.jobs_from_plan(spec, plan, "h100", 64)
    assert len(plan.parents) == 1 and sum(j.kind == "trial" for j in jobs) == 64
    assert [j.accelerators for j in jobs if j.kind == "parent"] == [1.0]
    assert policy_for(True, len(plan.branch_groups), 1, 64) == OWN_PARENT
    f = {p: cost.forecast(jobs, "h100", concurrency=64, parents_parallel=64, table=[], policy=p)
         for p in (BARRIER, OWN_PARENT)}
    assert f[BARRIER].idle_share == pytest.approx(f[OWN_PARENT].idle_share)
    assert f[OWN_PARENT].idle_share == pytest.approx(0.375, abs=5e-4)
    import dataclasses

    spec8, plan8 = dataclasses.replace(spec, resources=dataclasses.replace(
        spec.resources, parent_ranks="auto")), plan
    wide = cost.jobs_from_plan(spec8, plan8, "h100", 64)
    assert [j.accelerators for j in wide if j.kind == "parent"] == [8.0]
    w = cost.forecast(wide, "h100", concurrency=64, parents_parallel=64, table=[],
                      policy=OWN_PARENT)
    assert w.idle_share == pytest.approx(0.063, abs=5e-4) and w.idle_share <= 0.10
    assert w.gpu_hours == pytest.approx(f[OWN_PARENT].gpu_hours)
    assert w.wall_h == pytest.approx(f[OWN_PARENT].wall_h - 7 / 8 * f[OWN_PARENT].pre_wall_h)
    assert cost.jobs_from_plan(spec8, plan8, "cpu", 64)[-1].accelerators == 1.0  # CPU: 1 rank
    from sweeps.run.console import parent_ranks_line  # what --dry-run prints

    line = parent_ranks_line(spec8, cost.parent_rank_counts(spec8, plan8, "h100", 64))
    assert line.startswith("  parents: ") and " on 8 ranks (resources.parent_ranks=auto" in line


def test_a_multi_rank_parent_shortens_the_wait_of_the_trials_that_hold_the_other_gpus():
    # one 8-h parent on 1 GPU, or on 4 (2 h): 4 one-GPU trials of 1 h on 4 GPUs. Its ranks take
    # 4 GPUs first; the trials wait for them, then run on the 4 GPUs the parent gave back
    one = schedule([Task("P", 8.0, 1)] + [Task(f"t{i}", 1.0, 1, "P") for i in range(4)], 4)
    four = schedule([Task("P", 2.0, 4)] + [Task(f"t{i}", 1.0, 1, "P") for i in range(4)], 4)
    assert makespan(one) == 9 and makespan(four) == 3
    assert {four[f"t{i}"] for i in range(4)} == {(2.0, 3.0)}


def test_parent_ranks_auto_fills_the_waiting_gpus_within_the_cap_and_the_batch():
    import dataclasses

    from moe_core.errors import SearchSpaceError
    from moe_core.train.config import (
        BatchConfig,
        MoEConfig,
        ParentConfig,
        TrainConfig,
        UpcycleConfig,
    )
    from sweeps.plan.resources import PARENT_RANKS_AUTO_CAP, parent_ranks
    from sweeps.spec.sweep import Resources, SweepSpec

    def spec(pr):
        return SweepSpec(name="t", base={}, search={}, resources=Resources(parent_ranks=pr))

    child = TrainConfig(batch=BatchConfig(global_batch=48, micro_batch=4), moe=MoEConfig(),
                        parent=ParentConfig(tokens=1000))
    assert parent_ranks(spec(1), child, 1.0, 64) == 1  # the default: as before
    assert parent_ranks(spec("auto"), child, 1.0, 64) == 6  # 48 = 6 x 2 x 4; 8 does not split
    assert PARENT_RANKS_AUTO_CAP == 8 and parent_ranks(spec("auto"), child, 1.0, 5) == 4
    assert parent_ranks(spec("auto"), child, 0.0, 64) == 1  # on the CPU
    assert parent_ranks(spec("auto"), child, 0.5, 64) == 1  # shared GPUs
    assert parent_ranks(spec(3), child, 1.0, 1) == 3  # as given
    with pytest.raises(SearchSpaceError, match=r"^resources.parent_ranks=5: .*global_batch=48"):
        parent_ranks(spec(5), child, 1.0, 64)
    moe = dataclasses.replace(child, parent=ParentConfig(tokens=1000, moe=MoEConfig()),
                              upcycle=UpcycleConfig(method="continue"))
    assert parent_ranks(spec("auto"), moe, 1.0, 64) == 1
    with pytest.raises(SearchSpaceError, match="MoE parent.*set resources.parent_ranks: 1"):
        parent_ranks(spec(2), moe, 1.0, 64)
    with pytest.raises(SearchSpaceError, match="^resources.parent_ranks=0 must be an integer"):
        Resources(parent_ranks=0)

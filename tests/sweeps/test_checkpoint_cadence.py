"""Checkpoint cadence (every eval reported, checkpoints on their own cadence), the GPU request of
parent and stable-run tasks, and the disk-use estimate of ``--dry-run``; all without Ray
running."""

import copy

import pytest
import yaml
from ray._common.ray_option_utils import validate_task_options

from moe_core.errors import SearchSpaceError
from moe_core.params import count_params
from sweeps.plan.build import build_plan, disk_estimate, tied_copy_bytes
from sweeps.run import console
from sweeps.run.cli import main
from sweeps.run.parents import _train_parent_task, _train_stable_task, task_options
from sweeps.run.trial import CheckpointCadence, TrialReporter
from sweeps.spec.sweep import CheckpointSpec, parse_spec
from tests.sweeps.tiny import tiny_base

BASE = tiny_base(moe={"num_experts": 4, "top_k": 2},
                 data={"source": "synthetic", "synthetic_vocab": 32, "seq_len": 32},
                 batch={"global_batch": 8, "micro_batch": 4},
                 parent={"tokens": 2048, "seed": 0}, upcycle={"method": "dense_to_moe"})


def spec(**over):
    raw = {"sweep": "t", "base": copy.deepcopy(BASE),
           "search": {"tokens": {"grid": [1024, 2048]}}}
    raw.update(over)
    return parse_spec(raw)


# ---- the spec section --------------------------------------------------------------------------


def test_checkpoint_section_defaults_and_rules():
    assert spec().checkpoint == CheckpointSpec(every_evals=None, every_minutes=10.0, keep=1,
                                               at_end=True)
    c = spec(checkpoint={"every_evals": "3", "every_minutes": None, "keep": 2}).checkpoint
    assert (c.every_evals, c.every_minutes, c.keep) == (3, None, 2)
    for bad, msg in [({"every_evals": 0}, r"checkpoint\.every_evals=0"),
                     ({"every_minutes": 0}, r"checkpoint\.every_minutes=0"),
                     ({"keep": 0}, r"checkpoint\.keep=0"),
                     ({"every": 1}, r"unknown key checkpoint\.every")]:
        with pytest.raises(SearchSpaceError, match=msg):
            spec(checkpoint=bad)


# ---- the cadence -------------------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_every_n_evals_by_step_and_the_last_step():
    c = CheckpointCadence(CheckpointSpec(every_evals=2, every_minutes=None), 3)
    assert [s for s in (3, 6, 9, 12, 14) if c(s, s == 14)] == [6, 12, 14]
    c = CheckpointCadence(CheckpointSpec(every_evals=None, every_minutes=None, at_end=False), 3)
    assert not any(c(s, s == 14) for s in (3, 6, 9, 12, 14))


def test_every_m_minutes_from_the_last_checkpoint():
    clock = Clock()
    c = CheckpointCadence(CheckpointSpec(every_minutes=10.0), 1, clock=clock)
    out = []
    for step, minute in [(1, 4), (2, 9.9), (3, 10.1), (4, 15), (5, 20), (6, 20.2)]:
        clock.t = 60 * minute
        out.append(c(step, False))
    assert out == [False, False, True, False, False, True]  # at 10.1, then 10.1 + 10.1
    clock.t = 60 * 20.5
    assert c(7, True)  # the last step, whatever the clock


class FakeCheckpoint:
    @staticmethod
    def from_directory(path):
        return ("ckpt", path)


def test_reporter_reports_every_eval_attaches_when_given_and_keeps_one_local(tmp_path):
    sent = []
    r = TrialReporter({"N2": 10}, lambda row, checkpoint=None: sent.append((row["step"],
                                                                            checkpoint)),
                      FakeCheckpoint)
    dirs = []
    for step in (0, 2, 4, 6, 8):
        ck = None
        if step in (4, 8):
            ck = tmp_path / f"step_{step}"
            ck.mkdir()
            dirs.append(ck)
        r.on_eval({"step": step, "tokens": step * 256, "val_loss": 1.0}, ck)
    assert [s for s, _ in sent] == [0, 2, 4, 6, 8]
    assert [s for s, c in sent if c is not None] == [4, 8]
    assert not dirs[0].exists() and dirs[1].exists()  # Ray has its copy: the older one goes
    # a rank other than 0 reports the row but neither attaches nor deletes
    other = tmp_path / "other"
    other.mkdir()
    r2 = TrialReporter({"N2": 10}, lambda row, checkpoint=None: sent.append(checkpoint),
                       FakeCheckpoint, attach=False)
    r2.on_eval({"step": 2, "tokens": 512}, other)
    assert sent[-1] is None and other.exists()


# ---- parent and stable-run tasks reserve what a trial rank does ---------------------------------


@pytest.mark.parametrize("res", [{"cpus": 1, "gpus": 0}, {"cpus": 4, "gpus": 1},
                                 {"cpus": 2, "gpus": 0.5}, {"cpus": 2, "gpus": 1, "ranks": 2}])
def test_task_options_carry_the_gpu_request(res):
    s = spec(resources=res)
    opts = task_options(s)
    assert opts == {"num_cpus": res["cpus"], "num_gpus": res["gpus"]}  # per rank
    validate_task_options({**opts, "max_retries": 0}, in_options=True)  # Ray takes them
    for task in (_train_parent_task, _train_stable_task):
        assert task._default_options["max_calls"] == 1  # the worker exits: GPU memory freed


# ---- plan: disk use, no WSD branches across ranks -----------------------------------------------


def test_disk_estimate_by_hand():
    s = spec(max_concurrent=2, checkpoint={"keep": 2})
    plan = build_plan(s)
    d = disk_estimate(s, plan)
    n = count_params(plan.trials[0].config.model_config()).total
    n_parent = count_params(plan.trials[0].config.parent_run().model_config()).total
    assert d.params == n and d.bytes_per_param == 12  # fp32 on CPU
    assert d.checkpoint_bytes == 12 * n
    assert d.kept_bytes == 2 * 2 * 12 * n  # keep 2 × 2 trials
    assert d.running_bytes == 2 * (2 + 2) * 12 * n
    assert d.parent_bytes == 12 * n_parent
    pm = plan.trials[0].config.parent_run().model_config()  # the fp32 weights Ray holds
    assert d.object_store_bytes == 4 * n_parent + tied_copy_bytes(pm)
    g = next(iter(plan.branch_groups.values()))
    assert d.stable_bytes == len(g.steps) * 12 * n
    gpu = disk_estimate(spec(resources={"cpus": 1, "gpus": 1}), plan)
    # bf16 on a GPU at ZeRO 0: optim.bf16_mode auto is torch_autocast, fp32 weights + AdamW
    assert gpu.bytes_per_param == 12 and gpu.parent_bytes == 12 * n_parent
    base = copy.deepcopy(BASE)
    base["optim"] = {**base.get("optim", {}), "bf16_mode": "deepspeed"}
    wrapped = spec(base=base, resources={"cpus": 1, "gpus": 1})
    w = disk_estimate(wrapped, build_plan(wrapped))
    assert w.bytes_per_param == 14 and w.parent_bytes == 16 * n_parent  # bf16 + fp32 master
    line = console.disk_line(s, plan)
    assert line.startswith("disk (estimate): checkpoint ") and "parents' cache" in line


def test_dry_run_prints_the_disk_line(tmp_path, capsys):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"sweep": "t", "base": BASE,
                                 "search": {"tokens": {"grid": [1024, 2048]}}}))
    assert main([str(f), "--dry-run"]) == 0
    assert "disk (estimate)" in capsys.readouterr().out

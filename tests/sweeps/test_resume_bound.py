"""``--resume`` is bound to its folder and runs what it says (issue 43, classes 1 and 6): a copied
results folder resumes in place and never writes into the folder it was copied from; a changed
scheduler, prune rule or metric is refused naming the keys; a missing ``spec.json``, a garbage
``spec.json`` and a garbage ``experiment_state`` are each refused in one line with exit 2."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from moe_core.errors import SearchSpaceError
from sweeps.run import guard
from sweeps.run.resume import UnsoundStateError, check_tune_state
from sweeps.spec.sweep import AshaConfig, parse_spec
from tests.sweeps.tiny import tiny_base

SPEC = {
    "sweep": "bound",
    "base": tiny_base(moe={"num_experts": 4, "top_k": 2}),
    "search": {"optim.lr": {"grid": [1e-3, 2e-3]}},
    "logging": {"wandb": {"mode": "disabled"}},
    "max_concurrent": 1,
}


def _spec(**over):
    return parse_spec({**json.loads(json.dumps(SPEC)), **over})


# ---- class 6: the whole spec is compared (cheap, no Ray) ----------------------------------------


@pytest.mark.parametrize(("over", "keys"), [
    ({"scheduler": {"kind": "asha", "grace_period": 1}}, ["asha.grace_period", "scheduler"]),
    ({"scheduler": "asha"}, ["scheduler"]),
    ({"prune": {"dead_experts": {"above": 0.5}}}, ["prune.dead_experts.above"]),
    ({"metric": "train_loss"}, ["metric"]),
    ({"mode": "max"}, ["mode"]),
])
def test_resume_refuses_a_changed_scheduler_prune_rule_or_metric(tmp_path, over, keys):
    guard.record_spec(_spec(), tmp_path)
    with pytest.raises(SearchSpaceError, match=r"--force-spec") as e:
        guard.check_resume_spec(_spec(**over), tmp_path, force=False)
    msg = str(e.value)
    assert "\n" not in msg and all(f"{k} was" in msg for k in keys), msg
    said: list[str] = []
    guard.check_resume_spec(_spec(**over), tmp_path, force=True, say=said.append)
    assert all(k in said[0] for k in keys)
    guard.check_resume_spec(_spec(**over), tmp_path, force=False)  # now the recorded one


def test_every_added_key_defaults_as_the_spec_does():
    rec = guard.spec_record(_spec())
    assert not set(guard.RUN_ADDED) & set(rec)  # all at their defaults: left out, as before
    assert guard.RUN_ADDED["asha"] == dataclasses.asdict(AshaConfig())


@pytest.mark.parametrize("damage", ["missing", "garbage", "not a record"])
def test_resume_without_a_sound_spec_record_is_refused(tmp_path, damage):
    (tmp_path / "tune").mkdir()  # a run was here
    if damage == "garbage":
        (tmp_path / "spec.json").write_bytes(b"\x00{not json")
    elif damage == "not a record":
        (tmp_path / "spec.json").write_text("[1, 2]")
    with pytest.raises(SearchSpaceError, match=r"spec\.json (is missing|is unreadable|is not a)"
                                               r".*--force-spec") as e:
        guard.check_resume_spec(_spec(), tmp_path, force=False)
    assert "\n" not in str(e.value)
    said: list[str] = []
    guard.check_resume_spec(_spec(), tmp_path, force=True, say=said.append)
    assert "recording this spec" in said[0]
    guard.check_resume_spec(_spec(), tmp_path, force=False)


def test_resume_of_an_empty_folder_records_and_starts(tmp_path):
    said: list[str] = []
    guard.check_resume_spec(_spec(), tmp_path, force=False, say=said.append)
    assert (tmp_path / "spec.json").exists() and said


@pytest.mark.parametrize("content", [b"", b"garbage\x00", b"[1, 2]", b'{"trial_data": 1}', None])
def test_garbage_experiment_state_is_one_line(tmp_path, content):
    (tmp_path / "tuner.pkl").write_bytes(b"x")
    if content is not None:
        (tmp_path / "experiment_state-2026-01-01_00-00-00.json").write_bytes(content)
    with pytest.raises(UnsoundStateError, match=r"--resume: .*(unreadable|not Tune experiment "
                                                r"state|no experiment_state).*afresh") as e:
        check_tune_state(str(tmp_path), None)
    assert "\n" not in str(e.value)



@pytest.mark.parametrize("name", ["basic-variant-state-2026-01-01_00-00-00.json",
                                  "searcher-state-2026-01-01_00-00-00.pkl"])
def test_an_unreadable_searcher_state_is_one_line(tmp_path, name):
    """A truncated searcher state (seen once after kill -9 of a driver): Tune would log "Failed
    to restore the run state" and start the search afresh; refused in one line instead."""
    import ray.cloudpickle as cloudpickle

    (tmp_path / "tuner.pkl").write_bytes(b"x")
    (tmp_path / "experiment_state-2026-01-01_00-00-00.json").write_text(
        json.dumps({"trial_data": [], "runner_data": {}}))
    check_tune_state(str(tmp_path), None)  # sound so far
    (tmp_path / name).write_bytes(b"")
    with pytest.raises(UnsoundStateError, match=r"--resume: .*unreadable.*restart the search"):
        check_tune_state(str(tmp_path), None)
    (tmp_path / name).write_bytes(cloudpickle.dumps({"counter": 3}))
    check_tune_state(str(tmp_path), None)

# ---- class 1: a copied folder resumes in place -------------------------------------------------


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def _run(spec_file: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sweeps.run", str(spec_file), *args], env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_copied_folder_resumes_in_place_and_garbage_state_is_refused(tmp_path):
    ray_tmp = Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))  # short: Ray's socket paths
    env = dict(os.environ, UPCYCLE_CACHE=str(tmp_path / "cache"), RAY_TMPDIR=str(ray_tmp),
               WANDB_MODE="disabled")
    env.pop("RAY_ADDRESS", None)
    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump(dict(SPEC, results=str(tmp_path / "a"))))
    try:
        out = _run(f, env)
        assert out.returncode == 0, out.stderr[-3000:]
        a, b = tmp_path / "a" / "bound", tmp_path / "b" / "bound"
        shutil.copytree(a, b, symlinks=True)
        # the copy is a different run from here on: the original loses its results file, so
        # anything resumed from the copy that writes into the original shows
        (a / "results.parquet").unlink()
        (a / "summary.json").unlink()
        before = _tree(a)
        out = _run(f, env, "--resume", "--results", str(tmp_path / "b"))
        assert out.returncode == 0, out.stderr[-3000:]
        assert _tree(a) == before  # not one byte of the original changed
        assert (b / "results.parquet").exists() and (b / "summary.json").exists()
        summary = json.loads((b / "summary.json").read_text())
        assert summary["ok"] == 2 and summary["complete"] is True

        # every kept save's experiment state is garbage (one garbage save is read past, see
        # tests/sweeps/test_generations.py): refused in one line
        states = sorted((b / "tune" / ".state").glob("g*/experiment_state-*.json"))
        assert states
        for state in states:
            state.write_bytes(b"garbage")
        out = _run(f, env, "--resume", "--results", str(tmp_path / "b"))
        assert out.returncode == 2 and "saves of Tune's state" in out.stderr and \
            "is whole" in out.stderr, out.stderr[-3000:]
        assert len(out.stderr.strip().splitlines()) == 1
        assert json.loads((b / "summary.json").read_text())["ok"] == 2  # nothing ran
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)

"""Issue #43, class 5: commands act only on what the user owns and what they started.

- ``sweeps.cluster local up|down`` refuse a folder (or ``cluster.json``) another user owns or
  others can write, and ``down`` never signals a process this cluster did not start, even when
  the ``cluster.json`` lists it with its true start time;
- ``moe_core.hf upcycle`` never deletes a file a user saved into OUT while it ran: it fails in
  one line and keeps it;
- writers refuse a ``wandb/`` folder that a symbolic link takes outside the results folder;
- AWS credential folders are named by their owner's PID and start time and removed after a dead
  owner, also when the system gave its PID to a later process;
- on object storage, the local staging folder (W&B's files) is checked the same way.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.test_bounded_commands import one_line


@pytest.fixture
def stranger():
    """A process the user started that no cluster started (it must survive ``down``)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield p
    finally:
        p.kill()
        p.wait()


def _cluster_json(d: Path, pid: int) -> Path:
    d.mkdir(exist_ok=True)
    d.chmod(0o755)
    state = {"address": "127.0.0.1:1", "pids": [[pid, psutil.Process(pid).create_time()]],
             "config": {}}
    (d / "cluster.json").write_text(json.dumps(state))
    return d


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_down_refuses_a_folder_another_user_owns(tmp_path, capsys, stranger):
    d = _cluster_json(tmp_path / "theirs", stranger.pid)
    os.chown(d, 12345, 12345)
    line = one_line(["cluster", "local", "down", "--dir", str(d)], capsys)
    assert "belongs to another user (uid 12345); local up/down act only on your own" in line
    assert stranger.poll() is None and (d / "cluster.json").exists()
    line = one_line(["cluster", "local", "up", "--dir", str(d)], capsys)
    assert "belongs to another user (uid 12345)" in line


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_down_refuses_a_cluster_json_another_user_wrote(tmp_path, capsys, stranger):
    d = _cluster_json(tmp_path / "c", stranger.pid)
    os.chown(d / "cluster.json", 12345, 12345)
    line = one_line(["cluster", "local", "down", "--dir", str(d)], capsys)
    assert re.search(r"cluster state .*cluster\.json belongs to another user", line), line
    assert stranger.poll() is None


def test_down_refuses_a_folder_others_can_write(tmp_path, capsys, stranger):
    d = _cluster_json(tmp_path / "c", stranger.pid)
    d.chmod(0o777)
    line = one_line(["cluster", "local", "down", "--dir", str(d)], capsys)
    assert "is writable by other users (mode 777); chmod go-w it" in line
    assert stranger.poll() is None


def test_down_never_signals_a_process_this_cluster_did_not_start(tmp_path, capsys, stranger):
    """The user's own folder, listing the user's own process with its true start time: still
    not the cluster's (its command line names no Ray folder of this cluster)."""
    import shutil
    import tempfile

    from sweeps.cluster.__main__ import main

    d = _cluster_json(Path(tempfile.mkdtemp(prefix="uc-", dir="/tmp")), stranger.pid)
    try:
        assert main(["local", "down", "--dir", str(d)]) == 0
        assert stranger.poll() is None
    finally:
        shutil.rmtree(d)


def test_damaged_cluster_json_is_one_line(tmp_path, capsys):
    d = tmp_path / "c"
    d.mkdir()
    d.chmod(0o755)
    (d / "cluster.json").write_text('{"address": 1, "pids": [["x"]], "config": {}}')
    line = one_line(["cluster", "local", "down", "--dir", str(d)], capsys)
    assert "cluster state" in line and "is damaged" in line


def test_upcycle_keeps_a_file_saved_into_out_while_it_ran(tmp_path, capsys, monkeypatch):
    import moe_core.hf.save as save
    from tests.hf_util import tiny_dense

    src = tiny_dense("llama", tmp_path / "src")
    out = tmp_path / "out"
    write = save._write_weights

    def and_the_user_saves(tensors, tmp, max_shard_bytes):
        out.mkdir(exist_ok=True)
        (out / "notes.txt").write_text("mine")  # the user, meanwhile
        return write(tensors, tmp, max_shard_bytes)

    monkeypatch.setattr(save, "_write_weights", and_the_user_saves)
    line = one_line(["upcycle", str(src), str(out), "--experts", "4", "--top-k", "2",
                     "--no-verify"], capsys)
    assert "gained files this command did not write while it ran (notes.txt)" in line
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]  # no .tmp-*, .old-*


def test_a_wandb_folder_linked_out_of_the_results_is_refused(tmp_path, capsys):
    from tests.sweeps.test_hostile_inputs import SPEC

    f = tmp_path / "spec.yaml"
    f.write_text(SPEC + f"results: {tmp_path / 'results'}\n")
    res = tmp_path / "results" / "t"
    res.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (res / "wandb").symlink_to(elsewhere)
    line = one_line(["run", str(f), "--dry-run"], capsys)
    assert re.search(r"wandb leads to .*elsewhere, outside .*results/t \(a symbolic link\)",
                     line), line


def test_credentials_of_a_dead_owner_are_removed(tmp_path, monkeypatch):
    from sweeps.store import trust

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"{trust.AWS_PREFIX}{dead.pid}-abc"
    live = tmp_path / f"{trust.AWS_PREFIX}{os.getpid()}-def"
    for d in (stale, live):
        d.mkdir(mode=0o700)
        (d / "credentials").write_text("[default]\naws_secret_access_key = x\n")
    assert trust.clean_stale_netrc(tmp_path, prefix=trust.AWS_PREFIX) == [stale]
    assert not stale.exists() and live.exists()
    # a new run names its folder by its pid, so the next run can tell when it died
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.delenv("AWS_SHARED_CREDENTIALS_FILE", raising=False)
    path = trust.hide_cloud_keys()
    assert path.parent.name.startswith(f"{trust.AWS_PREFIX}{trust.owner_tag()}-")
    assert "AWS_SECRET_ACCESS_KEY" not in os.environ
    monkeypatch.delenv("AWS_SHARED_CREDENTIALS_FILE")



def test_a_reused_pid_keeps_no_dead_owners_credentials(tmp_path):
    """The PID in a folder's name is alive, but it is a later process: the folder goes. A live
    owner's folder (its true start time, or an old-style name made after it started) stays."""
    from sweeps.store import trust

    me = os.getpid()
    start = round(psutil.Process(me).create_time() * 100)
    names = {"reused": f"{me}-{start - 500}-abc", "mine": f"{me}-{start}-def",
             "old_reused": f"{me}-ghi", "old_mine": f"{me}-jkl"}
    dirs = {k: tmp_path / f"{trust.AWS_PREFIX}{n}" for k, n in names.items()}
    for d in dirs.values():
        d.mkdir(mode=0o700)
        (d / "credentials").write_text("[default]\naws_secret_access_key = x\n")
    made_before_me = psutil.Process(me).create_time() - 60  # made before this process started
    os.utime(dirs["old_reused"], (made_before_me, made_before_me))
    assert sorted(trust.clean_stale_netrc(tmp_path, prefix=trust.AWS_PREFIX)) == \
        sorted([dirs["reused"], dirs["old_reused"]])
    assert dirs["mine"].exists() and dirs["old_mine"].exists()
    assert trust.owner_tag() == f"{me}-{start}"


def test_a_wandb_folder_linked_out_of_the_staging_folder_is_refused(tmp_path, monkeypatch):
    """Results on object storage: W&B writes into the local staging folder, whose ``wandb/``
    (or the staging folder itself) a symbolic link must not take elsewhere."""
    from moe_core.errors import ConfigError
    from sweeps.plan.build import build_plan
    from sweeps.run.guard import preflight
    from sweeps.spec.sweep import load_spec
    from sweeps.store.storage import staging_for
    from tests.sweeps.test_hostile_inputs import SPEC

    monkeypatch.setenv("UPCYCLE_STAGING", str(tmp_path / "staging"))
    f = tmp_path / "spec.yaml"
    f.write_text(SPEC + "results: s3://bucket/sweeps\n")
    spec = load_spec(str(f))
    plan = build_plan(spec)
    staging = staging_for(spec.results_uri)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    preflight(spec, plan)  # no staging folder yet: fine
    staging.mkdir(parents=True)
    (staging / "wandb").symlink_to(elsewhere)
    with pytest.raises(ConfigError, match=r"wandb leads to .*elsewhere, outside .*\(a symbolic"):
        preflight(spec, plan)
    (staging / "wandb").unlink()
    preflight(spec, plan)
    staging.rmdir()
    staging.symlink_to(elsewhere)
    with pytest.raises(ConfigError, match=r"staging folder of s3://bucket/sweeps.*outside"):
        preflight(spec, plan)

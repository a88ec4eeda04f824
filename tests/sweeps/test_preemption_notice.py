"""A spot reclaim with notice against one without, in one sweep on a local multi-node cluster
(``sweeps.cluster.local``): two trials, each on its own worker node, a spare node. Each trial
holds once after its report of step 24, one eval past its checkpoint at step 16
(``UPCYCLE_SWEEPS_HOLD_AT_STEP``). The first held has its node drained as the autoscaler does
for a spot reclaim (reason preemption, a 30 s deadline, killed at the deadline) and is released:
it must checkpoint before the deadline, resume on another node from that checkpoint and lose no
trained step. The other has its node killed with no notice: it resumes from its checkpoint at
step 16 and loses the 8 steps after it. Prints (``-s``) the tokens lost both ways, the time from
the drain to the checkpoint and the cost of the trials' GCS polls.

The trial killed without notice is also what ``test_multinode.py`` checked (removed: a worker
node of a cluster without autoscaler dies mid-trial, the sweep's results in a local folder, its
parent shared; the trial is rescheduled on another node, every curve complete, no row twice,
every status ok); ``test_autoscaler.py``'s preempted trial checks it again on S3."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import yaml

from moe_core.errors import UpcycleError
from sweeps.cluster.local import LIGHT_ENV, LOOPBACK_ENV, LocalCluster, LocalClusterConfig
from sweeps.plan.devices import ALLOW_CPU_ENV
from sweeps.testing.faults import HOLD_ENV
from tests.sweeps.test_autoscaler import _trial_results
from tests.sweeps.test_sweep_e2e import SPEC

EVERY, STEPS, DEADLINE_S = 8, 48, 30.0
HOLD = 3 * EVERY  # each trial is disrupted one eval after its checkpoint at step 16
TOKENS_PER_STEP = 8 * 32  # tiny_base: global batch 8 of 32 tokens
INTERVAL = 2 * EVERY  # a checkpoint at every other eval
LOCAL = pafs.LocalFileSystem()


def _spec(results: str) -> dict:
    base = dict(SPEC["base"], tokens=STEPS * TOKENS_PER_STEP,
                eval={"every_steps": EVERY, "batches": 2})
    search = {"upcycle.lr_policy": {"grid": SPEC["search"]["upcycle.lr_policy"]["grid"][1:3]}}
    return dict(SPEC, base=base, search=search, results=results,
                resources={"cpus": 1, "gpus": 1}, max_concurrent=2, storage={"flush_s": 0.5},
                logging={"wandb": {"enabled": False}}, failure={"max_failures": 3},
                checkpoint={"every_evals": 2, "every_minutes": None,
                            "preemption_poll_s": 0.5})


def _disrupt(cluster: LocalCluster, markers: Path, proc) -> dict[str, dict]:
    """Each trial holds after its report of step ``HOLD`` (``faults.HoldReport``): the first
    held has its node drained and is released, the other has its node killed; what was done to
    each trial (by id)."""
    hits: dict[str, dict] = {}
    deadline = time.monotonic() + 300
    while len(hits) < 2 and time.monotonic() < deadline and proc.poll() is None:
        for f in sorted(markers.glob(".held-*")):
            tid, pid = f.name.removeprefix(".held-"), f.read_text()
            raylet = cluster.raylet_of(int(pid)) if pid and tid not in hits else None
            if raylet is None:
                continue
            hit = {"pid": int(pid), "node": cluster.node_of(raylet)["node_id"]}
            if not hits:
                hit.update(kind="notice", deadline=cluster.drain(raylet, DEADLINE_S))
                (markers / f".release-{tid}").touch()
            else:
                hit.update(kind="kill")
                cluster.preempt(raylet)
            hits[tid] = hit
        time.sleep(0.1)
    assert len(hits) == 2, f"trials disrupted: {hits}"
    return hits


def _lost(reports: list[dict], pid: int) -> tuple[int, dict]:
    """Steps the process ``pid`` trained after the checkpoint its successor resumed from (as
    reported; a held trial trains nothing after its report), and that checkpoint's row."""
    old = [r for r in reports if r["pid"] == pid]
    ck = [r for r in old if r.get("checkpoint_dir_name")][-1]
    new = [r for r in reports if r["pid"] != pid and r["step"] > 0 and
           reports.index(r) > reports.index(old[-1])]
    assert new and ck["step"] < new[0]["step"] <= ck["step"] + EVERY, (ck, new[:1])
    return old[-1]["step"] - ck["step"], ck


@pytest.mark.slow
@pytest.mark.distributed
def test_preemption_notice_checkpoints_before_the_deadline(tmp_path, request):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_spec(str(tmp_path / "results"))))
    env = dict(os.environ, WANDB_MODE="disabled", UPCYCLE_CACHE=str(tmp_path / "cache"),
               **LOOPBACK_ENV, **LIGHT_ENV, **{ALLOW_CPU_ENV: "1", HOLD_ENV: str(HOLD)})
    env.pop("RAY_ADDRESS", None)
    sweep = tmp_path / "results" / "e2e"
    cluster = LocalCluster(LocalClusterConfig(autoscale=False))
    request.addfinalizer(lambda: shutil.rmtree(cluster.root, ignore_errors=True))
    with cluster:
        for _ in range(3):  # two trials and a spare; the head has no GPU
            cluster.add_node(cpus=1, gpus=1)
        head = [p for p in cluster.processes() if p.name() == "raylet" and
                cluster.node_of(p)["head"]]
        assert len(head) == 1
        for disrupt in (lambda: cluster.drain(head[0], 1), lambda: cluster.preempt(head[0])):
            with pytest.raises(UpcycleError, match="refusing to (drain|preempt) the head"):
                disrupt()
        log = open(tmp_path / "driver.log", "w")
        proc = subprocess.Popen([sys.executable, "-m", "sweeps.run", str(spec), "--address",
                                 cluster.address], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            hits = _disrupt(cluster, sweep / "parents", proc)
            proc.wait(timeout=420)
        finally:
            if proc.poll() is None:
                proc.kill()
            log.close()
    assert proc.returncode == 0, (tmp_path / "driver.log").read_text()[-3000:]

    rows = pq.read_table(sweep / "results.parquet").to_pylist()
    reports = _trial_results(LOCAL, str(sweep / "tune"))
    assert len({r["trial_id"] for r in rows}) == 2
    lost, polls = {}, []
    for tid, hit in hits.items():
        mine = sorted(r["step"] for r in rows if r["trial_id"] == tid)
        assert len(mine) == len(set(mine)) and mine[-1] == STEPS, (tid, mine)
        assert {r["status"] for r in rows if r["trial_id"] == tid} == {"ok"}
        steps, ck = _lost(reports[tid], hit["pid"])
        lost[hit["kind"]] = steps * TOKENS_PER_STEP
        after = [r for r in reports[tid] if r["pid"] != hit["pid"]]
        assert all(r["node_id"] != hit["node"] for r in after)  # resumed on another node
        polls += [r for r in reports[tid] if r.get("preempt_polls")]
        if hit["kind"] == "notice":  # the checkpoint taken on the notice, before the deadline
            assert ck["preempt_deadline_left_s"] > 0, ck
            notice = ck
    assert lost["notice"] <= INTERVAL * TOKENS_PER_STEP
    assert lost["notice"] < lost["kill"]
    last = {}
    for r in polls:  # each run's last row: its polls and their seconds
        last[r["trial_id"], r["pid"]] = r
    n = sum(r["preempt_polls"] - 1 for r in last.values())  # the first (connect) apart
    first = max(r["preempt_first_poll_s"] for r in last.values())
    firsts = sum(r["preempt_first_poll_s"] for r in last.values())
    poll_s = sum(r["preempt_poll_s"] for r in last.values())
    cpu_s = sum(r["preempt_poll_cpu_s"] for r in last.values())
    train_s = sum(r["time_since_restore"] for r in last.values())
    assert cpu_s < 0.01 * train_s, (cpu_s, train_s)  # the polls' CPU, in their own thread
    print(f"\ntokens lost: with the notice {lost['notice']}, killed without one "
          f"{lost['kill']}; one "
          f"checkpoint interval = {INTERVAL * TOKENS_PER_STEP} tokens. Drain to checkpoint "
          f"{DEADLINE_S - notice['preempt_deadline_left_s']:.2f} s (notice seen to checkpoint "
          f"written {notice['preempt_notice_to_ckpt_s']:.2f} s), "
          f"{notice['preempt_deadline_left_s']:.1f} s before the {DEADLINE_S:.0f} s deadline; "
          f"{len(last)} trial runs polled the GCS {n + len(last)} times, in the watch's "
          f"thread: {1000 * (poll_s - firsts) / max(n, 1):.2f} ms wall each after a first one "
          f"(it connects) of up to {1000 * first:.0f} ms, {1000 * cpu_s / (n + len(last)):.3f} "
          f"ms CPU each, {100 * cpu_s / train_s:.4f} % of their {train_s:.0f} s; "
          f"load {os.getloadavg()[0]:.1f}")

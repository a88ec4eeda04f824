"""Two Ray nodes on loopback, started and stopped by the test (``sweeps.cluster.local``); the
worker node dies mid-sweep; the sweep still finishes with every trial's curve complete (trials
rescheduled from their checkpoints; the shared parent is held by the driver on the head)."""

import os
import shutil
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
import yaml

from sweeps.cluster.local import LOOPBACK_ENV, LocalCluster, LocalClusterConfig
from sweeps.testing.faults import SIM_STEP_ENV
from tests.sweeps.test_sweep_e2e import SPEC, TWO_POLICIES  # noqa: E402

STEPS = 32


@pytest.mark.slow
@pytest.mark.distributed
def test_worker_node_killed_mid_sweep(tmp_path, request):
    # the test's own two nodes on loopback (no autoscaler), stopped by PID at the end
    cluster = LocalCluster(LocalClusterConfig(autoscale=False))
    request.addfinalizer(lambda: shutil.rmtree(cluster.root, ignore_errors=True))
    # each trial sleeps 0.4 s per step (12.8 s, after its step-0 row; sweeps.testing.faults.
    # stretch): the worker's trial is still running when the node dies, however fast this
    # machine trains (unstretched, CI once saw it finish first: nothing was interrupted)
    env = dict(os.environ, WANDB_MODE="disabled", UPCYCLE_CACHE=str(tmp_path / "cache"),
               **LOOPBACK_ENV, **{SIM_STEP_ENV: "trial=0.4"})
    env.pop("RAY_ADDRESS", None)
    with cluster:
        worker = cluster.add_node(cpus=1)
        # two trials (one per node) and 32 steps: the rescheduled trial is the worker's one
        # either way; four trials of 64 steps cost twice the trials' CPU for the same checks
        base = dict(SPEC["base"], tokens=STEPS * 8 * 32, eval={"every_steps": 8, "batches": 2})
        spec = dict(SPEC, base=base, search=TWO_POLICIES, results=str(tmp_path / "results"),
                    storage={"flush_s": 0.5}, logging={"wandb": {"enabled": False}},
                    failure={"max_failures": 3})
        f = tmp_path / "spec.yaml"
        f.write_text(yaml.safe_dump(spec))
        log = open(tmp_path / "driver.log", "w")
        proc = subprocess.Popen([sys.executable, "-m", "sweeps.run", str(f), "--address",
                                 cluster.address], env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        res = tmp_path / "results" / "e2e" / "results.parquet"
        try:
            deadline = time.time() + 300
            while time.time() < deadline:  # wait until trials are reporting
                time.sleep(1)
                if res.exists():
                    try:
                        rows = pq.read_table(res).to_pylist()
                        if len({r["trial_id"] for r in rows}) >= 2:
                            break  # two trials (one per node, 1 CPU each) have started
                    except Exception:
                        pass
            cluster.preempt(worker)  # the worker node dies: its raylet and its workers
            proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
            log.close()
        assert proc.returncode == 0, (tmp_path / "driver.log").read_text()[-3000:]
        rows = pq.read_table(res).to_pylist()
        trials = {r["trial_id"] for r in rows}
        assert len(trials) == 2
        for t in trials:
            steps = sorted(r["step"] for r in rows if r["trial_id"] == t)
            assert steps == list(range(0, STEPS + 1, 8)), (t, steps)
            assert {r["status"] for r in rows if r["trial_id"] == t} == {"ok"}
        # the trial that ran on the dead node failed once and was rescheduled
        errors = list((tmp_path / "results" / "e2e" / "tune").rglob("error.txt"))
        assert errors, "no trial was interrupted by the node's death"

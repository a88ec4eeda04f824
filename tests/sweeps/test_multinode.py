"""Two Ray nodes on loopback; the worker node dies mid-sweep; the sweep still finishes with
every trial's curve complete (trials rescheduled from their checkpoints, the shared parent read
back from the disk cache when its object-store copy died with the node)."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
import yaml

from tests.sweeps.test_sweep_e2e import SPEC  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _raylet_pids(node_manager_port: int) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"node_manager_port={node_manager_port}"],
                         capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.skipif(shutil.which("pgrep") is None, reason="needs pgrep")
def test_worker_node_killed_mid_sweep(tmp_path):
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    import secrets

    # Ray 2.60 authenticates nodes with a token: head, worker and driver share one.
    env = dict(os.environ, WANDB_MODE="disabled", UPCYCLE_CACHE=str(tmp_path / "cache"),
               RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    env.pop("RAY_ADDRESS", None)
    gcs, nm = _port(), _port()
    common = ["--disable-usage-stats", "--num-cpus=1"]
    subprocess.run([ray_bin, "start", "--head", f"--port={gcs}", "--include-dashboard=false",
                    *common], env=env, check=True, capture_output=True, timeout=120)
    try:
        subprocess.run([ray_bin, "start", f"--address=127.0.0.1:{gcs}",
                        f"--node-manager-port={nm}", *common], env=env, check=True,
                       capture_output=True, timeout=120)
        base = dict(SPEC["base"], tokens=16384, eval={"every_steps": 8, "batches": 2})
        spec = dict(SPEC, base=base, results=str(tmp_path / "results"),
                    storage={"flush_s": 0.5}, logging={"wandb": {"enabled": False}},
                    failure={"max_failures": 3})
        f = tmp_path / "spec.yaml"
        f.write_text(yaml.safe_dump(spec))
        log = open(tmp_path / "driver.log", "w")
        proc = subprocess.Popen([sys.executable, "-m", "sweeps.run", str(f), "--address",
                                 f"127.0.0.1:{gcs}"], env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        res = tmp_path / "results" / "e2e" / "results.parquet"
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
        pids = _raylet_pids(nm)
        assert pids, "worker raylet not found"
        for p in pids:  # the worker node dies: its raylet, and with it its workers
            os.kill(p, signal.SIGKILL)
        proc.wait(timeout=600)
        log.close()
        assert proc.returncode == 0, (tmp_path / "driver.log").read_text()[-3000:]
        rows = pq.read_table(res).to_pylist()
        trials = {r["trial_id"] for r in rows}
        assert len(trials) == 4
        for t in trials:
            steps = sorted(r["step"] for r in rows if r["trial_id"] == t)
            assert steps == list(range(0, 65, 8)), (t, steps)
            assert {r["status"] for r in rows if r["trial_id"] == t} == {"ok"}
        # the trial that ran on the dead node failed once and was rescheduled
        errors = list((tmp_path / "results" / "e2e" / "tune").rglob("error.txt"))
        assert errors, "no trial was interrupted by the node's death"
    finally:
        subprocess.run([ray_bin, "stop", "--force"], env=env, capture_output=True, timeout=120)

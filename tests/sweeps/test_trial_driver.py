"""resources.trial_driver on a two-node local Ray cluster: trial drivers run only on the node
that has the custom resource (the cluster configs give it to on-demand nodes only)."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import yaml

from tests.sweeps.tiny import tiny_base


@pytest.mark.slow
@pytest.mark.distributed
def test_trial_drivers_run_only_where_trial_driver_exists(tmp_path):
    import ray
    from ray._private.state import actors
    from ray.cluster_utils import Cluster

    # this test's own cluster (torn down below by Cluster.shutdown, which owns its processes):
    # a head with 1 CPU and no trial_driver (a spot node), a worker with 1 CPU and trial_driver
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1,
                                                            "include_dashboard": False})
    try:
        head_id = cluster.head_node.node_id
        worker = cluster.add_node(num_cpus=1, resources={"trial_driver": 2})
        cluster.wait_for_nodes()
        spec = {"sweep": "td", "results": str(tmp_path / "r"), "base": tiny_base(),
                "search": {"optim.lr": {"grid": [1e-3, 2e-3, 3e-3]}},
                "resources": {"cpus": 1, "trial_driver": 0.5}, "max_concurrent": 2,
                "logging": {"wandb": {"enabled": False}}}
        f = tmp_path / "spec.yaml"
        f.write_text(yaml.safe_dump(spec))
        env = dict(os.environ, UPCYCLE_CACHE=str(tmp_path / "cache"),
                   # progress lines every 0.2 s: a tiny trial's evals arrive within about a
                   # second, and a 1 s period could miss every one of them on a loaded machine
                   UPCYCLE_SWEEPS_PROGRESS_S="0.2")
        env.pop("RAY_ADDRESS", None)
        out = subprocess.run([sys.executable, "-m", "sweeps.run", str(f), "--address",
                              cluster.address], env=env, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        rows = pq.read_table(tmp_path / "r" / "td" / "results.parquet").to_pylist()
        assert len({r["trial_id"] for r in rows}) == 3
        assert {r["status"] for r in rows} == {"ok"}
        # the driver's progress lines: per running trial, step of 8, losses and tokens/s
        ticks = [x for x in out.stderr.splitlines() if "/8  train_loss" in x]
        assert ticks and all("tok/s" in x for x in ticks), out.stderr[-3000:]
        ray.init(address=cluster.address, log_to_driver=False)
        try:
            trial_actors = [a for a in actors().values()
                            if "run_trial" in a.get("ActorClassName", "") or
                            "ImplicitFunc" in a.get("ActorClassName", "")]
        finally:
            ray.shutdown()
        nodes = {a["Address"]["NodeID"] for a in trial_actors}
        assert trial_actors and nodes == {worker.node_id}, (nodes, head_id, worker.node_id)
    finally:
        cluster.shutdown()

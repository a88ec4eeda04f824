"""resources.trial_driver on a two-node local Ray cluster: trial drivers run only on the node
that has the custom resource (the cluster configs give it to on-demand nodes only)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import yaml

from tests.sweeps.tiny import tiny_base

QUERY = """
import json, sys
import ray
from ray._private.state import actors
ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)
print(json.dumps({
    "nodes": {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]},
    "actors": [{"ActorClassName": a.get("ActorClassName", ""),
                "NodeID": a["Address"]["NodeID"]} for a in actors().values()]}))
ray.shutdown()
"""


@pytest.mark.slow
@pytest.mark.distributed
def test_trial_drivers_run_only_where_trial_driver_exists(tmp_path, request):
    from sweeps.cluster.local import LOOPBACK_ENV, LocalCluster, LocalClusterConfig

    # this test's own cluster (no autoscaler; its processes stopped by PID at the end, and no
    # address file left in /tmp/ray for another process's ray.init to join): a head with 1 CPU
    # and no trial_driver (a spot node), a worker with 1 CPU and trial_driver
    cluster = LocalCluster(LocalClusterConfig(head_cpus=1, autoscale=False))
    request.addfinalizer(lambda: shutil.rmtree(cluster.root, ignore_errors=True))
    with cluster:
        cluster.add_node(cpus=1, resources={"trial_driver": 2})
        spec = {"sweep": "td", "results": str(tmp_path / "r"), "base": tiny_base(),
                "search": {"optim.lr": {"grid": [1e-3, 2e-3, 3e-3]}},
                "resources": {"cpus": 1, "trial_driver": 0.5}, "max_concurrent": 2,
                "logging": {"wandb": {"enabled": False}}}
        f = tmp_path / "spec.yaml"
        f.write_text(yaml.safe_dump(spec))
        env = dict(os.environ, UPCYCLE_CACHE=str(tmp_path / "cache"), **LOOPBACK_ENV,
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
        # which node each trial's actor ran on, asked in a process of its own: Ray reads
        # LOOPBACK_ENV (127.0.0.1 stays 127.0.0.1) when it is imported
        query = subprocess.run([sys.executable, "-c", QUERY, cluster.address], env=env,
                               capture_output=True, text=True, timeout=120)
        assert query.returncode == 0, query.stderr[-3000:]
        seen = json.loads(query.stdout.strip().splitlines()[-1])
        by_id = seen["nodes"]
        trial_actors = [a for a in seen["actors"]
                        if "run_trial" in a["ActorClassName"] or "ImplicitFunc" in
                        a["ActorClassName"]]
        nodes = {a["NodeID"] for a in trial_actors}
        with_resource = {i for i, r in by_id.items() if r.get("trial_driver")}
        assert len(by_id) == 2 and len(with_resource) == 1, by_id
        assert trial_actors and nodes == with_resource, (nodes, by_id)

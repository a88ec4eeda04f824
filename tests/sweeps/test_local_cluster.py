"""The local fake cluster's config and process ownership (``sweeps.cluster.local``), offline:
no Ray node is started here (``test_autoscaler.py`` runs one)."""

import subprocess
import sys

import psutil
import pytest

from moe_core.errors import ConfigError
from sweeps.cluster.local import (
    FAKE_PROVIDER,
    HEAD_TYPE,
    WORKER_TYPE,
    LocalCluster,
    LocalClusterConfig,
    _tree,
    autoscaling_config,
    kill_processes,
)


@pytest.mark.parametrize("v2", [False, True])
def test_autoscaling_config_passes_ray_schema(v2):
    from ray.autoscaler._private.util import validate_config

    cfg = autoscaling_config(LocalClusterConfig(autoscaler_v2=v2), "127.0.0.1:1234")
    validate_config(cfg)
    types = cfg["available_node_types"]
    assert types[HEAD_TYPE]["resources"] == {"CPU": 1, "GPU": 0}
    w = types[WORKER_TYPE]
    assert (w["resources"]["CPU"], w["resources"]["GPU"]) == (1, 1)
    assert (w["min_workers"], w["max_workers"], cfg["max_workers"]) == (0, 3, 3)
    assert cfg["idle_timeout_minutes"] == pytest.approx(6 / 60)
    assert cfg["provider"]["gcs_address"] == "127.0.0.1:1234"
    assert cfg["provider"]["type"] == ("external" if v2 else "fake_multinode")
    if v2:  # Ray's v2 config reader fills an external provider's defaults without a file
        from ray.autoscaler._private.util import prepare_config

        assert cfg["provider"]["module"] == FAKE_PROVIDER
        assert prepare_config(cfg)["available_node_types"][WORKER_TYPE]["max_workers"] == 3


def test_config_is_validated():
    with pytest.raises(ConfigError, match="object_store_bytes=1000 is below Ray's floor"):
        LocalClusterConfig(object_store_bytes=1000)
    with pytest.raises(ConfigError, match="max_workers=0 must be >= 1"):
        LocalClusterConfig(max_workers=0)
    with pytest.raises(ConfigError,
                       match=r"idle_timeout_s=0 \(--idle-timeout-s\) must lie in \(0, 86400\]"):
        LocalClusterConfig(idle_timeout_s=0)
    with pytest.raises(ConfigError, match="longer than 38 characters"):
        LocalCluster(root="/tmp/" + "x" * 60)


def test_stop_kills_only_the_recorded_process_tree():
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', " \
           "'import time; time.sleep(60)']); time.sleep(60)"
    ours = subprocess.Popen([sys.executable, "-c", code])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        p = psutil.Process(ours.pid)
        for _ in range(100):  # its child has started
            if p.children():
                break
            psutil.wait_procs([], timeout=0.1)
        child = p.children()[0]
        # a recorded pid whose process was replaced (other create time) is not ours
        assert _tree([(other.pid, psutil.Process(other.pid).create_time() - 5)]) == []
        tree = _tree([(ours.pid, p.create_time())])
        assert {q.pid for q in tree} == {ours.pid, child.pid}
        kill_processes(tree, grace_s=2)
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
        assert ours.wait(timeout=10) is not None
        assert other.poll() is None  # untouched
    finally:
        other.kill()
        ours.kill()
        other.wait()

"""A sweep that starts its own Ray keeps every Ray port on 127.0.0.1 (issue #32): the driver,
GCS, raylet and workers listen on the loopback address only."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from sweeps.run.guard import local_only_ray

CODE = """
import psutil
from sweeps.run.guard import local_only_ray
assert local_only_ray(None)
import ray
ray.init(include_dashboard=False, configure_logging=False, _temp_dir=TMP)
ray.get([ray.remote(lambda: 1).remote() for _ in range(2)])
me = psutil.Process()
ips = set()
for p in [me, *me.children(recursive=True)]:
    try:
        ips |= {c.laddr.ip for c in p.net_connections(kind="tcp") if c.status == "LISTEN"}
    except psutil.Error:
        pass
print("LISTEN", sorted(ips))
ray.shutdown()
"""


@pytest.mark.slow
@pytest.mark.distributed  # starts Ray
def test_local_ray_listens_on_loopback_only():
    tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # short: Ray's socket paths
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    for k in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, "-c", CODE.replace("TMP", repr(tmp))],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(x for x in p.stdout.splitlines() if x.startswith("LISTEN"))
    ips = eval(line[len("LISTEN "):])  # noqa: S307 - our own printed list
    assert ips and all(ip in ("127.0.0.1", "::ffff:127.0.0.1") for ip in ips), ips


def test_without_an_address_the_sweep_starts_a_ray_of_its_own(monkeypatch):
    """``ray.init(address=None)`` would join the newest cluster that ``ray start`` (or a test's
    ``ray.cluster_utils.Cluster``) left its address for in ``/tmp/ray``: not the local Ray the
    dry run checked the sweep against. ``RAY_ADDRESS`` (a Ray job's driver) still decides."""
    import types

    import sweeps.run.driver as driver
    from sweeps.run.guard import LOCAL_RAY_ENV, ray_address

    monkeypatch.setenv(LOCAL_RAY_ENV, "0")  # what local_only_ray sets, undone after the test
    seen = {}
    monkeypatch.setattr(driver.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(driver.ray, "init", lambda **kw: seen.update(kw))
    spec = types.SimpleNamespace(resources=types.SimpleNamespace(cpus=1))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    driver._start_ray(spec, None, verbose=True)
    assert seen["address"] == "local" and ray_address(None) == "local"
    assert local_only_ray(None)
    driver._start_ray(spec, "10.0.0.1:6379", verbose=True)
    assert seen["address"] == "10.0.0.1:6379" and not local_only_ray("10.0.0.1:6379")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.2:6379")
    driver._start_ray(spec, None, verbose=True)
    assert seen["address"] is None  # Ray reads RAY_ADDRESS itself
    assert not local_only_ray(None)

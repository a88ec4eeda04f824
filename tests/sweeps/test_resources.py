"""What each task reserves (``resources.gpus: auto``), the worker environment that hides the GPU
from zero-GPU work, and the ``--dry-run`` lines that show both."""

from __future__ import annotations

import functools
import os

import pytest
import yaml

from sweeps.plan import resources as R
from sweeps.spec.sweep import parse_spec
from tests.sweeps.test_spec import spec
from tests.sweeps.tiny import tiny_base


@pytest.mark.parametrize("gpus, cluster, want", [
    ("auto", {"CPU": 16, "GPU": 8}, 1.0),
    ("auto", {"CPU": 16, "GPU": 0.5}, 1.0),
    ("auto", {"CPU": 16, "GPU": 0}, 0.0),
    ("auto", {"CPU": 16}, 0.0),
    (0.5, {"CPU": 16, "GPU": 8}, 0.5),
    (0, {"CPU": 16, "GPU": 8}, 0.0),  # an explicit 0 stays 0 on a GPU cluster
    (2, {"CPU": 16}, 2.0),
])
def test_auto_is_one_gpu_when_the_cluster_has_gpus(gpus, cluster, want):
    assert R.resolve_gpus(gpus, cluster) == want


def test_gpus_default_to_auto_and_a_resolved_spec_reserves_per_task():
    s = parse_spec(spec())
    assert s.resources.gpus == "auto"
    with pytest.raises(ValueError, match="resources.gpus=auto is not resolved"):
        R.task_options(s)
    gpu = R.resolve(s, {"CPU": 16, "GPU": 8})
    assert R.trial_resources(gpu) == {"cpu": 1.0, "gpu": 1.0}
    assert R.task_options(gpu) == {"num_cpus": 1.0, "num_gpus": 1.0}
    assert R.reservations(gpu) == [("trial", {"CPU": 1.0, "GPU": 1.0}),
                                   ("parent", {"CPU": 1.0, "GPU": 1.0}),
                                   ("stable run", {"CPU": 1.0, "GPU": 1.0})]
    cpu = R.resolve(s, {"CPU": 16})
    assert R.task_options(cpu) == {"num_cpus": 1.0, "num_gpus": 0.0}


def test_multi_rank_trials_reserve_per_rank_and_a_token_for_tune():
    s = R.resolve(parse_spec(spec(resources={"ranks": 2, "cpus": 2})), {"GPU": 4})
    assert R.trial_resources(s) == {"cpu": 0, "memory": 2**20}
    assert R.rank_resources(s) == {"CPU": 2.0, "GPU": 1.0}
    rows = dict(R.reservations(s))
    assert rows["trial (Tune)"] == {"memory": 2**20}
    assert rows["trial rank (x2)"] == {"CPU": 2.0, "GPU": 1.0}
    assert rows["parent"] == rows["stable run"] == {"CPU": 2.0, "GPU": 1.0}
    lines = R.describe(s, s, {"GPU": 4}, "cluster")
    assert "  trial (Tune)     reserves memory 1,048,576 B" in lines
    assert "  trial rank (x2)  reserves CPU 2, GPU 1" in lines


def test_dry_run_lines_say_what_each_task_reserves():
    s = parse_spec(spec())
    lines = R.describe(s, R.resolve(s, {"GPU": 8}), {"GPU": 8}, "cluster")
    assert lines[0].startswith("resources.gpus=auto -> 1 per task (cluster: 8 GPU(s)")
    assert [ln.split()[0] for ln in lines[1:]] == ["trial", "parent", "stable"]
    assert all(ln.endswith("reserves CPU 1, GPU 1") for ln in lines[1:])
    lines = R.describe(s, R.resolve(s, {}), {}, "this machine")
    assert lines[1].endswith("reserves CPU 1, GPU 0")
    assert "CUDA_VISIBLE_DEVICES=''" in lines[-1] and R.ON_ZERO_ENV in lines[-1]
    half = parse_spec(spec(resources={"gpus": 0.5}))
    assert R.describe(half, R.resolve(half, {}), {}, "x")[0] == \
        "resources.gpus=0.5 per task (as the spec says)"


def test_dry_run_prints_the_reservations(tmp_path, capsys):
    from sweeps.run.cli import main

    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"sweep": "r", "base": tiny_base(),
                                 "resources": {"cpus": 2, "gpus": 0.25}}))
    assert main([str(f), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "resources.gpus=0.25 per task (as the spec says)" in out
    for task in ("trial", "parent", "stable run"):
        assert f"  {task:<16} reserves CPU 2, GPU 0.25" in out


def test_the_worker_env_asks_ray_to_hide_gpus_from_zero_gpu_work():
    # Ray 2.60 reads this variable (as a bool) in each worker before a task runs
    from ray._private.accelerators import RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO_ENV_VAR

    assert R.ON_ZERO_ENV == RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO_ENV_VAR
    assert R.WORKER_ENV == {R.ON_ZERO_ENV: "1"}


@pytest.mark.slow
@pytest.mark.distributed  # starts Ray
def test_the_driver_starts_ray_so_zero_gpu_tasks_see_no_gpu(monkeypatch):
    """The driver's own ``ray.init`` (with one logical GPU added): a task that reserves no GPU
    gets ``CUDA_VISIBLE_DEVICES=""``, one that reserves it gets its id; ``auto`` resolves to 1
    against that cluster."""
    import ray

    from sweeps.run import driver

    if ray.is_initialized():
        pytest.skip("a Ray session from another test is running in this process")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # what a GPU box's driver sees
    monkeypatch.setattr(ray, "init", functools.partial(ray.init, num_cpus=2, num_gpus=1))
    s = parse_spec(spec())
    try:
        driver._start_ray(s, None, verbose=False)

        @ray.remote
        def visible() -> tuple[str | None, list]:
            return os.environ.get("CUDA_VISIBLE_DEVICES"), ray.get_gpu_ids()

        assert ray.get(visible.options(num_gpus=0).remote()) == ("", [])
        assert ray.get(visible.options(num_gpus=1).remote()) == ("0", ["0"])
        assert R.resolve(s, R.ray_cluster()).resources.gpus == 1.0
        assert ray.get(ray.remote(max_calls=1)(lambda: R.placement()).options(
            **R.task_options(R.resolve(s, R.ray_cluster()))).remote()) == \
            {"ray_gpu_ids": ["0"], "cuda_visible_devices": "0"}
    finally:
        ray.shutdown()

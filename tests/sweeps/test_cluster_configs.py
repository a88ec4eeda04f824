"""Cluster configs validated with Ray's own schema and checks (offline)."""

from pathlib import Path

import pytest
import yaml

CLUSTER = Path(__file__).resolve().parents[2] / "sweeps" / "cluster"


@pytest.mark.parametrize("name", ["aws.yaml", "gcp.yaml"])
def test_launcher_config_passes_ray_validation(name):
    from ray.autoscaler._private.util import prepare_config, validate_config

    cfg = yaml.safe_load((CLUSTER / name).read_text())
    prepared = prepare_config(cfg)  # fills Ray's defaults, as `ray up` does
    validate_config(prepared)
    types = prepared["available_node_types"]
    assert types["head"]["resources"]["CPU"] == 0  # the head only drives sweeps
    gpu_types = [t for t in types if t != "head"]
    assert gpu_types and all(types[t]["max_workers"] >= 1 for t in gpu_types)
    assert all(types[t]["min_workers"] == 0 for t in gpu_types)  # scale from zero
    # trial drivers stay off spot/preemptible nodes
    for t, spec in types.items():
        spot = "spot" in t or "preemptible" in t
        assert ("trial_driver" in spec.get("resources", {})) != spot, t
    assert prepared["idle_timeout_minutes"] > 0
    assert any("pip install" in c for c in prepared["setup_commands"])


def test_invalid_launcher_config_is_refused():
    from ray.autoscaler._private.util import prepare_config, validate_config

    cfg = prepare_config(yaml.safe_load((CLUSTER / "aws.yaml").read_text()))
    cfg["available_node_types"]["gpu_8xh100"]["max_workers"] = "many"
    with pytest.raises(Exception, match="many"):
        validate_config(cfg)


def test_kuberay_manifest_derives_autoscaling_config():
    from ray.autoscaler._private.kuberay.autoscaling_config import (
        _derive_autoscaling_config_from_ray_cr,
    )
    from ray.autoscaler._private.util import validate_config

    cr = yaml.safe_load((CLUSTER / "kuberay.yaml").read_text())
    assert cr["spec"]["enableInTreeAutoscaling"] is True
    assert cr["spec"]["autoscalerOptions"]["version"] == "v2"
    derived = _derive_autoscaling_config_from_ray_cr(cr)
    validate_config(derived)
    types = derived["available_node_types"]
    assert types["gpu-8xh100"]["resources"]["GPU"] == 8
    assert types["gpu-8xh100"]["max_workers"] == 4 and types["gpu-8xh100"]["min_workers"] == 0
    assert types["gpu-1x"]["resources"]["GPU"] == 1
    assert types["headgroup"]["resources"].get("trial_driver") == 4


@pytest.mark.parametrize("name", ["aws.yaml", "gcp.yaml"])
def test_launcher_configs_are_closed(name):
    """Dashboards on localhost only, token authentication on every node, secrets as files."""
    cfg = yaml.safe_load((CLUSTER / name).read_text())
    starts = cfg["head_start_ray_commands"] + cfg["worker_start_ray_commands"]
    for c in (c for c in starts if "ray start" in c):
        assert c.startswith("RAY_AUTH_MODE=token ray start"), c
    head = next(c for c in cfg["head_start_ray_commands"] if "ray start" in c)
    assert "--dashboard-host=127.0.0.1" in head and "0.0.0.0" not in (CLUSTER / name).read_text()
    assert any(k.endswith(".ray/auth_token") for k in cfg["file_mounts"])
    assert "WANDB_API_KEY" not in (CLUSTER / name).read_text()


def test_kuberay_pods_are_closed():
    cr = yaml.safe_load((CLUSTER / "kuberay.yaml").read_text())
    assert cr["spec"]["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "127.0.0.1"
    pods = [cr["spec"]["headGroupSpec"]["template"]["spec"]] + [
        g["template"]["spec"] for g in cr["spec"]["workerGroupSpecs"]]
    for pod in pods:
        vols = {v["name"] for v in pod["volumes"]}
        for c in pod["containers"]:
            env = {e["name"]: e for e in c["env"]}
            assert env["RAY_AUTH_MODE"]["value"] == "token"
            assert env["RAY_AUTH_TOKEN_PATH"]["value"].startswith("/etc/ray-auth")
            assert "WANDB_API_KEY" not in env
            assert {m["name"] for m in c["volumeMounts"]} <= vols


@pytest.mark.parametrize("name", ["aws.yaml", "gcp.yaml"])
def test_launcher_configs_run_as_shipped(name):
    """The sync leaves .venv, results and caches behind; every node installs the package with
    its gpu extra under the head's versions (constraints.txt, one documented command); the GPU
    nodes reach the bucket through an instance profile / a service account; the W&B key is a
    netrc file."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    cfg = prepare_config(yaml.safe_load((CLUSTER / name).read_text()))
    validate_config(cfg)
    assert cfg["file_mounts_sync_continuously"] is False
    excluded = set(cfg["rsync_exclude"])
    assert {"**/.venv", "**/results", "**/__pycache__", "**/.cache", "**/.git"} <= excluded
    setup = "\n".join(cfg["setup_commands"])
    assert "pip install -q -c constraints.txt '.[gpu]'" in setup and " -e " not in setup
    assert "python -m sweeps.cluster constraints > constraints.txt" in setup  # the way out
    for t, spec in cfg["available_node_types"].items():
        if t == "head":
            continue  # Ray's own profile / service account (EC2/GCE and storage)
        nc = spec["node_config"]
        if name == "aws.yaml":
            assert nc["IamInstanceProfile"]["Name"], t
        else:
            sa = nc["serviceAccounts"][0]
            assert sa["email"].endswith(".iam.gserviceaccount.com") and sa["scopes"], t
    assert cfg["file_mounts"]["/home/ubuntu/.netrc"].endswith("wandb.netrc")


def test_kuberay_pods_install_the_pinned_package_as_the_service_account():
    cr = yaml.safe_load((CLUSTER / "kuberay.yaml").read_text())
    pods = [cr["spec"]["headGroupSpec"]["template"]["spec"]] + [
        g["template"]["spec"] for g in cr["spec"]["workerGroupSpecs"]]
    for pod in pods:
        assert pod["serviceAccountName"] == "upcycle-sweeps"
        vols = {v["name"]: v for v in pod["volumes"]}
        (init,) = pod["initContainers"]
        cmd = init["command"][-1]
        assert "-c /etc/upcycle-pkg/constraints.txt" in cmd and "[gpu]" in cmd
        assert {m["name"] for m in init["volumeMounts"]} <= set(vols)
        assert vols["upcycle-pkg"]["configMap"]["name"] == "upcycle-sweeps"
        for c in pod["containers"]:
            env = {e["name"]: e["value"] for e in c["env"]}
            assert env["PYTHONPATH"] == "/opt/upcycle" and env["NETRC"] == "/etc/wandb/netrc"


def test_constraints_pin_what_this_environment_runs(capsys):
    import importlib.metadata as md

    from sweeps.cluster.__main__ import main

    assert main(["constraints"]) == 0
    lines = capsys.readouterr().out.splitlines()
    pins = dict(line.split("==") for line in lines if not line.startswith("#"))
    assert pins["pyarrow"] == md.version("pyarrow")
    assert pins["torch"] == md.version("torch").split("+")[0]  # no local label (+cpu)
    assert "upcycle-sweeps" not in pins and "pip" not in pins

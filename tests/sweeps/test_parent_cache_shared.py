"""A parent trained on several ranks (``resources.parent_ranks`` > 1, or ``auto`` resolving
above 1) is written by its rank 0 into the parent cache and read back by its task, maybe on
another node: on a cluster of several machines a cache on a node-local filesystem is refused in
one line before anything launches (``sweeps.plan.preflight.check_parent_cache``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeps.plan import preflight
from sweeps.plan.preflight import check_parent_cache, fs_type, hosts_of, mount_type
from sweeps.run.cli import main

MOUNTS = """overlay / overlay rw 0 0
proc /proc proc rw 0 0
10.0.0.5:/export /mnt/shared nfs4 rw 0 0
/dev/nvme1n1 /mnt/shared/scratch ext4 rw 0 0
/dev/sdb /data xfs rw 0 0
tmpfs /data tmpfs rw 0 0
"""


@pytest.mark.parametrize("path,kind", [
    ("/home/u/results/parents", "overlay"),  # only the root above it
    ("/mnt/shared/sweeps/parents", "nfs4"),  # the longest mount point above it
    ("/mnt/shared/scratch/p", "ext4"),  # a node-local disk mounted inside the share
    ("/mnt/sharedx/p", "overlay"),  # a name that merely starts like a mount point
    ("/data/p", "tmpfs"),  # the later of two mounts on one point hides the earlier
])
def test_fs_type_is_the_longest_mount_point_above_the_path(path, kind):
    assert mount_type(path, MOUNTS) == kind


def test_fs_type_reads_this_machines_mounts_for_a_folder_not_made_yet(tmp_path):
    assert fs_type(tmp_path / "not" / "yet") == mount_type(str(tmp_path.resolve()),
                                                           Path("/proc/mounts").read_text())


def test_hosts_are_distinct_node_addresses():
    one = [{"CPU": 2, "node:127.0.0.1": 1, "node:__internal_head__": 1},
           {"CPU": 2, "node:127.0.0.1": 1}]  # the local fake cluster: raylets on one machine
    assert hosts_of(one) == 1
    assert hosts_of(one + [{"GPU": 8, "node:10.0.0.7": 1}]) == 2


@pytest.mark.parametrize("cache,hosts,ranks,kind,refused", [
    ("/r/parents", 2, 8, "ext4", True),
    ("/r/parents", 5, 2, "overlay", True),
    ("/r/parents", 2, 8, "nfs4", False),  # storage every node mounts
    ("/r/parents", 2, 8, "lustre", False),
    ("/r/parents", 2, 8, None, False),  # unknown (not Linux): not refused on a guess
    ("s3://bucket/parents", 2, 8, None, False),
    ("/r/parents", 1, 8, "ext4", False),  # one machine: every rank sees its disk
    ("/r/parents", 4, 1, "ext4", False),  # one-rank parents hand their state over Ray
])
def test_a_node_local_cache_of_a_multi_rank_parent_on_several_machines_is_refused(
        cache, hosts, ranks, kind, refused):
    problems = check_parent_cache(cache, hosts, ranks, kind)
    assert bool(problems) == refused
    if refused:
        (p,) = problems
        line = p.line()
        assert p.key == "storage.parent_cache" and p.fatal and "\n" not in line
        assert f"{ranks} ranks" in line and f"{hosts} machines" in line
        assert "s3://" in line and "resources.parent_ranks: 1" in line


RECIPE = "search_spaces/cluster/upcycle_lr_8xh100.yaml"  # parent_ranks: auto -> 8 on 8 GPUs


def test_the_dry_run_on_a_cluster_refuses_it_before_launch(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(preflight, "fs_type", lambda path: "ext4")
    assert main([RECIPE, "--dry-run", "--cluster", "sweeps/cluster/aws.yaml",
                 "--results", str(tmp_path)]) == 2
    refusal = [ln for ln in capsys.readouterr().err.splitlines() if "storage.parent_cache" in ln]
    assert len(refusal) == 1 and refusal[0].startswith("error: storage.parent_cache: ")
    # auto -> 8 ranks; the AWS config's node types reach 17 machines (head + 4 + 12)
    assert "parents train on 8 ranks on a cluster of 17 machines" in refusal[0]


def test_the_run_refuses_it_once_connected_before_any_parent_starts(tmp_path, monkeypatch):
    """``sweeps.run.driver.parent_cache`` (called right after connecting, before the parents):
    the connected cluster's machines (``resources.ray_hosts``) and the ranks its parents get."""
    import yaml

    from moe_core.errors import SearchSpaceError
    from sweeps.plan import resources
    from sweeps.plan.build import build_plan
    from sweeps.run import driver
    from sweeps.spec.sweep import load_spec
    from tests.sweeps.tiny import tiny_base

    base = tiny_base(parent={"tokens": 2048, "seed": 0}, moe={"num_experts": 4, "top_k": 2},
                     upcycle={"method": "dense_to_moe"}, tokens=512,
                     batch={"global_batch": 8, "micro_batch": 4})
    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump({"sweep": "pr", "results": str(tmp_path / "r"), "base": base,
                                 "resources": {"cpus": 1, "gpus": 0, "parent_ranks": 2}}))
    spec = load_spec(str(f))
    plan = build_plan(spec)
    monkeypatch.setattr(preflight, "fs_type", lambda path: "xfs")
    monkeypatch.setattr(resources, "ray_hosts", lambda: 1)  # one machine: any folder will do
    assert driver.parent_cache(spec, plan, tmp_path / "r" / "pr") == \
        str((tmp_path / "r" / "pr" / "parents").resolve())
    monkeypatch.setattr(resources, "ray_hosts", lambda: 3)
    with pytest.raises(SearchSpaceError, match=r"^storage\.parent_cache: .* \(xfs\) but parents "
                                               r"train on 2 ranks on a cluster of 3 machines"):
        driver.parent_cache(spec, plan, tmp_path / "r" / "pr")
    monkeypatch.setattr(preflight, "fs_type", lambda path: "nfs4")  # a shared mount passes
    assert driver.parent_cache(spec, plan, tmp_path / "r" / "pr")

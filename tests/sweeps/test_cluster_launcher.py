"""``--dry-run --cluster``: the shipped 8×H100 recipe checked against the shipped AWS and GCP
launcher configs' node types, and a one-line refusal naming the knob for each thing that does
not fit; no cloud is contacted (``sweeps.cluster.launcher``)."""

from __future__ import annotations

import pytest

from moe_core.errors import SearchSpaceError
from sweeps.cluster.launcher import check_launcher, cluster_gpu, read_launcher
from sweeps.plan import resources
from sweeps.plan.build import build_plan
from sweeps.run.cli import main
from sweeps.spec.sweep import load_spec

RECIPE = "search_spaces/cluster/upcycle_lr_8xh100.yaml"


def _check(config, tmp_path, *over):
    types = read_launcher(config)
    spec = load_spec(RECIPE, list(over), results=str(tmp_path))
    spec = resources.resolve(spec, {"GPU": sum(t.gpus for t in types)})
    return check_launcher(spec, build_plan(spec), types, config)


@pytest.mark.parametrize("config,instance,disk_gib", [("sweeps/cluster/aws.yaml",
                                                       "p5.48xlarge", 1000),
                                                      ("sweeps/cluster/gcp.yaml",
                                                       "a3-highgpu-8g", 931)])
def test_the_recipe_fits_the_shipped_configs(config, instance, disk_gib, tmp_path):
    types = {t.name: t for t in read_launcher(config)}
    node = types["gpu_8xh100"]
    assert (node.instance, node.gpus, node.gpu, node.gpu_memory_gb, node.max_workers) == \
        (instance, 8, "h100", 80, 4)
    assert int(node.disk_bytes / 2 ** 30) == disk_gib and node.custom == {"trial_driver": 8}
    assert types["head"].gpus == 0 and types["head"].cpus == 0  # resources: override the table
    assert cluster_gpu(list(types.values())) == "h100"
    problems, lines = _check(config, tmp_path)
    assert problems == []
    assert "1 trial(s) of 8 ranks × (1 GPU, 8 CPUs) per node, ≤4 node(s)" in lines[0]
    assert lines[-1].endswith("at most 4 trial(s) at once (max_concurrent 4)")


@pytest.mark.parametrize("over,key,says", [
    (["resources.ranks=16"], "resources.ranks", "one trial needs 16 ranks"),
    (["max_concurrent=6"], "max_concurrent", "set max_concurrent: 4"),
    (["base.batch.micro_batch=64", "resources.ranks=1"], "base.batch.micro_batch",
     "per GPU (estimate)"),
    (["checkpoint.keep=200"], "checkpoint.keep", "raise the disk of gpu_8xh100"),
])
def test_each_misfit_is_one_line_naming_the_knob(over, key, says, tmp_path):
    problems, _ = _check("sweeps/cluster/aws.yaml", tmp_path, *over)
    assert [p.key for p in problems] == [key], [p.line() for p in problems]
    assert says in problems[0].message and "\n" not in problems[0].line()


def test_configs_it_cannot_read_are_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(SearchSpaceError, match="not a Ray cluster launcher config"):
        read_launcher("sweeps/cluster/kuberay.yaml")
    bad = tmp_path / "odd.yaml"
    bad.write_text("available_node_types:\n  w: {node_config: {InstanceType: x9.huge}}\n")
    with pytest.raises(SearchSpaceError, match=r"node type w is 'x9.huge', not a known .*"
                                               r"resources: \{CPU: n, GPU: n\}"):
        read_launcher(str(bad))
    assert main([RECIPE, "--cluster", "sweeps/cluster/aws.yaml"]) == 2  # needs --dry-run
    assert "use it with --dry-run" in capsys.readouterr().err

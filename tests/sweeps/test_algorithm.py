"""The search algorithm and scheduler plug-ins (``sweeps.spec.algorithm``, issue #40): one
registry entry per name of the spec's Literals, plug-ins that load without Ray, and a driver
with no branch on the algorithm or the scheduler."""

from __future__ import annotations

import ast
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from moe_core.errors import SearchSpaceError
from sweeps.spec import algorithm
from sweeps.spec.sweep import SweepSpec, parse_spec
from tests.sweeps.tiny import tiny_base

ROOT = Path(__file__).resolve().parents[2]


def test_each_name_the_spec_allows_has_one_plug_in():
    assert tuple(algorithm.SEARCHERS) == typing.get_args(algorithm.AlgorithmName)
    assert tuple(algorithm.SCHEDULERS) == typing.get_args(algorithm.SchedulerName)
    for name in (*algorithm.SEARCHERS, *algorithm.SCHEDULERS):
        p = algorithm.plugin(name)
        assert isinstance(p, algorithm.Algorithm) and p.name == name
    hints = typing.get_type_hints(SweepSpec)
    assert hints["algorithm"] == algorithm.AlgorithmName
    assert hints["scheduler"] == algorithm.SchedulerName


def test_plug_ins_load_without_ray_or_torch():
    """What ``--dry-run`` asks of them (checks, plan lines, records) imports neither."""
    code = ("import sys\nfrom sweeps.spec import algorithm as a\n"
            "[a.plugin(n) for n in (*a.SEARCHERS, *a.SCHEDULERS)]\n"
            "print(sorted(m for m in ('ray', 'torch', 'optuna') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


def test_the_driver_has_no_branch_on_the_algorithm_or_scheduler():
    tree = ast.parse((ROOT / "sweeps" / "run" / "driver.py").read_text())
    names = set(algorithm.SEARCHERS) | set(algorithm.SCHEDULERS)
    compared = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Compare) and any(
        isinstance(c, ast.Constant) and c.value in names for c in [n.left, *n.comparators])]
    attrs = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute)
             and n.attr in ("law", "asha")]
    assert compared == [] and attrs == []


def test_a_settings_block_belongs_to_its_algorithm():
    base = {"sweep": "s", "base": tiny_base(), "search": {"optim.lr": {"grid": [1e-3, 2e-3]}}}
    with pytest.raises(SearchSpaceError, match="law: is set but algorithm is not law"):
        parse_spec({**base, "law": {"law": "eq8"}})
    with pytest.raises(SearchSpaceError, match="algorithm=law needs a law: block"):
        parse_spec({**base, "algorithm": "law"})
    spec = parse_spec(base)
    assert algorithm.settings_records(spec) == {"law": None}


def _optuna_spec(search: dict, **kw) -> SweepSpec:
    return parse_spec({"sweep": "s", "base": tiny_base(), "algorithm": "optuna",
                       "search": search, **kw})


def test_optuna_refuses_what_its_sampler_cannot_run_before_ray():
    grid = {"optim.lr": {"grid": [1e-3, 2e-3]}}
    with pytest.raises(SearchSpaceError, match=r"^search\.optim\.lr is a grid, but"):
        _optuna_spec({**grid, "optim.weight_decay": {"choice": [0.0, 0.1]}})
    with pytest.raises(SearchSpaceError, match=r"^seeds=\[0, 1\] with algorithm=optuna \(TPE\)"):
        _optuna_spec({"optim.lr": {"loguniform": [1e-4, 1e-2]}}, seeds=[0, 1], num_samples=2)
    with pytest.raises(SearchSpaceError, match=r"^num_samples=2 with algorithm=optuna and every"):
        _optuna_spec(grid, num_samples=2)


@pytest.mark.distributed
def test_optuna_runs_every_grid_point_once_and_tpe_its_draws_through_tune(tmp_path):
    """The plug-in's param_space, searcher and num_samples, as the driver hands them to Tune
    (``sweeps.run.driver._tuner``), on a trainable that trains nothing: GridSampler runs every
    point of the grid × seeds once; TPE runs num_samples draws of its sampled knob. (Before
    this, Tune refused the grid: its param_space held grid_search beside the searcher's space.)"""
    import ray
    from ray import tune

    grid = _optuna_spec({"optim.lr": {"grid": [1e-3, 2e-3, 3e-3]}}, seeds=[0, 1])
    tpe = _optuna_spec({"optim.lr": {"loguniform": [1e-4, 1e-2]}}, num_samples=3)
    p = algorithm.plugin("optuna")

    def trainable(config):
        tune.report({grid.metric: float(config["optim.lr"]) + config.get("seed", 0)})

    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    try:
        got = {}
        for name, spec in (("grid", grid), ("tpe", tpe)):
            search = p.searcher(spec, None, None)
            results = tune.Tuner(
                trainable, param_space=p.param_space(spec),
                tune_config=tune.TuneConfig(search_alg=search,
                                            num_samples=p.num_samples(spec, search)),
                run_config=tune.RunConfig(storage_path=str(tmp_path / name), verbose=0),
            ).fit()
            assert not results.errors
            got[name] = [(r.config["optim.lr"], r.config.get("seed")) for r in results]
    finally:
        ray.shutdown()
    assert sorted(got["grid"]) == [(lr, s) for lr in (1e-3, 2e-3, 3e-3) for s in (0, 1)]
    assert len(got["tpe"]) == 3 and all(1e-4 <= lr <= 1e-2 and s is None
                                        for lr, s in got["tpe"])

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

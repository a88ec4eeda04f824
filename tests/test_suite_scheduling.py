"""``make test`` runs the suite on three pytest-xdist workers with ``--dist loadgroup``; the
suite's conftest deals the tests marked ``distributed`` into one ``xdist_group`` per worker, so
each worker runs its share of them one test after another (never two Ray sessions in one worker)
and the ungrouped tests fill in; a test that starts Ray, ranks or a sweep must be so marked.
Checked on a generated suite run under the same options, with the suite's own conftest; the
workers see the terminal size of the process that started the run (none here)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")
HEAVY = '''
import json, os
import pytest

def _log(kind, i):
    with open(os.environ["LOG"], "a") as f:
        f.write(json.dumps([kind, i, os.environ["PYTEST_XDIST_WORKER"],
                            os.environ.get("COLUMNS")]) + "\\n")

@pytest.mark.distributed
@pytest.mark.parametrize("i", range({n}))
def test_heavy(i):
    _log("{name}", i)
'''
LIGHT = '''
import json, os
import pytest

def _log(kind, i):
    with open(os.environ["LOG"], "a") as f:
        f.write(json.dumps([kind, i, os.environ["PYTEST_XDIST_WORKER"],
                            os.environ.get("COLUMNS")]) + "\\n")

@pytest.mark.parametrize("i", range(6))
def test_light(i):
    _log("light", i)
'''
INI = "[pytest]\nmarkers =\n    distributed: spawns several processes\n"
# test_c lists no estimate (3 x DEFAULT_S = 60 s), test_a 3 x 15 = 45 s, test_b 2 x 10 = 20 s:
# c goes to one worker, a to the other, then b to a's (45 < 60)
MODULES = {"a": 3, "b": 2, "c": 3}
ESTIMATES = {**{f"test_a.py::test_heavy[{i}]": 15 for i in range(3)},
             **{f"test_b.py::test_heavy[{i}]": 10 for i in range(2)}}


def test_deal_weighs_whole_modules_heaviest_first():
    from tests.conftest import DEFAULT_S, deal

    ids = [f"test_{m}.py::test_heavy[{i}]" for m, n in MODULES.items() for i in range(n)]
    got = deal(ids, 2, ESTIMATES)
    assert DEFAULT_S == 20.0
    assert got == {i: (0 if "test_c" in i else 1) for i in ids}
    assert deal(ids, 1, ESTIMATES) == {i: 0 for i in ids}
    # equal weights: collection order breaks the tie, the lower group first
    assert deal(["x.py::t", "y.py::t"], 2, {}) == {"x.py::t": 0, "y.py::t": 1}
    assert deal(ids, 3, ESTIMATES) == {i: "cab".index(i[5]) for i in ids}


@pytest.mark.slow  # two worker processes start
def test_distributed_tests_are_dealt_one_group_per_worker_under_loadgroup(tmp_path):
    pytest.importorskip("xdist", reason="pytest-xdist (the dev extra) is not installed")
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    for m, n in MODULES.items():
        (tmp_path / f"test_{m}.py").write_text(HEAVY.replace("{n}", str(n)).replace("{name}", m))
    (tmp_path / "test_light.py").write_text(LIGHT)
    (tmp_path / "durations.json").write_text(json.dumps(ESTIMATES))
    (tmp_path / "pytest.ini").write_text(INI)
    log = tmp_path / "log.jsonl"
    out = subprocess.run([sys.executable, "-m", "pytest", "-v", "-n", "2", "--dist", "loadgroup",
                          "-p", "no:cacheprovider", "."], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300,
                         env={**{k: v for k, v in os.environ.items()
                                 if k not in ("COLUMNS", "LINES")}, "LOG": str(log)})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted((k, i) for k, i, _, _ in rows) == sorted(
        [(m, i) for m, n in MODULES.items() for i in range(n)]
        + [("light", i) for i in range(6)])  # each ran once
    worker_of = {m: {w for k, _, w, _ in rows if k == m} for m in MODULES}
    assert [len(w) for w in worker_of.values()] == [1, 1, 1], rows  # a module on one worker
    assert worker_of["a"] == worker_of["b"] != worker_of["c"], rows  # dealt by the estimates
    assert {w for _, _, w, _ in rows} == {"gw0", "gw1"}, rows
    assert {c for *_, c in rows} == {None}, rows  # no 80-column terminal made up in a worker
    for g, n in ((0, 3), (1, 5)):  # the group is in the node ids xdist reads
        tagged = [ln for ln in out.stdout.splitlines()
                  if "PASSED" in ln and f"@distributed-{g}" in ln]
        assert len(tagged) == n, out.stdout[-3000:]


def test_every_estimate_names_a_test_of_the_suite():
    """``tests/durations.json`` names tests that exist (a renamed or moved test's estimate would
    silently fall back to the default): each key's file defines its test function."""
    root = CONFTEST.parent.parent
    estimates = json.loads(CONFTEST.with_name("durations.json").read_text())
    assert estimates and all(v > 0 for v in estimates.values())
    for nodeid in estimates:
        path, name = nodeid.split("::")
        assert f"def {name.split('[')[0]}(" in (root / path).read_text(), nodeid


REFUSED_BEFORE_RAY = {
    "tests/sweeps/test_bucket_check.py::test_the_run_stops_before_ray_on_a_stalled_endpoint",
    "tests/sweeps/test_hostile_inputs.py::test_hostile_spec_that_hung_is_refused_quickly",
}
"""Tests that run a sweep which must be refused before Ray starts (what they check)."""


def _starts_processes(fn) -> bool:
    """Whether a test function's own body starts Ray, gloo ranks or a sweep: it calls
    ``ray.init``, ``start_ranks`` or ``local_cluster``, or runs ``-m sweeps.run`` without
    ``--dry-run``. (What a helper it calls starts is not seen.)"""
    import ast

    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if name in ("start_ranks", "local_cluster") or (
                name == "init" and getattr(f.value, "id", "") == "ray"):
            return True
        words = {c.value for a in node.args if isinstance(a, ast.List)
                 for c in a.elts if isinstance(c, ast.Constant)}
        if "sweeps.run" in words and "--dry-run" not in words:
            return True
    return False


def test_tests_that_start_ray_ranks_or_a_sweep_are_marked_distributed():
    """Unmarked, such a test is not dealt to a worker's group: it runs beside two that are
    (three sweeps on two cores) and in ``make test-fast``. A test inserted between a test and
    its decorators once took them (``test_hf_sweep``: a whole sweep, unmarked, for months)."""
    import ast

    unmarked = []
    for path in sorted(CONFTEST.parent.rglob("test_*.py")):
        src = path.read_text()
        tree = ast.parse(src)
        module_marks = " ".join(ast.get_source_segment(src, n) or "" for n in tree.body
                                if isinstance(n, ast.Assign)
                                and any(getattr(t, "id", "") == "pytestmark" for t in n.targets))
        for fn in tree.body:
            if not (isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_")):
                continue
            marks = " ".join(ast.get_source_segment(src, d) or "" for d in fn.decorator_list)
            nodeid = f"{path.relative_to(CONFTEST.parent.parent)}::{fn.name}"
            if ("distributed" not in marks + module_marks and _starts_processes(fn)
                    and nodeid not in REFUSED_BEFORE_RAY):
                unmarked.append(nodeid)
    assert not unmarked, unmarked

"""``make test`` runs the suite on two pytest-xdist workers with ``--dist loadgroup``; the
suite's conftest deals the tests marked ``distributed`` into one ``xdist_group`` per worker, so
each worker runs its half of them one test after another (never two Ray sessions in one worker)
and the ungrouped tests fill in.
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
SUITE = '''
import json, os
import pytest

def _log(kind, i):
    with open(os.environ["LOG"], "a") as f:
        f.write(json.dumps([kind, i, os.environ["PYTEST_XDIST_WORKER"],
                            os.environ.get("COLUMNS")]) + "\\n")

@pytest.mark.distributed
@pytest.mark.parametrize("i", range(8))
def test_heavy(i):
    _log("heavy", i)

@pytest.mark.parametrize("i", range(6))
def test_light(i):
    _log("light", i)
'''
INI = "[pytest]\nmarkers =\n    distributed: spawns several processes\n"


@pytest.mark.slow  # two worker processes start
def test_distributed_tests_are_dealt_one_group_per_worker_under_loadgroup(tmp_path):
    pytest.importorskip("xdist", reason="pytest-xdist (the dev extra) is not installed")
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_generated.py").write_text(SUITE)
    (tmp_path / "pytest.ini").write_text(INI)
    log = tmp_path / "log.jsonl"
    out = subprocess.run([sys.executable, "-m", "pytest", "-v", "-n", "2", "--dist", "loadgroup",
                          "-p", "no:cacheprovider", "test_generated.py"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300,
                         env={**{k: v for k, v in os.environ.items()
                                 if k not in ("COLUMNS", "LINES")}, "LOG": str(log)})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted((k, i) for k, i, _, _ in rows) == sorted(
        [("heavy", i) for i in range(8)] + [("light", i) for i in range(6)])  # each ran once
    worker_of = {i: w for k, i, w, _ in rows if k == "heavy"}
    groups = [{worker_of[i] for i in range(g, 8, 2)} for g in (0, 1)]  # dealt alternately
    assert [len(g) for g in groups] == [1, 1], rows  # a group stays on one worker
    assert groups[0] != groups[1], rows  # and the two groups on two workers
    assert {w for _, _, w, _ in rows} == {"gw0", "gw1"}, rows
    assert {c for *_, c in rows} == {None}, rows  # no 80-column terminal made up in a worker
    for g in (0, 1):  # the group is in the node ids xdist reads
        tagged = [ln for ln in out.stdout.splitlines()
                  if "PASSED" in ln and f"@distributed-{g}" in ln]
        assert len(tagged) == 4, out.stdout[-3000:]

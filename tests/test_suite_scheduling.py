"""``make test`` runs the suite on two pytest-xdist workers with ``--dist loadgroup``; the
suite's conftest puts every test marked ``distributed`` into one ``xdist_group`` (those of
``tests/moe_core``, gloo ranks without Ray, into a second), so each group runs on one worker, one
test after another: never two Ray sessions at once.
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
@pytest.mark.parametrize("i", range(6))
def test_heavy(i):
    _log("heavy", i)

@pytest.mark.parametrize("i", range(6))
def test_light(i):
    _log("light", i)
'''
RANKS = '''
import json, os
import pytest

@pytest.mark.distributed
@pytest.mark.parametrize("i", range(3))
def test_ranks(i):
    with open(os.environ["LOG"], "a") as f:
        f.write(json.dumps(["ranks", i, os.environ["PYTEST_XDIST_WORKER"],
                            os.environ.get("COLUMNS")]) + "\\n")
'''
INI = "[pytest]\nmarkers =\n    distributed: spawns several processes\n"


@pytest.mark.slow  # two worker processes start
def test_distributed_tests_share_one_worker_under_loadgroup(tmp_path):
    pytest.importorskip("xdist", reason="pytest-xdist (the dev extra) is not installed")
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_generated.py").write_text(SUITE)
    (tmp_path / "pytest.ini").write_text(INI)
    (tmp_path / "moe_core").mkdir()  # the gloo-rank tests' folder: the second group
    (tmp_path / "moe_core" / "test_generated_ranks.py").write_text(RANKS)
    log = tmp_path / "log.jsonl"
    out = subprocess.run([sys.executable, "-m", "pytest", "-v", "-n", "2", "--dist", "loadgroup",
                          "-p", "no:cacheprovider", "test_generated.py",
                          "moe_core/test_generated_ranks.py"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300,
                         env={**{k: v for k, v in os.environ.items()
                                 if k not in ("COLUMNS", "LINES")}, "LOG": str(log)})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted((k, i) for k, i, _, _ in rows) == sorted(
        [(k, i) for k in ("heavy", "light") for i in range(6)] +
        [("ranks", i) for i in range(3)])  # each test ran once
    assert len({w for k, _, w, _ in rows if k == "heavy"}) == 1, rows  # one at a time
    assert len({w for k, _, w, _ in rows if k == "ranks"}) == 1, rows  # its own group
    assert {w for _, _, w, _ in rows} == {"gw0", "gw1"}, rows  # and both workers were used
    assert {c for *_, c in rows} == {None}, rows  # no 80-column terminal made up in a worker
    tagged = [ln for ln in out.stdout.splitlines() if "PASSED" in ln and "@distributed" in ln]
    assert len(tagged) == 6, out.stdout[-3000:]  # the group is in the node ids xdist reads
    ranks = [ln for ln in out.stdout.splitlines() if "PASSED" in ln and "@ranks" in ln]
    assert len(ranks) == 3, out.stdout[-3000:]

"""The front door answers without the training stack: refusing a bad spec, a dry run and ``--help``
import none of torch, Ray, DeepSpeed or transformers (issue 29: a validator should answer in a
second)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "ray", "deepspeed", "transformers")

# Runs ``python -m sweeps.run ARGS`` in this process, then prints which heavy packages it loaded
# and the exit code as one JSON line on stdout.
PROBE = (
    "import json, runpy, sys\n"
    "sys.argv = ['sweeps.run', *sys.argv[1:]]\n"
    "code = 0\n"
    "try:\n"
    "    runpy.run_module('sweeps.run', run_name='__main__')\n"
    "except SystemExit as e:\n"
    "    code = e.code\n"
    f"heavy = sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))\n"
    "print(json.dumps({'code': code, 'heavy': heavy}))\n"
)


def _probe(*args: str) -> tuple[dict, str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stdout, out.stderr


@pytest.mark.parametrize("base, message", [
    ("optim: {lr: -1}", "error: base: optim.lr=-1 must be > 0"),
    ("moe: {num_experts: 4, top_k: 8}", "error: base: moe.top_k=8 exceeds moe.num_experts=4"),
])
def test_refusing_a_bad_spec_imports_no_training_stack(tmp_path, base, message):
    spec = tmp_path / "bad.yaml"
    spec.write_text(f"sweep: bad\nbase:\n  {base}\nsearch: {{}}\nmetric: val_loss\n")
    got, _, err = _probe(str(spec), "--dry-run")
    assert got["code"] == 2
    assert err.strip().startswith(message) and len(err.strip().splitlines()) == 1, err
    assert got["heavy"] == [], f"refusing a bad spec imported {got['heavy']}"


def test_a_dry_run_imports_no_training_stack():
    """A valid spec's dry run plans every trial and parent (cache keys included) torch-free."""
    got, out, err = _probe("search_spaces/top_k.yaml", "--dry-run")
    assert got["code"] == 0, err
    assert "distinct parents: 2" in out
    assert got["heavy"] == [], f"a dry run imported {got['heavy']}"


def test_help_imports_no_training_stack():
    got, out, _ = _probe("--help")
    assert got["code"] == 0 and "--dry-run" in out
    assert got["heavy"] == [], f"--help imported {got['heavy']}"


def test_the_probe_sees_a_heavy_import(tmp_path):
    """The check can fail: a spec module that imports torch is seen."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = PROBE.replace("runpy.run_module('sweeps.run', run_name='__main__')",
                         "import moe_core.model")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=120, check=True)
    assert "torch" in json.loads(out.stdout.strip().splitlines()[-1])["heavy"]

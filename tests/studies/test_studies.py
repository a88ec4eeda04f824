"""The research studies under studies/ run from a clone: with no input they say so in one line,
and the prune replay drives Ray Tune's public ASHA exactly as its rung rule decides."""

from __future__ import annotations

import importlib.util
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "studies" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_prune_replay_without_its_inputs_is_one_line(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "studies" / "prune_replay.py")],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "make demo" in out.stderr, out.stderr


def test_public_asha_is_the_rung_rule_the_replay_used():
    """AsyncHyperBandScheduler with one bracket (the public API) stops exactly the trials that
    its rung rule (``_Bracket``, which the replay drove before) stops, on random loss streams."""
    from ray.tune.schedulers.async_hyperband import _Bracket

    pr = _load("prune_replay")
    rng = random.Random(0)
    for _ in range(30):
        n, max_t = rng.randint(3, 8), rng.randint(3, 9)
        sched, bracket = pr.asha(2, max_t, 3.0), _Bracket(2, max_t, 3.0, s=0)
        trials = [pr._T(f"t{i}") for i in range(n)]
        for t in trials:
            sched.on_trial_add(None, t)
        alive = set(range(n))
        for rung in range(1, max_t + 1):
            for i in sorted(alive):
                loss = rng.uniform(1.0, 3.0)
                a = sched.on_trial_result(None, trials[i], {"rung": rung, "loss": loss})
                b = bracket.on_result(trials[i], rung, -loss)
                assert a == b
                if a == "STOP":
                    alive.discard(i)


def test_design_bound_study_runs_from_a_clone():
    out = subprocess.run([sys.executable, str(ROOT / "studies" / "law_design_bound.py"),
                          "--points", "4", "--groups", "1"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert '"bound_cost_ratio"' in out.stdout.splitlines()[-1]

"""The node-local parent lock (``sweeps.run.parents``, a ``filelock.FileLock``): two processes that
both miss a parent in the disk cache at once contend for its lock, and only one trains it; the
other waits, then loads what the first cached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from moe_core.train.runner import parent_key
from sweeps.plan.build import build_plan
from sweeps.spec.sweep import parse_spec
from tests.sweeps.tiny import tiny_base

BASE = tiny_base(moe={"num_experts": 4, "top_k": 2},
                 batch={"global_batch": 8, "micro_batch": 8},
                 parent={"tokens": 512, "seed": 0}, upcycle={"method": "dense_to_moe"})

CHILD = """
import json, sys, time
from pathlib import Path
import sweeps.run.parents as parents
from sweeps.plan.build import build_plan
from sweeps.spec.sweep import parse_spec

raw, cache, log, go = json.loads(sys.argv[1]), *map(Path, sys.argv[2:5])
cfg = build_plan(parse_spec(raw)).trials[0].config
real = parents.train_parent

def recording(cfg, cache_dir, **kw):  # called under the lock only
    state, trained = real(cfg, cache_dir, **kw)
    with open(log, "a") as f:
        f.write(json.dumps({"pid": __import__("os").getpid(), "trained": trained}) + "\\n")
    return state, trained

parents.train_parent = recording
parents.cached_parent = lambda path, key: None  # both miss the cache before the lock
(log.parent / f"ready-{__import__('os').getpid()}").touch()
while not go.exists():
    time.sleep(0.01)
state = parents.get_parent(cfg, parents.parent_key(cfg), {}, cache)
print("loss", state.val_loss)
"""


@pytest.mark.slow
def test_two_processes_contend_for_a_parent_and_only_one_trains(tmp_path):
    raw = {"sweep": "lock", "base": BASE, "search": {"tokens": {"grid": [1024]}}}
    cfg = build_plan(parse_spec(raw)).trials[0].config
    cache, log, go = tmp_path / "cache", tmp_path / "log.jsonl", tmp_path / "go"
    env = dict(os.environ, PYTHONPATH=os.getcwd(), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(raw), str(cache),
                               str(log), str(go)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    while len(list(tmp_path.glob("ready-*"))) < 2 and all(p.poll() is None for p in procs):
        time.sleep(0.05)
    go.touch()
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    calls = [json.loads(x) for x in log.read_text().splitlines()]
    # both reached the lock; the one that took it first trained, the other found its cache
    assert sorted(c["trained"] for c in calls) == [False, True], calls
    assert len({c["pid"] for c in calls}) == 2
    assert len({o.split("loss")[-1] for o, _ in outs}) == 1  # the same parent in both
    assert (cache / parent_key(cfg) / "meta.json").exists()
    assert (cache / f"{parent_key(cfg)}.lock").exists()

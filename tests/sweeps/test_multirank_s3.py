"""A 2-rank trial (a Ray Train TorchTrainer inside the Tune trial, gloo, experts sharded across
the ranks) with ``results: s3://...`` on the local S3 server (moto): its ranks share no local
folder, as on two nodes. Each rank writes its own checkpoint files in its own staging folder
(``rank_checkpoints/<trial>/rank<r>``, rank 0's with ``meta.json``), Ray Train uploads every
rank's files into one checkpoint folder in the bucket (each object signed) and commits it once
both ranks reported; after an injected failure (rank 0, after its 3rd report: step 4, with a
checkpoint) the restarted ranks each download that checkpoint whole from the bucket into their
own folder, and the curve goes on at step 6 with no step twice."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import yaml

from tests import s3_server
from tests.sweeps.test_sweep_e2e import SPEC

s3 = s3_server.s3  # the moto server fixture

RANK_FILES = {0: {"model_rank0.safetensors", "optim_rank0.pt", "rng_rank0.pt"},
              1: {"model_rank1.safetensors", "optim_rank1.pt", "rng_rank1.pt"}}


@pytest.fixture
def work():
    d = Path(tempfile.mkdtemp(prefix="mr3", dir="/tmp"))  # short: Ray's socket paths
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.distributed
def test_two_rank_checkpoint_shards_reach_the_bucket_and_restore_from_it(s3, work, monkeypatch):
    base = dict(SPEC["base"])
    base.pop("parent")
    base.pop("upcycle")
    base["batch"] = {"global_batch": 8, "micro_batch": 4}
    base["tokens"] = 1536
    bucket = s3.bucket()
    url = f"s3://{bucket}/results"
    spec = dict(SPEC, base=base, results=url, resources={"cpus": 1, "ranks": 2},
                search={"moe.router.order": {"grid": ["topk_softmax"]}},
                logging={"wandb": {"enabled": False}})
    (work / "spec.yaml").write_text(yaml.safe_dump(spec))
    env = s3.sweep_env(work, UPCYCLE_SWEEPS_FAIL_ONCE_AFTER="3")
    out = subprocess.run([sys.executable, "-m", "sweeps.run", str(work / "spec.yaml")],
                         env=env, cwd=work, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]

    from sweeps.store.results import read_rows

    monkeypatch.delenv("UPCYCLE_SWEEPS_HMAC_KEY", raising=False)
    for k, v in s3.reader_env(work).items():  # the sweep's HMAC key: its files are signed
        monkeypatch.setenv(k, v)
    rows = read_rows(f"{url}/e2e")
    assert sorted(r["step"] for r in rows) == [0, 2, 4, 6]  # each step once
    assert {r["ranks"] for r in rows} == {2} and {r["status"] for r in rows} == {"ok"}
    (trial,) = {r["trial_id"] for r in rows}

    # the restarted ranks went on at step 6: from the step-4 checkpoint
    assert [p.read_text() for p in (work / "staging").rglob(".resumed-*")] == ["6"]

    # the bucket holds each committed checkpoint whole: both ranks' files, rank 0's manifest
    # listing them all, every object signed
    fs = s3.filesystem()
    train = f"{bucket}/results/e2e/train"
    objs = {i.path[len(train) + 1:] for i in
            fs.get_file_info(pafs.FileSelector(train, recursive=True))
            if i.type == pafs.FileType.File}
    ckpts = sorted({k.rsplit("/", 1)[0] for k in objs if k.endswith("/meta.json")})
    assert ckpts, sorted(objs)
    for ck in ckpts:
        names = {k.rsplit("/", 1)[1] for k in objs if k.rsplit("/", 1)[0] == ck}
        assert RANK_FILES[0] | RANK_FILES[1] | {"meta.json"} <= names, (ck, names)
        assert {n + ".upcycle-hmac" for n in RANK_FILES[0] | RANK_FILES[1]} <= names
        with fs.open_input_stream(f"{train}/{ck}/meta.json") as f:
            meta = json.loads(f.read())
        assert set(meta["sha256"]) == RANK_FILES[0] | RANK_FILES[1] and meta["world_size"] == 2

    # locally, each rank wrote only its own files, in its own folder: nothing shared
    (staged,) = (work / "staging").rglob(f"rank_checkpoints/{trial}")
    for rank in (0, 1):
        steps = [p for p in (staged / f"rank{rank}").glob("step_*") if p.is_dir()]
        assert steps, list((staged / f"rank{rank}").iterdir())
        for step in steps:
            names = {p.name for p in step.iterdir()}
            assert names == RANK_FILES[rank] | ({"meta.json"} if rank == 0 else set()), names
        # and after the restart it read the whole checkpoint back from the bucket
        restored = {p.name for p in (staged / f"rank{rank}" / "resume").iterdir()}
        assert RANK_FILES[0] | RANK_FILES[1] | {"meta.json"} <= restored, restored
    assert not [p for p in work.rglob("*") if "s3:" in p.parts or bucket in p.name]

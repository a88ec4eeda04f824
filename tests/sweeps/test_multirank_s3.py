"""2-rank trials (a Ray Train TorchTrainer inside each Tune trial, gloo, experts sharded across
the ranks) with ``results: s3://...`` on the local S3 server (moto): their ranks share no local
folder, as on two nodes. Each rank writes its own checkpoint files in its own staging folder
(``rank_checkpoints/<trial>/rank<r>``, rank 0's with ``meta.json``), Ray Train uploads every
rank's files into one checkpoint folder in the bucket (each object signed) and commits it once
both ranks reported; after an injected failure (rank 0, after its 3rd report: step 4, with a
checkpoint) the restarted ranks each download that checkpoint whole from the bucket into their
own folder, and the curve goes on at step 6 with no step twice; ``export: hf`` writes the whole
model (its shards gathered), equal to the last checkpoint's shards joined in expert order.

One sweep (one trial × 2 ranks, the module's fixture) serves both tests: each reads only its
results. One trial, not two: every assertion holds per trial, the two trials differed only in
the router order, which nothing here reads, and each is a Ray Train controller and two rank
processes started twice (the restart): the second doubled the module's time."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pyarrow.fs as pafs
import pytest
import torch
import yaml

from moe_core.hf import load_moe
from moe_core.train.checkpoint import load_checkpoint
from tests import s3_server
from tests.sweeps.test_sweep_e2e import SPEC

s3 = s3_server.s3  # the moto server fixture

RANK_FILES = {0: {"model_rank0.safetensors", "optim_rank0.pt", "rng_rank0.pt"},
              1: {"model_rank1.safetensors", "optim_rank1.pt", "rng_rank1.pt"}}


@pytest.fixture(scope="module")
def sweep(s3):
    """The module's one sweep: one trial (router order softmax_topk, the base's other) × 2 gloo
    ranks on the bucket, its rank 0 failing once after its 3rd report, ``export: hf``."""
    work = Path(tempfile.mkdtemp(prefix="mr3", dir="/tmp"))  # short: Ray's socket paths
    base = dict(SPEC["base"])
    base.pop("parent")
    base.pop("upcycle")
    base["batch"] = {"global_batch": 8, "micro_batch": 4}
    base["tokens"] = 1536
    bucket = s3.bucket()
    url = f"s3://{bucket}/results"
    spec = dict(SPEC, base=base, results=url, resources={"cpus": 1, "ranks": 2},
                search={"moe.router.order": {"grid": ["softmax_topk"]}},
                logging={"wandb": {"enabled": False}}, export="hf")
    (work / "spec.yaml").write_text(yaml.safe_dump(spec))
    env = s3.sweep_env(work, UPCYCLE_SWEEPS_FAIL_ONCE_AFTER="3")
    out = subprocess.run([sys.executable, "-m", "sweeps.run", str(work / "spec.yaml")],
                         env=env, cwd=work, capture_output=True, text=True, timeout=900)
    yield SimpleNamespace(work=work, bucket=bucket, url=url, out=out)
    shutil.rmtree(work, ignore_errors=True)


def _objects(fs, root: str) -> set[str]:
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    return {i.path[len(root) + 1:] for i in infos if i.type == pafs.FileType.File}


def _rows(s3, sweep, monkeypatch) -> list[dict]:
    from sweeps.store.results import read_rows

    monkeypatch.delenv("UPCYCLE_SWEEPS_HMAC_KEY", raising=False)
    for k, v in s3.reader_env(sweep.work).items():  # the sweep's HMAC key: its files are signed
        monkeypatch.setenv(k, v)
    return read_rows(f"{sweep.url}/e2e")


@pytest.mark.slow
@pytest.mark.distributed
def test_two_rank_checkpoint_shards_reach_the_bucket_and_restore_from_it(s3, sweep, monkeypatch):
    assert sweep.out.returncode == 0, sweep.out.stderr[-3000:]
    work, bucket = sweep.work, sweep.bucket
    rows = _rows(s3, sweep, monkeypatch)
    trials = sorted({r["trial_id"] for r in rows})
    assert len(trials) == 1
    for t in trials:
        assert sorted(r["step"] for r in rows if r["trial_id"] == t) == [0, 2, 4, 6]  # once
    assert {r["ranks"] for r in rows} == {2} and {r["status"] for r in rows} == {"ok"}

    # the restarted ranks went on at step 6: from the step-4 checkpoint
    assert [p.read_text() for p in (work / "staging").rglob(".resumed-*")] == ["6"]

    # the bucket holds each committed checkpoint whole: both ranks' files, rank 0's manifest
    # listing them all, every object signed
    fs = s3.filesystem()
    train = f"{bucket}/results/e2e/train"
    objs = _objects(fs, train)
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
    for trial in trials:
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


@pytest.mark.slow
@pytest.mark.distributed
def test_multi_rank_trials_with_expert_parallelism(s3, sweep, monkeypatch, tmp_path):
    """A trial on 2 gloo ranks: a Ray Train TorchTrainer inside a Tune trial,
    experts sharded across its ranks; every rank's shard lands in one checkpoint directory, and
    ``export: hf`` writes the whole model (its shards gathered), equal to the last
    checkpoint's shards joined in expert order. The trial's rank 0 raises once after its 3rd
    report (step 4, with a checkpoint): Ray Train restarts the worker group from that
    expert-parallel checkpoint (which failed to load before the Trainer joined its shards)
    and the curve is complete, no step twice. (Moved from test_sweep_e2e: the same sweep as
    the test above, read from the bucket.)"""
    assert sweep.out.returncode == 0, sweep.out.stderr[-3000:]
    rows = _rows(s3, sweep, monkeypatch)
    trials = {r["trial_id"] for r in rows}
    assert len(trials) == 1
    markers = sweep.work / "staging"
    assert len(list(markers.rglob(".failed-*"))) == 1
    assert sorted(p.read_text() for p in markers.rglob(".resumed-*")) == ["6"]
    for t in trials:
        assert sorted(r["step"] for r in rows if r["trial_id"] == t) == [0, 2, 4, 6]
    assert {r["ranks"] for r in rows} == {2} and {r["status"] for r in rows} == {"ok"}
    fs = s3.filesystem()
    root = f"{sweep.bucket}/results/e2e"
    objs = _objects(fs, f"{root}/train")
    metas = [k for k in objs if k.endswith("/meta.json") and "/checkpoint_" in k]
    for t in trials:
        # Ray Train's checkpoint of the last step: each rank's own files (written in its own
        # folder, rank_checkpoints/<t>/rank<r>) uploaded into one folder
        last = []
        for k in metas:
            if k.split("/", 1)[0].endswith(f"-{t}"):
                with fs.open_input_stream(f"{root}/train/{k}") as f:
                    if json.loads(f.read())["step"] == 6:
                        last.append(k.rsplit("/", 1)[0])
        (last,) = last
        files = {k.rsplit("/", 1)[1] for k in objs if k.rsplit("/", 1)[0] == last}
        assert {"model_rank0.safetensors", "model_rank1.safetensors", "meta.json"} <= files
        (staged,) = (sweep.work / "staging").rglob(f"rank_checkpoints/{t}")
        mine = {p.name for p in (staged / "rank1" / "step_00000006").iterdir()}
        assert "meta.json" not in mine and "model_rank0.safetensors" not in mine
        for src, dst in ((f"train/{last}", tmp_path / t / "ckpt"),
                         (f"export/{t}", tmp_path / t / "export")):
            dst.mkdir(parents=True)
            pafs.copy_files(f"{root}/{src}", str(dst), source_filesystem=fs)
        joined = load_checkpoint(tmp_path / t / "ckpt").full_model_state()
        _, exported = load_moe(tmp_path / t / "export")
        assert "blocks.0.mlp.w_gate" in exported  # the weights (buffers are not exported)
        for k, v in exported.items():
            assert torch.equal(v, joined[k].float()), (t, k)

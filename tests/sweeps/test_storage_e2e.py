"""A tiny sweep with ``results: s3://...`` against a real S3-protocol server (moto's, on
127.0.0.1, started and stopped by the test): everything lands in the bucket and nothing in a local
folder named after the URL; a trial restarted after an injected failure resumes from its
checkpoint read back (verified) from the bucket; ``--resume`` reads the sweep back; a tampered
state file is refused in one line; the analysis reads the results from the bucket; the fake
AWS secret appears in no written file. Then the path docs/cluster.md walks, every command on the
bucket's URL: ``analysis.report`` → ``analysis.best s3://… --export s3://…`` (and
``moe_core.hf export`` of the checkpoint URL) → transformers' AutoModelForCausalLM and
AutoTokenizer load the export and generate."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import yaml

from tests import s3_server
from tests.s3_server import FAKE_SECRET
from tests.sweeps.tiny import tiny_base

s3 = s3_server.s3  # the moto server fixture

SPEC = {
    "sweep": "s3e2e",
    "base": tiny_base(
        # real bytes and a tokenizer transformers loads: the export at the end is generated from
        data={"source": "stdlib", "tokenizer": "bytes", "seq_len": 32,
              "max_corpus_bytes": 100_000},
        parent={"tokens": 2048, "seed": 0},
        moe={"num_experts": 4, "top_k": 2, "router": {"order": "topk_softmax"}},
        upcycle={"method": "dense_to_moe"}),
    "logging": {"wandb": {"mode": "disabled"}},
    "failure": {"max_failures": 1},
    # a checkpoint at every other eval (steps 4 and 8): the failure after the 3rd report (step
    # 4) restarts the trial from the step-4 checkpoint, downloaded from the bucket
    "checkpoint": {"every_evals": 2, "every_minutes": None},
}


def _run(work: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sweeps.run", str(work / "spec.yaml"), *args],
                          env=env, cwd=work, capture_output=True, text=True, timeout=1500)


def _objects(fs: pafs.FileSystem, bucket: str) -> dict[str, int]:
    infos = fs.get_file_info(pafs.FileSelector(bucket, recursive=True))
    return {i.path[len(bucket) + 1:]: i.size for i in infos if i.type == pafs.FileType.File}


def _by_folder(objs: dict[str, int], prefix: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for k, v in objs.items():
        top = k[len(prefix):].split("/", 1)[0]
        out[top] = out.get(top, 0) + v
    return out


def _files_holding(root: Path, needle: bytes) -> list[str]:
    out = []
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink() and not p.is_socket():
            try:
                if needle in p.read_bytes():
                    out.append(str(p))
            except OSError:
                continue
    return out


@pytest.fixture
def work():
    # short: Ray's unix sockets live under RAY_TMPDIR (107-character limit)
    d = Path(tempfile.mkdtemp(prefix="s3e", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.distributed
def test_sweep_on_s3_writes_resumes_and_is_analysed_from_the_bucket(s3, work, monkeypatch,
                                                                     capsys):
    bucket = s3.bucket()
    url = f"s3://{bucket}/results"
    (work / "spec.yaml").write_text(yaml.safe_dump(dict(SPEC, results=url)))
    env = s3.sweep_env(work, UPCYCLE_SWEEPS_FAIL_ONCE_AFTER="3")

    out = _run(work, env, "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    fs = s3.filesystem()
    objs = _objects(fs, bucket)
    sweep = "results/s3e2e/"
    assert {sweep + "results.parquet", sweep + "summary.json"} <= set(objs)
    # Tune's state: immutable generations and signed manifests (sweeps.store.generations)
    pkls = sorted(k for k in objs if k.startswith(sweep + "tune/.state/g") and
                  k.endswith("/tuner.pkl"))
    assert pkls and pkls[0] + ".upcycle-hmac" in objs
    assert [k for k in objs if k.startswith(sweep + "tune/.state/manifest-")]
    assert sweep + "tune/tuner.pkl" not in objs  # nothing replaced in place
    assert [k for k in objs if k.startswith(sweep + "parents/") and k.endswith("/meta.json")]
    ckpts = [k for k in objs if "/checkpoint_" in k and k.endswith("model.safetensors")]
    assert ckpts, sorted(objs)
    assert not [k for k in objs if k.startswith(sweep + "rows/")]  # covered by the parquet
    # the restarted trial resumed from the step-4 checkpoint it read back from the bucket
    resumed = list((work / "staging").rglob(".resumed-*"))
    assert [p.read_text() for p in resumed] == ["6"]
    # nothing local named after the URL: no "s3:" folder, no folder named like the bucket
    local = [p for p in work.rglob("*") if "s3:" in p.parts or bucket in p.name]
    assert local == []
    assert not Path("s3:").exists()
    with capsys.disabled():  # the figure docs/storage.md reports
        print(f"\nbytes in the bucket after the sweep: {sum(objs.values())} in {len(objs)} "
              f"objects; by folder: {_by_folder(objs, sweep)}")

    from sweeps.store.results import read_rows

    monkeypatch.delenv("UPCYCLE_SWEEPS_HMAC_KEY", raising=False)
    for k, v in s3.reader_env(work).items():  # the sweep's HMAC key: its files are signed
        monkeypatch.setenv(k, v)
    rows = read_rows(f"{url}/s3e2e")
    assert sorted(r["step"] for r in rows) == [0, 2, 4, 6, 8]  # each row once
    assert {r["status"] for r in rows} == {"ok"}

    # --resume reads the Tune state back (verified) from the bucket: nothing rerun or doubled
    env.pop("UPCYCLE_SWEEPS_FAIL_ONCE_AFTER")
    again = _run(work, env, "--resume", "--json")
    assert again.returncode == 0, again.stderr[-3000:]
    assert sorted(r["step"] for r in read_rows(f"{url}/s3e2e")) == [0, 2, 4, 6, 8]

    # the analysis reads the bucket
    from analysis import compare
    from analysis.decide import load_decision_data
    from analysis.report import main as report_main
    from moe_core.errors import FitError

    assert report_main([f"{url}/s3e2e", "--out", str(work / "report"), "--bootstrap", "10"]) == 0
    assert "s3e2e" in (work / "report" / "report.md").read_text()
    assert compare.main([f"{url}/s3e2e", "--out", str(work / "cmp")]) == 0
    with pytest.raises(FitError, match="found 1 trials"):  # read, then too few for a decision
        load_decision_data(f"{url}/s3e2e")
    # the sweep's HMAC key (signed checkpoints are verified as they are downloaded)
    monkeypatch.setenv("UPCYCLE_SWEEPS_HMAC_KEY_FILE", env["UPCYCLE_SWEEPS_HMAC_KEY_FILE"])
    t0 = time.monotonic()
    _best_out_of_the_bucket(bucket, f"{url}/s3e2e", work, capsys)
    with capsys.disabled():
        print(f"analysis.best --export to the bucket, transformers' load and generate, "
              f"moe_core.hf export: {time.monotonic() - t0:.1f} s")

    # the fake secret is in no file the sweep wrote: bucket, staging, Ray's logs, the report
    for key in _objects(fs, bucket):
        with fs.open_input_stream(f"{bucket}/{key}") as f:
            assert FAKE_SECRET.encode() not in f.read(), key
    assert _files_holding(work, FAKE_SECRET.encode()) == []

    # a state file changed in the bucket by someone without the key: refused, in one line
    with fs.open_output_stream(f"{bucket}/{pkls[0]}") as f:
        f.write(b"\x80\x04K\x01.")  # pickle of 1: harmless, but not ours
    bad = _run(work, env, "--resume")
    assert bad.returncode == 2
    err = bad.stderr.strip().splitlines()
    assert len(err) == 1 and "refusing to load" in err[0] and "tuner.pkl" in err[0], err
    with capsys.disabled():
        objs = _objects(fs, bucket)
        print(f"at the end (after --resume and the export to s3://…/best): "
              f"{sum(objs.values())} bytes in {len(objs)} objects")


def _best_out_of_the_bucket(bucket: str, sweep_url: str, work: Path, capsys) -> None:
    """``analysis.best URL --export URL``, ``moe_core.hf export CKPT_URL DIR``; transformers loads
    and generates from the export fetched back from the bucket."""
    import json

    import torch
    import transformers

    from analysis.best import main as best_main
    from moe_core.hf.__main__ import main as hf_main
    from sweeps.store.storage import Location

    capsys.readouterr()
    assert best_main([sweep_url, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["checkpoint"].startswith(sweep_url + "/tune/") and info["checkpoint_step"] == 8
    out = f"s3://{bucket}/best"
    assert best_main([sweep_url, "--export", out]) == 0
    printed = capsys.readouterr().out
    assert f"to {out} with tokenizer: bytes" in printed and "transformers vs ours" in printed
    names = Location.of(out).files()
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(names), names
    assert best_main([sweep_url, "--export", out]) == 2  # not empty: refused without --overwrite
    assert "holds" in capsys.readouterr().err
    assert best_main([sweep_url, "--export", out, "--overwrite", "--no-verify"]) == 0
    local = Location.of(out).download_dir(work / "best")
    tok = transformers.AutoTokenizer.from_pretrained(str(local), local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(local), local_files_only=True,
                                                              dtype=torch.float32)
    ids = tok("import sys\n", return_tensors="pt").input_ids
    assert ids[0].tolist() == list(b"import sys\n")
    gen = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert gen.shape == (1, ids.shape[1] + 4)
    # the low-level exporter reads the same checkpoint straight from its URL
    assert hf_main(["export", info["checkpoint"], str(work / "hf"), "--no-verify"]) == 0
    assert (work / "hf" / "tokenizer.json").is_file()
    capsys.readouterr()


WSD_SPEC = {
    "sweep": "s3wsd",
    "base": {
        "model": {"preset": "debug"},
        "moe": {"num_experts": 4, "top_k": 2},
        "data": {"source": "synthetic", "synthetic_vocab": 32, "synthetic_tokens": 60000,
                 "seq_len": 32},
        "batch": {"global_batch": 8, "micro_batch": 8},
        "optim": {"lr": 3e-3},
        "schedule": {"kind": "wsd", "warmup_steps": 2, "decay_frac": 0.25},
        "eval": {"every_steps": 2, "batches": 2},
        "tokens": 2048,
    },
    "search": {"tokens": {"grid": [1024, 2048]}},  # two WSD branches of one stable run
    "export": "hf",
    "logging": {"wandb": {"enabled": False}},
}


@pytest.mark.slow
@pytest.mark.distributed
def test_wsd_stable_run_and_hf_exports_go_to_the_bucket(s3, work, monkeypatch):
    bucket = s3.bucket()
    (work / "spec.yaml").write_text(yaml.safe_dump(dict(WSD_SPEC,
                                                        results=f"s3://{bucket}/r")))
    env = s3.sweep_env(work)
    out = _run(work, env, "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    objs = _objects(s3.filesystem(), bucket)
    stable = [k for k in objs if k.startswith("r/s3wsd/stable/") and k.endswith("/stable.json")]
    assert len(stable) == 1  # the shared stable run, its manifest signed
    assert stable[0] + ".upcycle-hmac" in objs
    assert [k for k in objs if k.startswith(stable[0].rsplit("/", 1)[0] + "/")
            and k.endswith("model.safetensors")]
    exports = sorted(k for k in objs if k.startswith("r/s3wsd/export/")
                     and k.endswith("/config.json"))
    assert len(exports) == 2, sorted(objs)
    for e in exports:  # each export is whole: its weights are there beside its manifest
        assert [k for k in objs if k.startswith(e.rsplit("/", 1)[0] + "/")
                and k.endswith(".safetensors")]
    assert not [p for p in work.rglob("*") if "s3:" in p.parts or bucket in p.name]
    from sweeps.store.results import final_rows, read_rows

    monkeypatch.delenv("UPCYCLE_SWEEPS_HMAC_KEY", raising=False)
    for k, v in s3.reader_env(work).items():  # the sweep's HMAC key: its files are signed
        monkeypatch.setenv(k, v)
    finals = final_rows(read_rows(f"s3://{bucket}/r/s3wsd"))
    assert {r["status"] for r in finals} == {"ok"} and len(finals) == 2
    assert all(r["branch_from_step"] for r in finals)  # both decayed from the shared run

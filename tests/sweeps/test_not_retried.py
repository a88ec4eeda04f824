"""A deterministic configuration error inside a trial fails it once, in one line, no retries."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from moe_core.errors import ConfigError
from sweeps.run.not_retried import failed_row
from sweeps.spec.sweep import CheckpointSpec
from tests.sweeps.tiny import tiny_base


def test_failed_row_keeps_the_last_row_and_says_why():
    last = {"trial_id": "t", "step": 4, "val_loss": 2.0, "status": "running"}
    row = failed_row(last, lambda: {"never": 1}, ConfigError("data.path=x does not\nexist"))
    assert row["step"] == 4 and row["status"] == "failed" and row["val_loss"] is None
    assert row["reason"] == "not retried: ConfigError: data.path=x does not exist"
    row = failed_row(None, lambda: {"trial_id": "t"}, ConfigError("bad"))
    assert row["trial_id"] == "t" and row["step"] == 0


@pytest.mark.slow
@pytest.mark.distributed
def test_config_error_in_a_trial_is_not_retried(tmp_path):
    # a token folder preflight accepts (both files there) whose val.bin is shorter than one
    # sequence: every trial raises ConfigError at its first eval, however often it is retried
    d = tmp_path / "toks"
    d.mkdir()
    np.arange(4000, dtype=np.uint16).__mod__(32).astype(np.uint16).tofile(d / "train.bin")
    np.arange(10, dtype=np.uint16).tofile(d / "val.bin")
    spec = {"sweep": "cfgerr", "results": str(tmp_path / "r"),
            "base": tiny_base(data={"source": "tokens", "path": str(d), "seq_len": 32,
                                    "token_vocab_size": 32}),
            "search": {"optim.lr": {"grid": [1e-3]}}, "failure": {"max_failures": 3},
            "logging": {"wandb": {"enabled": False}}}
    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump(spec))
    env = dict(os.environ, UPCYCLE_CACHE=str(tmp_path / "cache"))
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-m", "sweeps.run", str(f), "--json"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    failed = [x for x in out.stderr.splitlines() if "failed: not retried" in x]
    assert len(failed) == 1 and "validation split has 10 tokens" in failed[0], out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["failed"] == 1 and summary["errors"] == 0 and summary["complete"]
    rows = pq.read_table(tmp_path / "r" / "cfgerr" / "results.parquet").to_pylist()
    assert {r["status"] for r in rows} == {"failed"}
    # Tune saw no exception at all: no error file, so nothing was retried
    assert not list((tmp_path / "r" / "cfgerr" / "tune").rglob("error.txt"))


def test_a_rank_of_a_multi_rank_trial_reports_the_failed_row_instead_of_raising(monkeypatch):
    """On a Ray Train worker a ConfigError is the trial's failed row, reported by every rank
    (Ray Train then ends normally, so neither it nor Tune retries); other errors still raise."""
    import ray.train

    from sweeps.run import trial as trainable

    sent = []
    monkeypatch.setattr(ray.train, "report", lambda row, **_: sent.append(row))

    def bad(run):
        raise ConfigError("data.path=/nope does not exist")

    def rank_run(static):  # the typed context every rank gets (no plan needed here)
        return {"run": trainable.RankRun(trial=None, static=static, checkpoint=CheckpointSpec())}

    monkeypatch.setattr(trainable, "_train_rank", bad)
    trainable._train_worker(rank_run({"trial_id": "t1", "sweep": "s"}))
    assert len(sent) == 1 and sent[0]["status"] == "failed" and sent[0]["trial_id"] == "t1"
    assert sent[0]["reason"] == "not retried: ConfigError: data.path=/nope does not exist"

    def lost(run):
        raise RuntimeError("node lost")

    monkeypatch.setattr(trainable, "_train_rank", lost)
    with pytest.raises(RuntimeError):
        trainable._train_worker(rank_run({"trial_id": "t1"}))

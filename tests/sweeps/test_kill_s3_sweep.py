"""Issue #43: kill -9 of a whole ``s3://`` sweep (the driver and its Ray processes at once) at
several instants, against the local S3 server (moto); every ``--resume`` starts, and no row the
bucket held before a kill is lost.

One chain: run, kill, resume, kill, resume, kill, resume to the end. The instants are spread
over the sweep (:data:`AFTER_FIRST_SAVE_S`, counted from each run's first save of Tune's state:
a new manifest, ``sweeps.store.generations``), so the kills land at different points of
training and of the save cycle (every 10 s). Per-write kills of those saves are covered one by
one, without processes, in tests/sweeps/test_generations.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import yaml

from tests import s3_server
from tests.sweeps.tiny import tiny_base

s3 = s3_server.s3

SPEC = {
    "sweep": "kill",
    "base": tiny_base(moe={"num_experts": 4, "top_k": 2}),
    "search": {"optim.lr": {"grid": [1e-3, 2e-3, 3e-3]}},
    "logging": {"wandb": {"mode": "disabled"}},
    "max_concurrent": 1,
}
AFTER_FIRST_SAVE_S = (1.0, 8.0, 15.0)
"""When each run is killed: seconds after its first save of Tune's state (which comes as Tune
starts). A trial of this spec trains for about 13 s here, so the kills land as the first trial
starts, in the middle of one, and near a trial's end and the save it forces; the three runs
train about 24 s of the sweep's 40, and the last --resume finishes it."""
KILLS = len(AFTER_FIRST_SAVE_S)


def _manifests(fs: pafs.FileSystem, prefix: str) -> list[str]:
    sel = pafs.FileSelector(f"{prefix}/tune/.state", allow_not_found=True)
    return sorted(i.path for i in fs.get_file_info(sel) if "/manifest-" in i.path
                  and not i.path.endswith(".upcycle-hmac"))


def _rows(url: str, env: dict) -> list[tuple[str, int]]:
    """(trial, step) of every row the bucket holds (read as the analysis reads it)."""
    code = ("import json, sys; from sweeps.store.results import read_rows; "
            "print(json.dumps([[r['trial_id'], r['step']] for r in read_rows(sys.argv[1])]))")
    out = subprocess.run([sys.executable, "-c", code, url], env=env, capture_output=True,
                         text=True, timeout=120)
    # a reader may refuse a half-written bucket in one line (rc 2), but never dies of a signal
    # (it did at exit, 1 in 8: tests/sweeps/test_storage.py::test_reading_a_bucket_exits_cleanly)
    assert out.returncode >= 0, out.stderr[-500:]
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("[")]
    return [(t, s) for t, s in yaml.safe_load(lines[-1])] if lines else []


@pytest.mark.slow
@pytest.mark.distributed
def test_kill_9_of_an_s3_sweep_at_several_instants_loses_no_row(s3):
    work = Path(tempfile.mkdtemp(prefix="s3k", dir="/tmp"))  # short: Ray's socket paths
    try:
        bucket = s3.bucket()
        url = f"s3://{bucket}/results"
        (work / "spec.yaml").write_text(yaml.safe_dump(dict(SPEC, results=url)))
        env = s3.sweep_env(work)
        fs, prefix = s3.filesystem(), f"{bucket}/results/kill"
        held: set[tuple[str, int]] = set()
        args: list[str] = []
        for i in range(KILLS):
            log = open(work / f"run{i}.log", "w")
            proc = subprocess.Popen([sys.executable, "-m", "sweeps.run",
                                     str(work / "spec.yaml"), *args], env=env, cwd=work,
                                    stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            before = len(_manifests(fs, prefix))
            deadline = time.monotonic() + 300
            while proc.poll() is None and time.monotonic() < deadline \
                    and len(_manifests(fs, prefix)) == before:
                time.sleep(0.05)
            time.sleep(AFTER_FIRST_SAVE_S[i])
            if proc.poll() is not None:  # a fast machine: the sweep finished before the kill
                assert proc.returncode == 0, (work / f"run{i}.log").read_text()[-3000:]
            else:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
            log.close()
            held |= set(_rows(f"{url}/kill", {**os.environ, **s3.reader_env(work)}))
            args = ["--resume"]
        out = subprocess.run([sys.executable, "-m", "sweeps.run", str(work / "spec.yaml"),
                              "--resume", "--json"], env=env, cwd=work, capture_output=True,
                             text=True, timeout=900)
        assert out.returncode == 0, out.stderr[-3000:]
        rows = _rows(f"{url}/kill", {**os.environ, **s3.reader_env(work)})
        assert held <= set(rows), held - set(rows)
        assert len({t for t, _ in rows}) == 3
        for t in {t for t, _ in rows}:
            assert sorted(s for tt, s in rows if tt == t) == [0, 2, 4, 6, 8]  # each once
    finally:
        shutil.rmtree(work, ignore_errors=True)

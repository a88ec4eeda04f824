"""``bench/gpu_session.sh``: its two calls fit the device's lease (plan, files back), it refuses
without DeepSpeed or Ray, its rehearsal runs every step on the CPU with a pack present that must
not shadow this Python's packages, and ``bench/merge_session.py`` merges a session's summary."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_session.sh"
CALLS = {"call1": {"check", "tier", "mfu_dense", "mfu_moe"},
         "call2": {"layer", "sweep", "experts"}}


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PY=sys.executable, OMP_NUM_THREADS="1", **extra)
    env.pop("RAY_ADDRESS", None)
    return env


def _foreign_pack(path: Path) -> Path:
    """A pack for another Python than this one (as the real, CPython-3.12 pack is on a 3.11
    machine): a compiled pydantic_core of that version and a Ray that breaks on import. Put on
    this Python's path, it would shadow the venv's and break every step."""
    minor = sys.version_info.minor + 1
    files = {f"pydantic_core/_pydantic_core.cpython-3{minor}-x86_64-linux-gnu.so": b"\0",
             "pydantic_core/__init__.py": b"raise ImportError('the pack shadowed pydantic_core')",
             "ray/__init__.py": b"raise ImportError('the pack shadowed ray')"}
    with tarfile.open(path, "w:xz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_the_plan_fits_the_lease():
    res = subprocess.run(["bash", str(SCRIPT), "--plan"], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    plan = json.loads(res.stdout)
    assert plan["planned_s"] <= 12 * 60  # two cold starts, two unpacks, every step's timeout
    assert all(t <= 600 for t in plan["run_timeout_s"].values())


def test_it_refuses_in_one_line_without_deepspeed(tmp_path):
    shadow = tmp_path / "shadow" / "deepspeed"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no DeepSpeed here')\n")
    env = _env(PYTHONPATH=f"{shadow.parent}:{ROOT}", GPU_PACK=str(tmp_path / "none.tar.xz"))
    res = subprocess.run(["bash", str(SCRIPT), "--out", str(tmp_path / "out"), "call1"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "deepspeed" in lines[0] and "bench/gpu_pack.sh" in lines[0]
    assert not list((tmp_path / "out").iterdir())  # no step ran


def _files_back(out: Path) -> list[Path]:
    """What the device tool brings back: at most 8 plain files, 2 folders deep, plain names."""
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8, files
    for p in files:
        rel = p.relative_to(out)
        assert len(rel.parts) <= 3 and all(re.fullmatch(r"[A-Za-z0-9._-]+", x) for x in rel.parts)
    return files


@pytest.mark.slow
def test_the_rehearsal_runs_both_calls_with_a_foreign_pack(tmp_path):
    """Each call as the device runs it (its own empty output folder), at a tiny size on the
    CPU. Not marked ``distributed``: one step runs a two-trial sweep on a Ray of its own."""
    env = _env(GPU_PACK=str(_foreign_pack(tmp_path / "pyext.tar.xz")))
    for call, steps in CALLS.items():
        out = tmp_path / call
        res = subprocess.run(["bash", str(SCRIPT), "--rehearse", "--out", str(out), call],
                             env=env, cwd=tmp_path, capture_output=True, text=True, timeout=1800)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert "unpacked, not on the path" in res.stdout
        files = {p.name for p in _files_back(out)}
        assert {f"summary-{call}.json", f"logs-{call}.tar.gz"} <= files
        summary = json.loads((out / f"summary-{call}.json").read_text())
        assert set(summary["steps"]) == steps
        bad = {k: v for k, v in summary["steps"].items() if v["exit"] != 0 or v["timed_out"]}
        if bad:
            with tarfile.open(out / f"logs-{call}.tar.gz") as tar:
                logs = {k: tar.extractfile(f"./{k}.log").read().decode()[-1500:] for k in bad}
            pytest.fail(f"{bad}: {logs}")
        if call == "call1":
            assert summary["check"]["ok"] and summary["device_name"] == "cpu"
            assert summary["steps"]["tier"]["tests"]["passed"] > 0
            modes = {(r["model"], r["bf16_mode"]) for r in summary["mfu"]}
            assert modes == {(m, b) for m in ("dense", "E8top2")
                             for b in ("deepspeed", "bf16_optimizer", "torch_autocast")}
        else:
            assert summary["layer"]["ours_vs_dense_active"] > 0
            assert summary["sweep"]["trials"] == summary["sweep"]["ok"] == 2
            experts = summary["experts"]  # Liger under the interpreter: equal maths, no record
            assert max(experts["check_rel_err"].values()) < 1e-5
            assert [r["choice"] for r in experts["per_shape"]] == ["grouped"]
            assert summary["kernel_choice"] == []


def _device_summary() -> dict:
    row = {"preset": "0.1B", "moe": True, "tokens_per_s": 100000.0, "peak_mem_gib": 30.0,
           "flops_per_token": {"6N": 1e9, "lm_head": 2e8, "attention": 1e8}}
    line = {"bench": "train_step", "device": "cuda", "seq": 1024, "micro": 32, "vocab": 32768,
            "rows": [{**row, "bf16_mode": "torch_autocast", "tokens_per_s": 150000.0},
                     {**row, "bf16_mode": "deepspeed", "tokens_per_s": 180000.0}]}
    entry = {"device": "H200", "device_name": "NVIDIA H200", "dtype": "bfloat16",
             "date": "2026-11-28", "E": 8, "K": 2, "d": 768, "f": 2048, "tokens": 16384,
             "grouped_s": 0.002, "liger_s": 0.001, "choice": "liger"}
    return {"date": "2026-11-28", "device_name": "NVIDIA H200", "train_step": [line],
            "kernel_choice": [entry]}


def test_merge_session_fills_both_tables(tmp_path, capsys):
    from bench.merge_session import main

    table, kernels = tmp_path / "throughput.json", tmp_path / "kernel_choice.json"
    table.write_text(json.dumps({"about": "x", "entries": []}))
    s = tmp_path / "summary-call1.json"
    s.write_text(json.dumps(_device_summary()))
    assert main([str(s), "--table", str(table), "--kernel-table", str(kernels)]) == 0
    (e,) = json.loads(table.read_text())["entries"]
    assert (e["device"], e["preset"], e["moe"]) == ("h200", "0.1B", "E8top2")
    # the mode optim.bf16_mode: auto trains with at ZeRO 0 (torch_autocast since #42), not
    # merely the fastest
    from moe_core.train.engine import DEFAULT_BF16_MODE

    assert DEFAULT_BF16_MODE[0] == "torch_autocast"
    assert e["tokens_per_s"] == 150000.0 and e["options"]["bf16_mode"] == "torch_autocast"
    assert e["measured"]["where"] == "measured on NVIDIA H200 at 2026-11-28"
    (k,) = json.loads(kernels.read_text())["entries"]
    assert k["choice"] == "liger"
    cpu = tmp_path / "summary-rehearsal.json"
    cpu.write_text(json.dumps({**_device_summary(), "device_name": "cpu"}))
    assert main([str(cpu), "--table", str(table), "--kernel-table", str(kernels)]) == 2
    assert "rehearsal" in capsys.readouterr().err

"""sweeps.plan.cost: the --dry-run cost forecast and bench/update_throughput.py, against hand
sums."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from moe_core.presets import model_config
from sweeps.plan import cost
from sweeps.run.cli import main
from tests.sweeps.tiny import tiny_base

SAMPLE = Path(__file__).parents[1] / "bench" / "data" / "throughput_sample.jsonl"


def test_makespan_longest_first_by_hand():
    # 2 slots: 3 | 3, then 2 → 5 | 3, 2 → 5 | 5, 2 → 7 | 5
    assert cost.makespan([2, 3, 2, 3, 2], 2) == 7
    assert cost.makespan([4, 1], 8) == 4 and cost.makespan([], 3) == 0


def test_flops_per_token_matches_bench_train_step():
    m = model_config("debug", vocab_size=512, max_seq_len=128)
    # 6·N_active + 6·V·d + 12·L·d·S: the debug model's 131,392 active non-embedding params
    assert cost.flops_per_token(m, 128) == 6 * 131_392 + 6 * 512 * 64 + 12 * 2 * 64 * 128
    measured = {(e["preset"], e["moe"]): e for e in cost.load_table() if e["device"] == "cpu"}
    assert measured[("debug", "dense")]["flops_per_token"] == cost.flops_per_token(m, 128)


def test_rate_measured_scaled_assumed():
    table = [{"device": "h100", "preset": "0.1B", "moe": "dense", "tokens_per_s": 1e5,
              "flops_per_token": 1e9, "measured": {"where": "X", "when": "t"}},
             {"device": "h100", "preset": "1B", "moe": "dense", "tokens_per_s": None,
              "measured": None}]
    r = cost.rate(table, "h100", "0.1B", "dense", 5e8)
    assert (r.tokens_per_s, r.source) == (1e5, "measured") and "X" in r.note
    r = cost.rate(table, "h100", "1B", "dense", 4e9)  # the placeholder is not a measurement
    assert r.source == "scaled" and r.tokens_per_s == pytest.approx(1e14 / 4e9)
    r = cost.rate(table, "a100", "1B", "dense", 4e9)
    assert r.source == "assumed" and r.tokens_per_s == pytest.approx(0.35 * 312e12 / 4e9)
    with pytest.raises(Exception, match="--gpu tpu"):
        cost.rate(table, "tpu", "1B", "dense", 4e9)


def test_forecast_by_hand():
    m = model_config("debug", vocab_size=512, max_seq_len=128)
    fpt = cost.flops_per_token(m, 128)
    jobs = [cost.Job("trial", 10**6, m, "debug", 128, 2.0)] * 3 + \
        [cost.Job("parent", 2 * 10**6, m, "debug", 128, 2.0)]
    f = cost.forecast(jobs, "h100", concurrency=2, parents_parallel=1, price=2.5, table=[])
    tps = 0.35 * 989e12 / fpt  # per GPU; a 2-GPU job twice that
    t_trial, t_parent = 1e6 / (2 * tps), 2e6 / (2 * tps)
    assert f.gpu_hours == pytest.approx((3 * t_trial + t_parent) * 2 / 3600)
    assert f.wall_h == pytest.approx((t_parent + 2 * t_trial) / 3600)
    assert f.cost == pytest.approx(f.gpu_hours * 2.5) and f.sources == {"assumed": 4}


def test_sustained_tflops_for_decide():
    v, src = cost.sustained_tflops("h100", table=[])
    assert v == pytest.approx(0.35 * 989) and src.startswith("assumed: 35% MFU")
    t = [{"device": "h100", "preset": "p", "moe": "dense", "tokens_per_s": 2e5,
          "flops_per_token": 2e9, "measured": {"where": "lab", "when": "t"}}]
    assert cost.sustained_tflops("h100", table=t) == (400.0, "measured: p dense on lab")


def test_update_throughput_from_gpu_session_json(tmp_path, capsys):
    from bench.update_throughput import main as update

    table = tmp_path / "throughput.json"
    shutil.copy(cost.TABLE, table)
    before = cost.load_table(table)
    assert update([str(SAMPLE), "--where", "test box", "--device", "h100", "--when", "today",
                   "--table", str(table)]) == 0
    assert "2 measured entries written, 1 objects of other benches skipped" in \
        capsys.readouterr().out
    after = {(e["device"], e["preset"], e["moe"]): e for e in cost.load_table(table)}
    assert len(after) == len({(e["device"], e["preset"], e["moe"]) for e in before} |
                             {("h100", "0.1B", "E8top2"), ("h100", "0.1B", "dense")})
    moe = after[("h100", "0.1B", "E8top2")]
    assert moe["tokens_per_s"] == 91000.0 and moe["peak_mem_gb"] == 31.2
    assert moe["measured"] == {"where": "sample: not a real measurement", "when": "2000-01-01"}
    dense = after[("h100", "0.1B", "dense")]  # train_step's own line: its FLOPs summed
    assert dense["flops_per_token"] == 438000000 + 2 * 125829120
    assert dense["measured"] == {"where": "test box", "when": "today"}
    assert after[("cpu", "debug", "dense")] == next(
        e for e in before if (e["device"], e["preset"], e["moe"]) == ("cpu", "debug", "dense"))
    # the forecast now uses it
    r = cost.rate(cost.load_table(table), "h100", "0.1B", "dense", 1e9)
    assert r.source == "measured" and r.tokens_per_s == 150000.0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"device": "h100", "preset": "x", "moe": "dense",
                               "tokens_per_s": -1}))
    assert update([str(bad), "--where", "w", "--table", str(table)]) == 2
    assert "tokens_per_s=-1 must be a number > 0" in capsys.readouterr().err


def test_dry_run_prints_gpu_hours_cost_and_sources(tmp_path, capsys):
    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump({"sweep": "c", "results": str(tmp_path / "r"),
                                 "base": tiny_base(), "max_concurrent": 2,
                                 "search": {"optim.lr": {"grid": [1e-3, 3e-3, 1e-2]}},
                                 "logging": {"wandb": {"enabled": False}}}))
    assert main([str(f), "--dry-run", "--gpu", "h100", "--price", "2.5"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("cost forecast (h100)"))
    assert "H100 GPU-hours" in line and "at 2 concurrent trials" in line and "$" in line
    assert "assumed 35% MFU of the NVIDIA H100 SXM's 989 TFLOP/s" in out
    assert main([str(f), "--dry-run"]) == 0  # CPU trials: the measured CPU entry
    out = capsys.readouterr().out
    assert "cost forecast (cpu)" in out and "debug dense: measured on" in out

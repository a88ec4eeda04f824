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
    # 2 trials of 2 GPUs reserve 4 GPUs for the whole wall; the parent trains on 2 of them
    assert f.reserved_gpus == 4 and f.pre_wall_h == pytest.approx(t_parent / 3600)
    used = (3 * t_trial + t_parent) * 2
    assert f.idle_share == pytest.approx(1 - used / (4 * (t_parent + 2 * t_trial)))
    # t_parent = 2·t_trial: 1 - (3 + 2)·2 / (4 · 4) = 37.5 %, 2 GPUs idle while the parent
    # trains and 2 in the last wave
    assert f.idle_share == pytest.approx(0.375) and "idle: 37.5% of the" in f.lines()[1]


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
    assert "assumed (35 % MFU of the NVIDIA H100 SXM's 989 TFLOP/s" in out
    assert main([str(f), "--dry-run"]) == 0  # CPU trials: the measured CPU entry
    out = capsys.readouterr().out
    assert "cost forecast (cpu)" in out and "debug dense: measured on" in out


def _multirank_spec(tmp_path, **over):
    from sweeps.plan.build import build_plan
    from sweeps.spec.sweep import load_spec

    base = tiny_base(batch={"global_batch": 8, "micro_batch": 1},
                     parent={"tokens": 4096, "seed": 0},
                     moe={"num_experts": 4, "top_k": 2}, upcycle={"method": "dense_to_moe"})
    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump({"sweep": "mr", "results": str(tmp_path / "r"), "base": base,
                                 "resources": {"gpus": 1, "ranks": 8},
                                 "search": {"optim.lr": {"grid": [1e-3, 3e-3, 1e-2]}},
                                 "logging": {"wandb": {"enabled": False}}, **over}))
    spec = load_spec(str(f))
    return spec, build_plan(spec)


def test_multirank_trials_and_their_parent_by_hand(tmp_path):
    """8-rank trials hold 8 GPUs each; the parent trains as one task on one GPU: its wall time
    is its GPU time (it was 1/8 of it: the parent counted at the trial's 8 GPUs)."""
    spec, plan = _multirank_spec(tmp_path)
    jobs = cost.jobs_from_plan(spec, plan, "h100")
    # one parent per learning rate (the parent trains with the searched optimizer)
    assert sorted((j.kind, j.accelerators) for j in jobs) == [("parent", 1.0)] * 3 + [
        ("trial", 8.0)] * 3
    f = cost.forecast(jobs, "h100", concurrency=3, parents_parallel=3, table=[])
    trial = next(j for j in jobs if j.kind == "trial")
    parent = next(j for j in jobs if j.kind == "parent")
    tps_t = 0.35 * 989e12 / cost.flops_per_token(trial.cfg, 32)  # per GPU, assumed
    tps_p = 0.35 * 989e12 / cost.flops_per_token(parent.cfg, 32)
    # by hand: the 3 parents at once (4,096 tokens each on 1 GPU), then the 3 trials at once
    # (2,048 tokens each on 8 GPUs)
    assert f.wall_h * 3600 == pytest.approx(4096 / tps_p + 2048 / (8 * tps_t))
    assert f.gpu_hours * 3600 == pytest.approx(3 * 4096 / tps_p + 3 * 2048 / tps_t)


def test_forecast_runs_no_more_multirank_trials_than_the_cluster_holds(tmp_path, capsys):
    from sweeps.run.console import print_forecast

    spec, plan = _multirank_spec(tmp_path)
    print_forecast(spec, plan, gpu="h100", cluster_gpus=16)  # two 8-GPU trials at once
    out = capsys.readouterr().out
    assert "at 2 concurrent trials (16 GPUs in the cluster / 8 per trial)" in out
    print_forecast(spec, plan, gpu="h100")  # no cluster known: every trial at once
    assert "at 3 concurrent trials" in capsys.readouterr().out


def test_a_measured_entry_replaces_the_assumed_one_without_code_changes(tmp_path):
    m = model_config("debug", vocab_size=512, max_seq_len=128)
    fpt = cost.flops_per_token(m, 128)
    entry = {"device": "h100", "preset": "debug", "moe": "dense", "tokens_per_s": None,
             "measured": None}
    table = tmp_path / "throughput.json"
    table.write_text(json.dumps({"entries": [entry]}))
    job = [cost.Job("trial", 10**9, m, "debug", 128, 1.0)]
    f = cost.forecast(job, "h100", concurrency=1, parents_parallel=1,
                      table=cost.load_table(table))
    assert f.notes == ("debug dense: assumed (35 % MFU of the NVIDIA H100 SXM's 989 TFLOP/s "
                       "bf16 peak)",)
    assert f.wall_h * 3600 == pytest.approx(1e9 / (0.35 * 989e12 / fpt))
    # what bench/update_throughput.py writes after a GPU session: the same entry, measured
    entry.update(tokens_per_s=2.5e6, flops_per_token=fpt,
                 measured={"where": "NVIDIA H100 80GB HBM3", "when": "2026-11-28"})
    table.write_text(json.dumps({"entries": [entry]}))
    f = cost.forecast(job, "h100", concurrency=1, parents_parallel=1,
                      table=cost.load_table(table))
    assert f.notes == ("debug dense: measured on NVIDIA H100 80GB HBM3 at 2026-11-28",)
    assert f.wall_h * 3600 == pytest.approx(400.0)  # 1e9 tokens / 2.5e6 tokens/s
    assert f.sources == {"measured": 1}

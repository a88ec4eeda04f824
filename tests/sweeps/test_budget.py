"""The enforced budget (``sweeps.spec.budget``, ``sweeps.run.budget``): the spec block and its
flags, the ledger's accounting, and a tiny sweep of simulated cost that warns at 80 %, stops at
100 % keeping every row (status ``budget``) and continues on ``--resume`` with a raised limit."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from moe_core.errors import SearchSpaceError
from sweeps.run import budget
from sweeps.spec.budget import BudgetConfig, with_flags
from sweeps.spec.sweep import parse_spec
from sweeps.store.sink import ResultsSink
from sweeps.store.trial_outcomes import reconcile
from sweeps.testing.faults import COST_ENV, CostedReport
from tests.sweeps.tiny import tiny_base


def _spec(b):
    return parse_spec({"sweep": "b", "base": tiny_base(), "budget": b})


def test_spec_block_and_flags_one_line_errors_naming_the_key():
    assert _spec({"gpu_hours": 2, "wall_hours": 1.5}).budget.limits == {"gpu_hours": 2,
                                                                        "wall_hours": 1.5}
    assert _spec(None).budget is None
    for bad, key in [({"gpu_hours": 0}, "budget.gpu_hours"), ({"usd": -1}, "budget.usd"),
                     ({"wall_hours": float("nan")}, "budget.wall_hours"),
                     ({"gpu_hours": "lots"}, "budget.gpu_hours"), ({"hours": 1}, "budget.hours")]:
        with pytest.raises(SearchSpaceError, match=key.replace(".", r"\.")) as e:
            _spec(bad)
        assert "\n" not in str(e.value)
    with pytest.raises(SearchSpaceError, match=r"budget\.usd=5 needs a price .*--price"):
        with_flags(_spec({"usd": 5}).budget, {})
    assert with_flags(_spec({"usd": 5}).budget, {}, price=2.5).price == 2.5  # --price supplies it
    assert with_flags(None, {"gpu_hours": 3.0}).limits == {"gpu_hours": 3.0}
    with pytest.raises(SearchSpaceError, match="--budget-wall-hours"):
        with_flags(None, {"wall_hours": 0.0})
    with pytest.raises(SearchSpaceError, match="--budget-usd=9 needs a price"):
        with_flags(None, {"usd": 9.0})


def test_ledger_counts_devices_warns_once_at_80_and_stops_once_at_100():
    led = budget.Ledger(BudgetConfig(gpu_hours=10, usd=50, price=4.0),
                        devices=budget.trial_devices(ranks=2, gpus=4), started=0.0)
    assert budget.trial_devices(4, 0) == 1.0  # a CPU trial counts its hours
    led.charge(3600 * 0.5)  # half an hour on 8 GPUs = 4 GPU-h = $16
    assert led.spent(now=0.0)["gpu_hours"] == pytest.approx(4.0)
    assert led.check(now=0.0) is None and led.status(now=0.0) == "within"
    led.charge(3600 * 0.5)  # 8 GPU-h = $32: usd at 64 %, gpu_hours at 80 %
    assert led.fraction(now=0.0) == (pytest.approx(0.8), "gpu_hours")
    assert led.check(now=0.0) == "warn" and led.check(now=0.0) is None  # once
    led.charge(1800, devices=1)  # a parent's half hour on one GPU: 8.5 GPU-h
    led.charge(3600 * 0.25)  # 10.5 GPU-h, $42
    assert led.check(now=0.0) == "stop" and led.check(now=0.0) is None
    rec = led.record(now=0.0)
    assert rec["status"] == "spent" and rec["stopped_by"] == "gpu_hours"
    assert rec["spent"]["gpu_hours"] == pytest.approx(10.5) and rec["spent"]["usd"] == 42.0
    assert "--budget-gpu-hours" in led.line("stop", now=0.0)


def test_wall_hours_and_what_a_resume_carries_over():
    summary = json.dumps({"budget": {"spent": {"gpu_hours": 1.25, "wall_hours": 0.5}}})
    carried = budget.carried_over(summary)
    assert carried == {"gpu_hours": 1.25, "wall_hours": 0.5}
    assert budget.carried_over(None) == {} and budget.carried_over("{broken") == {}
    led = budget.Ledger(BudgetConfig(wall_hours=1.0), carried=carried, started=0.0)
    assert led.check(now=1500.0) == "warn"  # 0.5 + 0.42 h = 92 %
    assert led.check(now=1800.0) == "stop"  # 0.5 + 0.5 h: the wall limit
    with pytest.raises(SearchSpaceError, match=r"budget\.gpu_hours=1 is already spent .*"
                                               r"--budget-gpu-hours"):
        budget.refuse_spent(budget.Ledger(BudgetConfig(gpu_hours=1.0), carried=carried))
    budget.refuse_spent(budget.Ledger(BudgetConfig(gpu_hours=2.0), carried=carried))


def test_cut_trials_get_status_budget_finished_ones_stay_ok(tmp_path):
    class T:
        def __init__(self, tid):
            self.trial_id, self.status = tid, "TERMINATED"

    sink = ResultsSink(tmp_path, flush_s=0)
    for tid, status in (("a", "ok"), ("b", "running")):
        sink.add({"trial_id": tid, "step": 0, "status": status, "val_loss": 1.0})
    reconcile(sink, [T("a"), T("b")], None, budget="gpu_hours")
    assert sink.rows_of("a")[0]["status"] == "ok"
    assert sink.rows_of("b")[0]["status"] == "budget"
    reconcile(sink, [T("b")])  # the resumed run finished it
    assert sink.rows_of("b")[0]["status"] == "ok"
    sink.close()


def test_costed_report_claims_its_seconds():
    seen = []
    CostedReport(360.0, lambda m, checkpoint=None: seen.append(m))({"step": 2})
    assert seen == [{"step": 2, "time_this_iter_s": 360.0}]


def _run(f, env, *extra):
    return subprocess.run([sys.executable, "-m", "sweeps.run", str(f), "--json", *extra],
                          env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.distributed
def test_budget_warns_stops_keeps_rows_and_resume_continues(tmp_path):
    """Two CPU trials, one at a time, whose every report (steps 0, 2, 4, 6, 8) claims 0.1 h:
    0.5 trial-hours each. budget.gpu_hours 0.75 warns at the 6th report (80 %) and stops at the
    8th (107 %), mid-way through the second trial; --resume --budget-gpu-hours 2 finishes it."""
    ray_tmp = Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))
    spec = {"sweep": "bud", "base": tiny_base(), "max_concurrent": 1,
            "search": {"optim.lr": {"grid": [1e-3, 3e-3]}}, "checkpoint": {"every_evals": 1},
            "logging": {"wandb": {"enabled": False}}, "budget": {"gpu_hours": 0.75},
            "results": str(tmp_path / "results")}
    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump(spec))
    env = dict(os.environ, UPCYCLE_CACHE=str(tmp_path / "cache"), RAY_TMPDIR=str(ray_tmp),
               **{COST_ENV: "360"})
    env.pop("RAY_ADDRESS", None)
    res = tmp_path / "results" / "bud"
    try:
        out = _run(f, env)
        assert out.returncode == 3, out.stdout[-2000:] + out.stderr[-3000:]
        assert out.stderr.count("the sweep stops at 100 %") == 1  # warned once
        assert "budget.gpu_hours: 0.6" in out.stderr and "(80%)" in out.stderr
        assert "stopping the sweep" in out.stderr
        first = json.loads((res / "summary.json").read_text())
        b = first["budget"]
        assert b["status"] == "spent" and b["stopped_by"] == "gpu_hours"
        assert 0.75 <= b["spent"]["gpu_hours"] < 1.0  # the 8th report (and any in flight)
        rows = pq.read_table(res / "results.parquet").to_pylist()
        status = {r["trial_id"]: r["status"] for r in rows}
        assert sorted(status.values()) == ["budget", "ok"] and first["budget_stopped"] == 1
        cut = next(t for t, s in status.items() if s == "budget")
        kept = sorted(r["step"] for r in rows if r["trial_id"] == cut)
        assert kept[:3] == [0, 2, 4] and not first["complete"]
        out = _run(f, env, "--resume")  # the same limit: refused before Ray starts
        assert out.returncode == 2 and "already spent" in out.stderr, out.stderr[-2000:]
        out = _run(f, env, "--resume", "--budget-gpu-hours", "2")
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
        final = json.loads((res / "summary.json").read_text())
        rows = pq.read_table(res / "results.parquet").to_pylist()
        assert {r["status"] for r in rows} == {"ok"} and final["complete"]
        assert sorted(r["step"] for r in rows if r["trial_id"] == cut) == [0, 2, 4, 6, 8]
        assert final["budget"]["status"] == "within"
        assert final["budget"]["spent"]["gpu_hours"] >= b["spent"]["gpu_hours"] + 0.2
        print(f"budget figures: warned at 80 %, stopped at "
              f"{b['fraction']:.0%} ({b['spent']['gpu_hours']:.3f} of 0.75 GPU-h), "
              f"{len(kept)} rows of the cut trial kept, resumed to "
              f"{final['budget']['spent']['gpu_hours']:.3f} GPU-h")
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)

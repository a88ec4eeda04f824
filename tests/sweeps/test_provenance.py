"""Every result says where it came from: one record (``sweeps.store.provenance``) of the code,
library versions and the device, in summary.json, the Parquet's schema metadata and each W&B
run's config, printed by analysis.report. (A real sweep's: tests/sweeps/test_sweep_e2e.py.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from types import SimpleNamespace

from analysis.sections import provenance_section
from sweeps.store import provenance as pv
from sweeps.store.results import (
    RESULTS_FILE,
    read_provenance,
    read_table,
    rows_table,
    write_table,
)
from sweeps.store.sink import ResultsSink


def test_the_record_has_its_keys_and_says_this_checkout():
    rec = pv.provenance()
    assert tuple(rec) == pv.KEYS
    assert set(rec["packages"]) == set(pv.PACKAGES) == {"torch", "deepspeed", "ray",
                                                        "transformers", "pyarrow"}
    assert all(isinstance(v, str) for v in rec["packages"].values())  # all installed here
    assert re.fullmatch(r"\d+\.\d+\.\d+", rec["python"])
    code = rec["code"]
    head = subprocess.run(["git", "-C", str(pv.ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    assert code["commit"] == head and isinstance(code["dirty"], bool)
    dev = rec["device"]
    assert set(dev) == {"cpu", "cpus", "gpu", "gpus"} and dev["cpu"] and dev["cpus"] >= 1
    assert (dev["gpu"] is None) == (dev["gpus"] == 0)
    json.dumps(rec)  # JSON as it is, for summary.json, the Parquet and W&B


def test_building_it_imports_neither_torch_nor_ray():
    code = ("import sys, sweeps.store.provenance as p; p.provenance(); "
            "print('torch' in sys.modules, 'ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.split() == ["False", "False"], out.stderr[-2000:]


def test_the_parquet_round_trip(tmp_path):
    sink = ResultsSink(tmp_path, flush_s=1e9)
    sink.add({"sweep": "s", "trial_id": "a", "step": 0, "val_loss": 3.0, "status": "ok"})
    sink.close()
    assert read_provenance(tmp_path) == pv.provenance()
    assert read_provenance(tmp_path / RESULTS_FILE) == pv.provenance()
    assert read_table(tmp_path).num_rows == 1  # the schema version is still read
    # a table written without one (before this record) has none; a CSV neither
    write_table(tmp_path / "old" / RESULTS_FILE, rows_table([{"trial_id": "a", "step": 0}]))
    assert read_provenance(tmp_path / "old") is None
    (tmp_path / "r.csv").write_text("a\n1\n")
    assert read_provenance(tmp_path / "r.csv") is None


def test_the_report_prints_it(tmp_path):
    rec = pv.provenance()
    sink = ResultsSink(tmp_path, flush_s=1e9)
    sink.add({"sweep": "s", "trial_id": "a", "step": 0, "val_loss": 3.0, "status": "ok"})
    sink.close()
    for s in (SimpleNamespace(summary={"provenance": rec}, path=tmp_path / "elsewhere"),
              SimpleNamespace(summary=None, path=tmp_path)):  # summary.json's, else Parquet's
        sec = provenance_section(s)
        assert sec.lines[0] == "## Provenance" and sec.data == rec
        line = sec.lines[2]
        assert rec["code"]["commit"][:12] in line and f"torch {rec['packages']['torch']}" in line
        assert rec["device"]["cpu"] in line
    none = provenance_section(SimpleNamespace(summary=None, path=tmp_path / "nothing"))
    assert none.lines[2].startswith("not recorded")


def test_differences_name_what_changed():
    rec = {"code": {"commit": "a" * 40, "dirty": False, "version": "0.1.0"}, "python": "3.11.14",
           "packages": {"torch": "2.13.0", "ray": "2.60.0"},
           "device": {"cpu": "AMD EPYC", "cpus": 2, "gpu": None, "gpus": 0}}
    assert pv.differences(rec, rec) == []
    other = json.loads(json.dumps(rec))
    other["packages"]["torch"] = "2.12.0"
    other["device"].update(cpu="Intel Xeon", cpus=16)
    assert pv.differences(rec, other) == ["torch 2.13.0 → 2.12.0", "device cpu AMD EPYC → "
                                          "Intel Xeon", "device cpus 2 → 16"]
    other = json.loads(json.dumps(rec))
    other["code"]["dirty"] = True
    assert pv.differences(rec, other) == ["code: a dirty tree (uncommitted changes) on this side"]
    assert pv.differences(None, rec) == ["no provenance recorded"]


def test_each_wandb_run_config_holds_it(monkeypatch):
    from ray.air.integrations.wandb import WandbLoggerCallback

    from sweeps.run.wandb_logging import ProvenanceWandbLogger

    seen = {}
    monkeypatch.setattr(WandbLoggerCallback, "_start_logging_actor",
                        lambda self, trial, exclude, **kw: seen.update(kw))
    cb = ProvenanceWandbLogger(project="p", mode="disabled")
    trial = SimpleNamespace(config={"optim.lr": 3e-3}, trial_id="t1", experiment_dir_name="x")
    cb.log_trial_start(trial)
    # nested by YAML path, as W&B addresses config keys (sweeps.store.wandb_keys)
    assert seen["config"] == {"optim": {"lr": 3e-3}, "provenance": pv.provenance()}
    assert trial.config == {"optim.lr": 3e-3}  # the trial's own config untouched

"""``upcycle-sweeps wandb-workspace`` (analysis.wandb_workspace): the W&B workspace of two small
sweeps' results (the HTML page's rows: three knobs, two MoE layers), validated offline. Its
definition, written next to the results, names every knob and every metric column under the
keys the logger gives them (sweeps.store.wandb_keys), and is not saved without a W&B key.
(On S3 results: tests/sweeps/test_storage.py.)"""

from __future__ import annotations

import json

from analysis.wandb_workspace import DEFINITION_FILE, main
from sweeps.store.results import RESULTS_FILE, write_rows
from tests.analysis.test_html_page import _rows

KNOBS = ("seed", "optim.lr", "moe.router.aux_coef")
METRICS = {  # every metric column of _rows, as W&B's key
    "val_loss", "tokens", "health/all/max_load", "health/worst/max_load",
    "health/layer1/max_load", "health/layer3/max_load", "health/layer1/max_vio",
    "health/layer3/max_vio", "health/layer1/drop_rate", "health/layer3/drop_rate"}


def _panels(defn: dict) -> dict[str, list[dict]]:
    sections = defn["spec"]["section"]["panelBankConfig"]["sections"]
    return {s["name"]: s["panels"] for s in sections}


def _named(panel: dict) -> set[str]:
    c = panel["config"]
    return {*c.get("metrics", ()), *(col["accessor"] for col in c.get("columns", ()))}


def test_the_definition_names_every_knob_and_metric(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_ENTITY", raising=False)
    for name, offset in (("demo", 0.0), ("other", 0.1)):
        write_rows(tmp_path / name / RESULTS_FILE, _rows(name, offset))
    assert main([str(tmp_path / "demo"), str(tmp_path / "other")]) == 0
    out = tmp_path / "demo" / DEFINITION_FILE
    assert capsys.readouterr().out.strip() == (
        f"workspace definition written to {out} (not saved: no WANDB_API_KEY; set it and rerun "
        "to save it to W&B)")
    defn = json.loads(out.read_text())
    assert (defn["entity"], defn["project"], defn["display_name"]) == (
        "", "upcycle-sweeps", "sweep demo vs other")
    panels = _panels(defn)
    assert list(panels) == ["knobs → metric", "loss curves", "per-layer health", "metrics"]
    # parallel coordinates: every knob (the run config's nested knob.<path>) → the final metric
    (par,) = [p for p in panels["knobs → metric"] if p["viewType"] == "Parallel Coordinates Plot"]
    assert _named(par) == {f"config:knob.value.{k}" for k in KNOBS} | {"summary:val_loss"}
    per_knob = {p["config"]["chartTitle"]: p for p in panels["knobs → metric"]
                if p["viewType"] in ("Scatter Plot", "Bar Chart")}
    assert set(per_knob) == {f"final val_loss by {k}" for k in KNOBS}
    assert per_knob["final val_loss by optim.lr"]["config"]["xAxis"] == "config:knob.value.optim.lr"
    assert any(p["viewType"] == "Parameter Importance" and p["config"]["targetKey"] == "val_loss"
               for p in panels["knobs → metric"])
    # every metric column is a curve against the step; the losses also grouped by sweep
    curves = [p for ps in panels.values() for p in ps if p["viewType"] == "Run History Line Plot"]
    assert set().union(*map(_named, curves)) == METRICS
    assert {p["config"]["xAxis"] for p in curves} == {"step"}
    assert [p["config"].get("groupBy") for p in panels["loss curves"]] == [None, "group"]
    health = {p["config"]["chartTitle"]: p["config"]["metrics"] for p in panels["per-layer health"]}
    assert health["max_load per layer"] == ["health/layer1/max_load", "health/layer3/max_load",
                                            "health/worst/max_load", "health/all/max_load"]
    assert set(health) == {"max_load per layer", "max_vio per layer", "drop_rate per layer"}
    # the runs shown: the two sweeps' W&B groups
    (runset,) = defn["spec"]["section"]["runSets"]
    assert runset["filters"]["filters"] == [{"key": {"section": "run", "name": "group"},
                                             "op": "IN", "value": ["demo", "other"],
                                             "disabled": False}]


def test_it_overwrites_only_its_own_definition(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    write_rows(tmp_path / "demo" / RESULTS_FILE, _rows("demo"))
    parquet = (tmp_path / "demo" / RESULTS_FILE).read_bytes()
    assert main([str(tmp_path / "demo"), "--out", str(tmp_path / "demo" / RESULTS_FILE)]) == 2
    assert "is not a workspace definition" in capsys.readouterr().err
    assert (tmp_path / "demo" / RESULTS_FILE).read_bytes() == parquet
    assert main([str(tmp_path / "demo")]) == 0
    assert main([str(tmp_path / "demo")]) == 0  # its own definition, rewritten

"""Parquet results: schema, atomic writes, mixed types, final rows, config flattening."""

import json
import math

import pandas as pd
import pyarrow.dataset as ds

from sweeps.store.results import (
    CORE_COLUMNS,
    config_columns,
    decode_value,
    final_rows,
    format_knob,
    json_safe,
    knob_columns,
    read_rows,
    write_rows,
)


def test_write_read_roundtrip_and_core_columns(tmp_path):
    rows = [
        {"sweep": "s", "trial_id": "a", "status": "ok", "step": 0, "val_loss": 3.0,
         "router.entropy": 1.2, "knob.x": {"policy": "reset"}},
        {"sweep": "s", "trial_id": "a", "status": "ok", "step": 2, "val_loss": float("nan")},
        {"sweep": "s", "trial_id": "b", "status": "diverged", "reason": "nan", "step": 1},
    ]
    p = write_rows(tmp_path / "r" / "results.parquet", rows)
    assert not list((tmp_path / "r").glob(".*tmp*"))  # temp file renamed away
    df = pd.read_parquet(p)
    assert list(df.columns[: len(CORE_COLUMNS)]) == CORE_COLUMNS
    assert df["val_loss"].isna().sum() == 2  # NaN stored as null, missing as null
    assert df.loc[2, "reason"] == "nan"
    assert df.loc[0, "knob.x"] == '{"policy": "reset"}'  # JSON, not str()
    assert df["step"].dtype == "int64" and df["seed"].isna().all()  # declared types
    assert ds.dataset(p).count_rows() == 3
    back = read_rows(tmp_path / "r")
    assert [r["trial_id"] for r in final_rows(back)] == ["a", "b"]
    assert [r["step"] for r in final_rows(back)] == [2, 1]


def test_mixed_types_fall_back_to_strings(tmp_path):
    rows = [{"trial_id": "a", "step": 0, "moe.router.logit_norm_lambda": None},
            {"trial_id": "b", "step": 0, "weird": 1}, {"trial_id": "c", "step": 0, "weird": "x"}]
    df = pd.read_parquet(write_rows(tmp_path / "x.parquet", rows))
    assert df["weird"].tolist() == ["1", "x"] or df["weird"].tolist()[1:] == ["1", "x"]


def test_config_columns_are_yaml_paths():
    cfg = {"model": {"preset": "debug"}, "moe": {"num_experts": 8, "router": {"order": "x"}},
           "optim": {"lr": 1e-3, "betas": (0.9, 0.95)},
           "parent": {"tokens": 5, "moe": {"num_experts": 4}}, "upcycle": None, "tokens": 100}
    flat = config_columns(cfg)
    assert flat["moe.num_experts"] == 8 and flat["moe.router.order"] == "x"
    assert "router.order" not in flat  # router.* columns are router statistics only
    assert flat["optim.betas"] == "[0.9, 0.95]" and decode_value(flat["optim.betas"]) == [0.9,
                                                                                          0.95]
    assert flat["parent.tokens"] == 5 and flat["parent.moe.num_experts"] == 4
    assert flat["upcycle"] is None and flat["tokens_budget"] == 100
    knobs = knob_columns({"upcycle.lr_policy": {"policy": "reset", "peak": 0.005}, "seed": 1})
    assert knobs == {"knob.upcycle.lr_policy": '{"policy": "reset", "peak": 0.005}',
                     "knob.seed": 1}
    assert format_knob(knobs["knob.upcycle.lr_policy"]) == "policy=reset peak=0.005"


def test_schema_1_files_are_upgraded_on_read(tmp_path):
    """Results written before the re-partition keep reading: router config moves under
    moe.router, parent.num_experts under parent.moe, str() dicts still decode."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    old = pa.table({"trial_id": ["a"], "step": [0], "router.order": ["topk_softmax"],
                    "router.max_load": [0.4], "parent.num_experts": [4],
                    "knob.upcycle.lr_policy": ["{'policy': 'reset', 'peak': 0.005}"]})
    pq.write_table(old, tmp_path / "results.parquet")
    (r,) = read_rows(tmp_path)
    assert r["moe.router.order"] == "topk_softmax" and r["router.max_load"] == 0.4
    assert r["parent.moe.num_experts"] == 4 and "router.order" not in r
    assert decode_value(r["knob.upcycle.lr_policy"]) == {"policy": "reset", "peak": 0.005}


def test_fresh_run_archives_an_earlier_one(tmp_path):
    from sweeps.run.driver import archive_previous
    from sweeps.store.results import RESULTS_FILE, read_rows, write_rows

    assert archive_previous(tmp_path) is None  # nothing there yet
    write_rows(tmp_path / RESULTS_FILE, [{"sweep": "s", "trial_id": "a", "step": 0}])
    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "tune").mkdir()
    (tmp_path / "parents").mkdir()
    prev = archive_previous(tmp_path)
    assert prev is not None and prev.parent == tmp_path / "previous"
    assert not (tmp_path / RESULTS_FILE).exists() and not (tmp_path / "tune").exists()
    assert [r["trial_id"] for r in read_rows(prev / RESULTS_FILE)] == ["a"]
    assert (prev / "summary.json").exists() and (tmp_path / "parents").exists()
    write_rows(tmp_path / RESULTS_FILE, [{"sweep": "s", "trial_id": "b", "step": 0}])
    prev2 = archive_previous(tmp_path)
    assert prev2 != prev and (prev / RESULTS_FILE).exists()


def test_a_fresh_run_does_not_merge_an_earlier_runs_sealed_rows(tmp_path):
    """A finished trial's rows are sealed into ``parts/``; a fresh run moves them to
    ``previous/`` with the rest (they were left behind, and the next run's table and progress
    counted the earlier run's trials: "8/6 trials done")."""
    from sweeps.run.driver import archive_previous
    from sweeps.store.sink import ResultsSink

    sink = ResultsSink(tmp_path, flush_s=1e9)
    sink.add({"sweep": "s", "trial_id": "a", "step": 0, "val_loss": 1.0})
    sink.mark("a", "ok")
    sink.close()
    assert any((tmp_path / "parts").iterdir())  # sealed
    prev = archive_previous(tmp_path)
    assert prev is not None and any((prev / "parts").iterdir())
    fresh = ResultsSink(tmp_path, flush_s=1e9)
    assert fresh.trial_ids() == set()
    fresh.close()


def test_columns_null_in_every_row_are_still_typed(tmp_path):
    """A knob null throughout a sweep is typed from the config, so sweeps read as one dataset
    (duckdb/polars refuse to union a NULL-typed column with a typed one)."""
    import pyarrow as pa
    import pyarrow.dataset as pds

    from moe_core.train.config import TrainConfig
    from sweeps.store.results import config_types

    types = config_types(TrainConfig)
    assert types["moe.router.logit_norm_lambda"] == pa.float64()
    assert types["knob.moe.router.logit_norm_lambda"] == pa.float64()
    assert types["moe.num_experts"] == pa.int64() and types["optim.betas"] == pa.string()
    a = [{"trial_id": "a", "step": 0, "moe.router.logit_norm_lambda": None,
          "router.max_load": None}]
    b = [{"trial_id": "b", "step": 0, "moe.router.logit_norm_lambda": 2.0,
          "router.max_load": 0.5}]
    write_rows(tmp_path / "x" / "results.parquet", a, types)
    write_rows(tmp_path / "y" / "results.parquet", b, types)
    t = pds.dataset([str(tmp_path / d / "results.parquet") for d in "xy"]).to_table()
    assert t.num_rows == 2 and t.schema.field("moe.router.logit_norm_lambda").type == pa.float64()
    assert t.schema.field("router.max_load").type == pa.float64()


def test_json_safe_nulls_every_non_finite_float():
    row = {"a": math.nan, "b": math.inf, "c": -math.inf, "d": 1.5, "e": 3, "f": "x", "g": None}
    out = json_safe(row)
    assert out == {"a": None, "b": None, "c": None, "d": 1.5, "e": 3, "f": "x", "g": None}
    json.dumps(out, allow_nan=False)  # valid JSON

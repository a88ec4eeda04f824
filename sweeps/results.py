"""The sweep's results: one Parquet file per sweep, one row per (trial, eval).

Written atomically (temp file + rename) with pyarrow; the single source of truth for analysis.
Rows of a failed or diverged trial carry ``status`` and ``reason``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

RESULTS_FILE = "results.parquet"

# Columns every row has, in this order; config columns (model.*, moe.*, router.*, upcycle.*,
# optim.*, data.*, schedule.*, batch.*, parent.*) and router statistics follow.
CORE_COLUMNS = [
    "sweep", "trial_id", "status", "reason", "parent_key", "kind", "seed", "N1", "N2",
    "N_total", "D1", "D2", "step", "tokens", "lr", "train_loss", "val_loss", "aux_loss",
    "wall_s", "flops",
]

CONFIG_PREFIXES = ("model", "moe", "router", "upcycle", "optim", "data", "schedule", "batch",
                   "parent", "eval")


def flatten_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Flatten a TrainConfig dict to dotted columns; ``moe.router.*`` becomes ``router.*``."""
    out: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            if isinstance(node, (list, tuple)):
                node = str(list(node))
            out[prefix] = node

    for section in CONFIG_PREFIXES:
        if section == "router":
            continue
        val = cfg.get(section)
        if section == "moe" and isinstance(val, dict):
            router = val.get("router")
            walk("moe", {k: v for k, v in val.items() if k != "router"})
            walk("router", router or {})
        elif section == "parent" and isinstance(val, dict):
            walk("parent", {k: v for k, v in val.items() if k not in ("moe", "schedule")})
            pm = val.get("moe")
            out["parent.num_experts"] = pm.get("num_experts") if isinstance(pm, dict) else None
        elif val is None:
            out[section] = None
        else:
            walk(section, val)
    out["tokens_budget"] = cfg.get("tokens")
    return out


def _normalise(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, (list, tuple, dict)):
        return str(v)
    return v


def write_rows(path: str | Path, rows: list[dict[str, Any]]) -> Path:
    """Write rows to ``path`` (a .parquet file) atomically; columns are the union of keys."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cols = list(CORE_COLUMNS)
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    data = {c: [_normalise(r.get(c)) for r in rows] for c in cols}
    arrays = {}
    for c, vals in data.items():
        try:
            arrays[c] = pa.array(vals)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed types: keep them readable
            arrays[c] = pa.array([None if v is None else str(v) for v in vals], pa.string())
    table = pa.table(arrays)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return path


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    if not path.exists():
        return []
    return pq.read_table(path).to_pylist()


def final_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last row (max step) of each trial."""
    best: dict[str, dict[str, Any]] = {}
    for r in rows:
        t = r["trial_id"]
        if t not in best or (r.get("step") or 0) >= (best[t].get("step") or 0):
            best[t] = r
    return list(best.values())


def format_knob(v: Any) -> str:
    """Compact knob value: {"policy": "reset", "peak": 0.005} → policy=reset peak=0.005."""
    if isinstance(v, str) and v.startswith("{") and v.endswith("}"):
        try:
            import ast

            v = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            return v
    if isinstance(v, dict):
        return " ".join(f"{k}={x}" for k, x in v.items())
    return str(v)

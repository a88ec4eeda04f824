"""The sweep's results: the declared column schema and the Parquet file that holds it.

One Parquet file per sweep, one row per (trial, eval); the single source of truth for
``analysis`` (which imports this module for the schema and nothing else of ``sweeps``).

Columns, in this order:

- ``COLUMNS``: the declared core columns below (identity, outcome, sizes, per-eval metrics);
- config columns, keyed by their YAML path in the trial config (``moe.router.aux_coef``,
  ``upcycle.lr_policy.policy``, ``parent.moe.num_experts``, ...): what the trial ran;
- knob columns ``knob.<YAML path>`` for every knob the sweep searches (``knob.seed`` too): the
  value the trial ran, so a conditional knob whose ``when`` did not hold shows the base value;
- router statistics ``router.<stat>`` per eval (``moe_core.train.evaluate``).

Dict and list values (``knob.upcycle.lr_policy``, ``optim.betas``) are stored as JSON text and
read back with :func:`decode_value`. Written atomically (temp file + rename) with pyarrow; the
file's metadata carries ``SCHEMA_VERSION``. Files written before version 2 (router config under
``router.*``, ``parent.num_experts``, Python ``str()`` of dicts) are upgraded on read.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from moe_core.fsio import atomic_write, atomic_write_text

RESULTS_FILE = "results.parquet"
SCHEMA_VERSION = 2
_META_KEY = b"upcycle_sweeps.schema"

KNOB_PREFIX = "knob."
"""Knob columns: ``knob.`` + the knob's YAML path."""
ROUTER_PREFIX = "router."
"""Router statistics reported at each eval (never configuration)."""
CONFIG_SECTIONS = ("model", "moe", "upcycle", "optim", "data", "schedule", "batch", "parent",
                   "eval")
"""Top-level TrainConfig sections flattened into config columns by YAML path."""


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: pa.DataType
    static: bool
    """Configuration (the same in every row of a trial) rather than a per-eval metric."""
    doc: str


COLUMNS: tuple[Column, ...] = (
    Column("sweep", pa.string(), True, "sweep name (the spec's `sweep:`)"),
    Column("trial_id", pa.string(), True, "Ray Tune trial id"),
    Column("status", pa.string(), False, "running | ok | failed | diverged"),
    Column("reason", pa.string(), False, "why a trial failed or diverged"),
    Column("parent_key", pa.string(), True, "content hash of the trial's parent ('' = none)"),
    Column("kind", pa.string(), True, "dense | moe | upcycled"),
    Column("seed", pa.int64(), True, "the trial's seed"),
    Column("N1", pa.int64(), True, "non-embedding parameters of the parent (000: N1)"),
    Column("N2", pa.int64(), True, "active non-embedding parameters of the trial's model"),
    Column("N_total", pa.int64(), True, "total non-embedding parameters of the trial's model"),
    Column("D1", pa.int64(), True, "tokens the parent was trained on (000: D1; 003: τ)"),
    Column("D2", pa.int64(), False, "tokens this trial has trained at this eval (000: D2)"),
    Column("step", pa.int64(), False, "optimizer steps at this eval"),
    Column("tokens", pa.int64(), False, "tokens this trial has trained at this eval"),
    Column("lr", pa.float64(), False, "learning rate of the last step"),
    Column("train_loss", pa.float64(), False, "mean cross-entropy of the last step"),
    Column("val_loss", pa.float64(), False, "validation cross-entropy"),
    Column("aux_loss", pa.float64(), False, "load-balancing loss of the last step"),
    Column("wall_s", pa.float64(), False, "seconds since the run started"),
    Column("flops", pa.float64(), False, "6·N2·tokens"),
    Column("tokens_budget", pa.int64(), True, "the trial's token budget (config `tokens`)"),
    Column("parent_val_loss", pa.float64(), True, "the parent's final validation loss"),
    Column("branch_from_step", pa.int64(), True,
           "WSD branch: the shared stable run's step it decays from"),
    Column("ranks", pa.int64(), True, "DeepSpeed ranks of the trial"),
)
CORE_COLUMNS = [c.name for c in COLUMNS]
_TYPES = {c.name: c.type for c in COLUMNS}
STATIC_COLUMNS = frozenset(c.name for c in COLUMNS if c.static)


def is_static(column: str) -> bool:
    """Configuration rather than a metric: W&B takes these as run config, not curves."""
    if column in _TYPES:
        return column in STATIC_COLUMNS
    return column.startswith(KNOB_PREFIX) or column.split(".", 1)[0] in CONFIG_SECTIONS


# ---- values --------------------------------------------------------------------------------


def encode_value(v: Any) -> Any:
    """A cell as stored: NaN → null, dicts/lists/tuples → JSON text."""
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(v, default=str)
    return v


def decode_value(v: Any) -> Any:
    """The value of a cell: JSON text of a dict/list back to the dict/list."""
    if isinstance(v, str) and v[:1] in "{[" and v[-1:] in "}]":
        try:
            return json.loads(v)
        except ValueError:
            try:  # written before schema 2 with str()
                return ast.literal_eval(v)
            except (ValueError, SyntaxError):
                return v
    return v


def format_knob(v: Any) -> str:
    """Compact knob value: {"policy": "reset", "peak": 0.005} → policy=reset peak=0.005."""
    v = decode_value(v)
    if isinstance(v, dict):
        return " ".join(f"{k}={x}" for k, x in v.items())
    return str(v)


# ---- row builders --------------------------------------------------------------------------


def config_columns(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Config columns of a TrainConfig dict: every leaf under ``CONFIG_SECTIONS`` keyed by its
    YAML path (a section that is null gives one null column); plus ``tokens_budget``."""
    out: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                walk(f"{prefix}.{k}", v)
        else:
            out[prefix] = encode_value(node)

    for section in CONFIG_SECTIONS:
        walk(section, cfg.get(section))
    out["tokens_budget"] = cfg.get("tokens")
    return out


def knob_columns(knobs: Mapping[str, Any]) -> dict[str, Any]:
    """``{yaml path: value}`` → knob columns."""
    return {KNOB_PREFIX + k: encode_value(v) for k, v in knobs.items()}


# ---- the file ------------------------------------------------------------------------------


def _array(name: str, vals: list[Any]) -> pa.Array:
    typ = _TYPES.get(name)
    if typ is not None:
        try:
            return pa.array(vals, typ)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pass
    try:
        return pa.array(vals)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed types: keep them readable
        return pa.array([None if v is None else str(v) for v in vals], pa.string())


def write_rows(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Write rows to ``path`` (a .parquet file) atomically: the declared columns first, then
    the union of every other key in first-seen order."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = list(rows)
    cols = list(CORE_COLUMNS)
    seen = set(cols)
    for r in rows:
        for k in r:
            if k not in seen:
                cols.append(k)
                seen.add(k)
    table = pa.table({c: _array(c, [encode_value(r.get(c)) for r in rows]) for c in cols})
    table = table.replace_schema_metadata({_META_KEY: str(SCHEMA_VERSION).encode()})
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def read_table(path: str | Path) -> pa.Table | None:
    """The results table of a file or a sweep directory (None if absent), at SCHEMA_VERSION."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    if not path.exists():
        return None
    table = pq.read_table(path)
    meta = table.schema.metadata or {}
    if int(meta.get(_META_KEY, b"1")) < 2:
        table = _upgrade_v1(table)
    return table


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    table = read_table(path)
    return [] if table is None else table.to_pylist()


# Schema 1 (before the re-partition) stored moe.router.* as router.* next to the router
# statistics, and parent.moe.num_experts as parent.num_experts.
_V1_ROUTER_CONFIG = ("order", "renormalize", "logit_norm_lambda", "aux_loss", "z_loss_coef",
                     "adaptive_aux", "adaptive_xi", "adaptive_alpha_max", "adaptive_beta",
                     "loss_free_rate", "init_std")


def _upgrade_v1(table: pa.Table) -> pa.Table:
    names = []
    for n in table.column_names:
        if n.startswith(ROUTER_PREFIX) and n[len(ROUTER_PREFIX):] in _V1_ROUTER_CONFIG:
            n = "moe." + n
        elif n == "parent.num_experts":
            n = "parent.moe.num_experts"
        names.append(n)
    return table.rename_columns(names)


def final_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The last row (max step) of each trial."""
    best: dict[str, Mapping[str, Any]] = {}
    for r in rows:
        t = r["trial_id"]
        if t not in best or (r.get("step") or 0) >= (best[t].get("step") or 0):
            best[t] = r
    return [dict(r) for r in best.values()]


def knob_names(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Knob columns present in ``rows`` (sorted)."""
    return sorted({k for r in rows for k in r if k.startswith(KNOB_PREFIX)})


# ---- summary.json --------------------------------------------------------------------------


def summarize(finals: Iterable[Mapping[str, Any]], *, sweep: str, metric: str, mode: str,
              planned: Mapping[str, Any], results: str, wall_s: float,
              parent_wall_s: float) -> dict[str, Any]:
    """The sweep's outcome and compute ledger (``planned``: the plan's estimates)."""
    finals = list(finals)
    ok = [r for r in finals if r.get("status") == "ok"]
    vals = [r[metric] for r in ok if isinstance(r.get(metric), (int, float))]
    best = (min if mode == "min" else max)(vals) if vals else None
    return {
        "sweep": sweep, "trials": len(finals), "ok": len(ok),
        "failed": sum(r.get("status") == "failed" for r in finals),
        "diverged": sum(r.get("status") == "diverged" for r in finals),
        "best": best, "metric": metric, "wall_s": round(wall_s, 1),
        "parent_wall_s": round(parent_wall_s, 1), "parents": planned["parents"],
        "tokens_saved_by_sharing": planned["tokens_saved_by_sharing"],
        "tokens_saved_by_branches": planned["tokens_saved_by_branches"],
        "results": results,
        **{f"planned_{k}": planned.get(k)
           for k in ("trial_tokens", "trial_flops", "parent_tokens", "parent_flops")},
    }


def write_summary(results_dir: str | Path, summary: Mapping[str, Any]) -> Path:
    """``summary.json`` next to the results (the compute ledger analysis.report reads)."""
    return atomic_write_text(Path(results_dir) / "summary.json",
                             json.dumps(summary, indent=1, default=str))

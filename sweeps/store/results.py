"""The sweep's results: the declared column schema and the Parquet file that holds it.

One Parquet file per sweep, one row per (trial, eval); the single source of truth for
``analysis`` (which imports this module for the schema and nothing else of ``sweeps``). Its
columns (docs/results-and-export.md lists them): :data:`COLUMNS`, then config, ``knob.``,
``router.``, ``effective.``, ``compile.`` and ``memory.`` columns. Written atomically (temp
file + rename, or one PUT on object storage: ``sweeps.store.storage``) with pyarrow; the file's
metadata carries ``SCHEMA_VERSION``, and older files are upgraded on read (:func:`read_table`).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import itertools
import json
import math
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from moe_core.fsio import atomic_write
from sweeps.store.storage import Location, is_url

RESULTS_FILE = "results.parquet"
SCHEMA_VERSION = 3
_META_KEY = b"upcycle_sweeps.schema"
PROVENANCE_KEY = b"upcycle_sweeps.provenance"
"""Schema metadata key of the writer's provenance record (JSON; ``sweeps.provenance``)."""

KNOB_PREFIX = "knob."
"""Knob columns: ``knob.`` + the knob's YAML path."""
FINAL_EVAL, STEP0_EVAL = "final eval", "step-0 eval"
"""The values of ``parent_loss_source``: where a row's ``parent_val_loss`` comes from."""
EFFECTIVE_PREFIX = "effective."
"""Effective columns: ``effective.`` + a key, its value read back from the live run."""
ROUTER_PREFIX = "router."
"""Router statistics reported at each eval (never configuration)."""
MEMORY_PREFIX = "memory."
"""The node's memory figures on the rows of a trial killed for memory (``sweeps.store.oom``)."""
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
    Column("status", pa.string(), False,
           "running | ok | failed | diverged | pruned | oom | interrupted | budget"),
    Column("reason", pa.string(), False, "why a trial failed, diverged or was killed (oom)"),
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
    Column("wall_s", pa.float64(), False,
           "seconds since the trial started; a restart or WSD branch continues the clock"),
    Column("flops", pa.float64(), False, "6·N2·tokens"),
    Column("tokens_budget", pa.int64(), True, "the trial's token budget (config `tokens`)"),
    Column("parent_val_loss", pa.float64(), True,
           "the parent's validation loss (where from: parent_loss_source)"),
    Column("parent_loss_source", pa.string(), True,
           "`final eval`: the trained parent's last eval; `step-0 eval`: a "
           "parent.from_pretrained parent, loaded and never evaluated: the trial's step-0 eval "
           "(the freshly upcycled model), so no transition jump is measured"),
    Column("branch_from_step", pa.int64(), True,
           "WSD branch: the shared stable run's step it decays from"),
    Column("ranks", pa.int64(), True, "DeepSpeed ranks of the trial"),
    Column("transition_jump", pa.float64(), False,
           "upcycled trial: its first eval's loss minus the parent's final loss (the jump at τ)"),
    Column("predicted_final", pa.float64(), False,
           "the loss predicted after the trial's WSD decay (scheduler.rung_metric)"),
    Column("prune_rule", pa.string(), False, "pruned trial: the prune: rule that fired"),
    Column("prune_metric", pa.string(), False, "pruned trial: the column the rule read"),
    Column("prune_value", pa.float64(), False, "pruned trial: its value when the rule fired"),
    Column("prune_threshold", pa.float64(), False, "pruned trial: the rule's `above`"),
    Column("prune_step", pa.int64(), False, "pruned trial: the step at which the rule fired"),
)
PRUNE_COLUMNS = ("prune_rule", "prune_metric", "prune_value", "prune_threshold", "prune_step")
"""Columns of a pruned trial (``sweeps.run.prune.Verdict.columns``); null in every other row."""
CORE_COLUMNS = [c.name for c in COLUMNS]
_TYPES = {c.name: c.type for c in COLUMNS}
STATIC_COLUMNS = frozenset(c.name for c in COLUMNS if c.static)


def json_safe(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row with every non-finite float as None (null in JSON, the WAL and Tune's records;
    a missing value in Parquet): ``NaN``/``Infinity`` are not JSON."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v
            for k, v in row.items()}


def is_static(column: str) -> bool:
    """Configuration rather than a metric: W&B takes these as run config, not curves."""
    if column in _TYPES:
        return column in STATIC_COLUMNS
    return column.startswith((KNOB_PREFIX, EFFECTIVE_PREFIX)) or \
        column.split(".", 1)[0] in CONFIG_SECTIONS


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


def config_types(config_cls: type) -> dict[str, pa.DataType]:
    """Arrow types of the config and knob columns of a config dataclass (``TrainConfig``),
    from its field types, so a column that is null in every row of a sweep (a knob that is
    ``null`` throughout, a dense run's ``moe``) is still typed and sweeps read as one dataset.
    Dicts, lists and sections are JSON text (strings)."""
    out: dict[str, pa.DataType] = {}

    def leaf(t: Any) -> pa.DataType:
        if typing.get_origin(t) in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(t) if a is not type(None)]
            return leaf(args[0]) if len(args) == 1 else pa.string()
        return {bool: pa.bool_(), int: pa.int64(), float: pa.float64()}.get(t, pa.string())

    def section(t: Any) -> type | None:
        args = typing.get_args(t) or (t,)
        return next((a for a in args if dataclasses.is_dataclass(a)), None)

    def walk(prefix: str, cls: type) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            path = f"{prefix}.{f.name}" if prefix else f.name
            sub = section(hints[f.name])
            out[path] = pa.string() if sub is not None else leaf(hints[f.name])
            if sub is not None:
                walk(path, sub)

    walk("", config_cls)
    out.update({KNOB_PREFIX + k: v for k, v in list(out.items())})
    out[KNOB_PREFIX + "seed"] = pa.int64()
    return {k: v for k, v in out.items() if k not in _TYPES}


def _array(name: str, vals: list[Any], typ: pa.DataType | None = None) -> pa.Array:
    typ = _TYPES.get(name) or typ or (
        pa.float64() if name.startswith((ROUTER_PREFIX, MEMORY_PREFIX)) else None)
    if typ is not None:
        with contextlib.suppress(pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            return pa.array(vals, typ)
    try:
        return pa.array(vals)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed types: keep them readable
        return pa.array([None if v is None else str(v) for v in vals], pa.string())


def rows_table(rows: Iterable[Mapping[str, Any]],
               types: Mapping[str, pa.DataType] | None = None) -> pa.Table:
    """Rows as a table: the declared columns first (with their types), then the union of every
    other key in first-seen order, typed by ``types`` (``config_types``) where given."""
    types = types or {}
    rows = list(rows)
    cols = dict.fromkeys(itertools.chain(CORE_COLUMNS, itertools.chain.from_iterable(rows)))
    return pa.table({c: _array(c, [encode_value(r.get(c)) for r in rows], types.get(c))
                     for c in cols})


def concat_tables(tables: Iterable[pa.Table]) -> pa.Table:
    """Tables of some trials each into one (missing columns null; int and float widen)."""
    return pa.concat_tables(list(tables), promote_options="permissive")


def _put(path: str | Path | Location, write: Any, sign: bool) -> Path | Location:
    """Run ``write(sink)`` into ``path`` atomically: a local file by temp file, fsync and
    rename; on object storage one whole object (``sign``: through ``sweeps.store.signing``)."""
    if isinstance(path, Location) or is_url(path):
        loc = Location.of(path).signed() if sign else Location.of(path)
        if not loc.is_local:
            buf = pa.BufferOutputStream()
            write(buf)
            return loc.write_bytes(buf.getvalue().to_pybytes())
        path = loc.local_path
    return atomic_write(path, lambda tmp: write(str(tmp)))


def write_table(path: str | Path | Location, table: pa.Table) -> Path | Location:
    """Write a results table to ``path`` atomically (on object storage signed)."""
    table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                           _META_KEY: str(SCHEMA_VERSION).encode()})
    return _put(path, lambda sink: pq.write_table(table, sink), sign=True)


def write_rows(path: str | Path, rows: Iterable[Mapping[str, Any]],
               types: Mapping[str, pa.DataType] | None = None) -> Path:
    """Write rows to ``path`` (a .parquet file) atomically."""
    return write_table(path, rows_table(rows, types))


def read_table(path: str | Path | Location) -> pa.Table | None:
    """The results table of a file or a sweep directory, local or a URL (None if absent), at
    SCHEMA_VERSION."""
    loc = Location.of(path).signed()  # object storage: verified, an injected file refused
    if loc.is_dir():
        loc = loc / RESULTS_FILE
    if not loc.exists():
        return None
    table = _read_parquet(loc)
    version = int((table.schema.metadata or {}).get(_META_KEY, b"1"))
    if version < 2:
        table = _upgrade_v1(table)
    if version < 3:
        table = _upgrade_v2(table)
    return table


def read_provenance(path: str | Path | Location) -> dict[str, Any] | None:
    """The provenance record of a results file or sweep folder (None: none recorded)."""
    loc = Location.of(path)
    if loc.is_dir():
        loc = loc / RESULTS_FILE
    if not loc.path.endswith(".parquet") or not loc.exists():
        return None  # a CSV of results records none
    raw = (read_schema(loc).metadata or {}).get(PROVENANCE_KEY)
    return None if raw is None else json.loads(raw)


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


_V3_COLUMNS = ("transition_jump", "predicted_final", *PRUNE_COLUMNS)


def _upgrade_v2(table: pa.Table) -> pa.Table:
    """Schema 3 added the pruned status and its columns: null in an older file."""
    for name in _V3_COLUMNS:
        if name not in table.column_names:
            table = table.append_column(pa.field(name, _TYPES[name]),
                                        pa.nulls(table.num_rows, _TYPES[name]))
    return table


def final_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The last row (max step) of each trial."""
    best: dict[str, Mapping[str, Any]] = {}
    for r in rows:
        t = r["trial_id"]
        if t not in best or (r.get("step") or 0) >= (best[t].get("step") or 0):
            best[t] = r
    return [dict(r) for r in best.values()]


# ---- summary.json --------------------------------------------------------------------------


def summarize(finals: Iterable[Mapping[str, Any]], *, sweep: str, metric: str, mode: str,
              planned: Mapping[str, Any], results: str, wall_s: float,
              parent_wall_s: float) -> dict[str, Any]:
    """The sweep's outcome and compute ledger (``planned``: the plan's estimates). ``complete`` is
    false while a planned trial has not ended (ok, failed, diverged, pruned or oom: killed by Ray's
    memory monitor): ``unfinished`` lists the trials that started, ``not_started`` counts the
    others. A pruned trial counts neither as ok nor as failed."""
    finals = list(finals)
    ok = [r for r in finals if r.get("status") == "ok"]
    unfinished = sorted(str(r["trial_id"]) for r in finals
                        if r.get("status") not in ("ok", "failed", "diverged", "pruned", "oom"))
    not_started = max(0, int(planned["trials"]) - len(finals))
    vals = [r[metric] for r in ok if isinstance(r.get(metric), (int, float))]
    best = (min if mode == "min" else max)(vals) if vals else None

    def count(status: str) -> int:
        return sum(r.get("status") == status for r in finals)

    return {
        "sweep": sweep, "complete": not unfinished and not not_started,
        "unfinished": unfinished, "not_started": not_started,
        "trials": len(finals), "ok": len(ok),
        **{s: count(s) for s in ("failed", "diverged", "pruned", "oom", "interrupted")},
        "budget_stopped": count("budget"),
        "best": best, "metric": metric, "wall_s": round(wall_s, 1),
        "parent_wall_s": round(parent_wall_s, 1), "parents": planned["parents"],
        "tokens_saved_by_sharing": planned["tokens_saved_by_sharing"],
        "tokens_saved_by_branches": planned["tokens_saved_by_branches"],
        "results": results,
        **{f"planned_{k}": planned.get(k)
           for k in ("trial_tokens", "trial_flops", "parent_tokens", "parent_flops")},
    }


def write_summary(results_dir: str | Path | Location, summary: Mapping[str, Any]) -> Location:
    """``summary.json`` next to the results (the compute ledger analysis.report reads)."""
    return (Location.of(results_dir).signed() / "summary.json").write_text(
        json.dumps(summary, indent=1, default=str))


# ---- results.parquet stitched from parts (sweeps.store.sink) -------------------------------------


def _read_parquet(loc: Location, columns: list[str] | None = None) -> pa.Table:
    """A Parquet file at ``loc``, on object storage decoded in this thread. Arrow's thread pool
    can let go of the file's bytes (a buffer Python owns, from the signing filesystem) on a
    pool thread after the interpreter began to exit; taking the GIL there aborts the process
    ("terminate called without an active exception"): 1 ``read_rows`` of a bucket in 8 did
    (tests/sweeps/test_storage.py::test_reading_a_bucket_exits_cleanly). A local file's bytes
    are Arrow's own: decoded on the pool as before."""
    with loc.fs.open_input_file(loc.path) as f:
        return pq.ParquetFile(f).read(columns=columns, use_threads=loc.is_local)


def read_schema(path: Path | Location) -> pa.Schema:
    """A Parquet file's schema, from its footer only."""
    if isinstance(path, Location):
        return pq.read_schema(path.path, filesystem=path.fs)
    return pq.read_schema(path)


def read_part(path: Path | Location, trials: set[str] | None = None,
              columns: list[str] | None = None) -> pa.Table:
    """A part file of the sink (``trials``: only those trials' rows)."""
    table = _read_parquet(path, columns) if isinstance(path, Location) else \
        pq.read_table(path, columns=columns)
    if trials is not None:
        import pyarrow.compute as pc

        table = table.filter(pc.is_in(table["trial_id"], pa.array(sorted(trials), pa.string())))
    return table


def unify(schemas: list[pa.Schema]) -> pa.Schema:
    """One schema for tables of some trials each (as :func:`concat_tables`): int and float
    widen; a column of mixed kinds (a number here, text there) becomes text."""
    try:
        return pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        fields: dict[str, pa.Field] = {}
        for sch in schemas:
            for f in sch:
                old = fields.get(f.name)
                if old is None or pa.types.is_null(old.type):
                    fields[f.name] = f
                elif not pa.types.is_null(f.type) and old.type != f.type:
                    num = all(pa.types.is_integer(t) or pa.types.is_floating(t)
                              for t in (old.type, f.type))
                    fields[f.name] = pa.field(f.name, pa.float64() if num else pa.string())
        return pa.schema(list(fields.values()))


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s columns in its order (missing ones null) and types."""
    cols = []
    for f in schema:
        col = table[f.name] if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
        if col.type != f.type:
            try:
                col = col.cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                col = pa.array([None if v is None else str(v) for v in col.to_pylist()],
                               f.type)
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=schema)


def write_stream(path: str | Path | Location, schema: pa.Schema,
                 tables: Iterable[pa.Table], metadata: Mapping[bytes | str, bytes] | None = None
                 ) -> Path | Location:
    """Write ``tables`` (each conformed to ``schema``) one after another into one Parquet file,
    atomically, holding one table at a time (on object storage: one whole object); ``metadata``
    joins the schema's (the provenance record, :data:`PROVENANCE_KEY`)."""
    schema = schema.with_metadata({**(metadata or {}), _META_KEY: str(SCHEMA_VERSION).encode()})

    def _write(sink: Any) -> None:
        with pq.ParquetWriter(sink, schema) as w:
            for t in tables:
                if t.num_rows:
                    w.write_table(conform(t, schema))

    return _put(path, _write, sign=False)


def last_rows(table: pa.Table) -> list[dict[str, Any]]:
    """The last row (max step) of each trial of ``table``, without a row per row in Python."""
    if not table.num_rows:
        return []
    table = table.sort_by([("trial_id", "ascending"), ("step", "ascending")])
    ids = table["trial_id"].to_pylist()
    keep = [i for i in range(len(ids)) if i + 1 == len(ids) or ids[i + 1] != ids[i]]
    return table.take(pa.array(keep, pa.int64())).to_pylist()

"""Reading offline W&B runs back with wandb's own reader, and checking them against the rows.

The wandb 0.31 Python package ships no reader of the ``.wandb`` transaction log (its old
``wandb.sdk.internal.datastore`` is gone with the Python backend); the reader is the bundled
``wandb-core``'s, reached through wandb's public CLI: ``wandb leet inspect --json RUN.wandb``
prints each record of the log (wandb's protobuf ``Record``: run, config, history, ...) as one
JSON line, with config values and history items already decoded from their ``value_json``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

from sweeps.store.results import PRUNE_COLUMNS, decode_value
from sweeps.store.wandb_keys import health_stats, is_config, lookup, metric_key

RECORD_TYPES = frozenset(f.name for f in wandb_internal_pb2.Record.DESCRIPTOR.oneofs_by_name[
    "record_type"].fields)
"""The kinds of wandb's protobuf ``Record`` (its ``record_type`` oneof): run, config, history..."""
SINK_COLUMNS = frozenset({"status", "reason", *PRUNE_COLUMNS})
"""Columns the results sink sets on a trial's rows (its outcome), not reported by the trial."""


@dataclass
class OfflineRun:
    run_id: str = ""
    group: str = ""
    project: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    exit_code: int | None = None
    """The run's exit record (None: the log ends without one, a run not finished)."""


def read_offline_run(run_dir: Path) -> OfflineRun:
    """The run in ``run_dir`` (``wandb/offline-run-*``) as wandb's reader prints it."""
    (log,) = run_dir.glob("*.wandb")
    env = dict(os.environ, WANDB_MODE="offline")  # and so no telemetry upload
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(log)],
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    run = OfflineRun()
    for line in out.stdout.splitlines():
        rec = json.loads(line)
        kind = rec["type"]
        assert kind in RECORD_TYPES and kind in rec, f"{log}: not a wandb Record: {line[:200]}"
        if kind == "run":
            r = rec["run"]
            run.run_id, run.group, run.project = r["run_id"], r.get("run_group", ""), r["project"]
            run.config.update(r.get("config", {}).get("update", {}))
        elif kind == "config":  # W&B replaces each top-level key a config update names
            run.config.update(rec["config"].get("update", {}))
        elif kind == "history":
            run.history.append(rec["history"]["item"])
        elif kind == "exit":
            run.exit_code = rec["exit"].get("exit_code", 0)
    return run


def offline_runs(wandb_dir: Path) -> dict[str, OfflineRun]:
    """Every offline run under a results folder's ``wandb/``, by run id (the Tune trial id). A
    trial restored after a failure logs on into the same run (Ray keeps its logging actor)."""
    runs = [read_offline_run(d) for d in sorted(wandb_dir.glob("offline-run-*"))]
    out = {r.run_id: r for r in runs}
    assert len(out) == len(runs), f"a run id logged twice: {sorted(r.run_id for r in runs)}"
    return out


def _same(a: Any, b: Any) -> bool:
    """``a`` (the Parquet's) is ``b`` (W&B's); a dict's keys are in ``b``, which may hold more
    (a dict column nests with its children's columns, ``sweeps.store.wandb_keys.nest``)."""
    if isinstance(a, Mapping):
        return isinstance(b, Mapping) and all(k in b and _same(v, b[k]) for k, v in a.items())
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-12)
    return a == b


def mismatches(run: OfflineRun, rows: Iterable[Mapping[str, Any]],
               static: Collection[str]) -> list[str]:
    """How ``run`` differs from its trial's Parquet ``rows``: each config column (knobs,
    effective values, static columns) against the run config, and each metric column against
    the history item at the row's step (per-layer health under its ``health/`` key). Columns
    null in a row are not expected in W&B (Ray drops them)."""
    bad: list[str] = []
    by_step = {h["step"]: h for h in run.history if "step" in h}
    for row in rows:
        step = row["step"]
        item = by_step.get(step)
        if item is None:
            bad.append(f"step {step}: no history item")
            continue
        stats = health_stats(row)
        for col, want in row.items():
            if want is None or col in SINK_COLUMNS:
                continue
            if is_config(col, static):
                try:
                    got = lookup(run.config, col)
                except (KeyError, TypeError):
                    bad.append(f"config {col}: missing")
                    continue
                if not (_same(want, got) or _same(decode_value(want), got)):
                    bad.append(f"config {col}: {got!r} != {want!r}")
            elif (key := metric_key(col, stats)) not in item:
                bad.append(f"step {step} {key}: missing")
            elif not _same(want, item[key]):
                bad.append(f"step {step} {key}: {item[key]!r} != {want!r}")
    return bad

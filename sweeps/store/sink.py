"""Where the driver keeps a sweep's rows so that nothing reported is ever lost.

Every row (and every status change) the driver receives is appended to a write-ahead log
(``rows/wal-NNNNNN.jsonl``, flushed and fsynced) before the Tune callback returns: O(1) work per
row on Tune's event loop. ``results.parquet`` is rewritten from memory by a background thread
(at most every ``flush_s`` seconds, and at the end); after each rewrite the log segments it
covers are deleted, so the log stays small. On ``--resume`` the rows are rebuilt from, in
order: ``results.parquet`` (if it is readable at all), the log, and Tune's own trial records
(``tune/*/result.json``), so a deleted, truncated or garbage ``results.parquet`` costs nothing.

On object storage (``results: s3://...``; ``sweeps.store.storage``) there is no append or fsync:
each log record is its own write-once object (``rows/wal-NNNNNN-MMMMMMMM.jsonl``), durable when its
PUT returns; replay reads them in name order, and the rewrite of ``results.parquet`` (one
object) deletes the ones it covers, as locally.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from moe_core.fsio import fsync_dir
from sweeps.store.provenance import provenance
from sweeps.store.results import (
    CORE_COLUMNS,
    PRUNE_COLUMNS,
    RESULTS_FILE,
    concat_tables,
    json_safe,
    read_rows,
    rows_table,
    with_provenance,
    write_table,
)
from sweeps.store.storage import Location, is_url

_CORE = frozenset(CORE_COLUMNS)
RowKey = tuple[str, int]


def row_from_result(result: dict[str, Any], trial_id: str) -> dict[str, Any]:
    """Our columns of a Tune result (Tune adds its own keys: time_total_s, config, ...)."""
    row = {k: v for k, v in result.items() if k in _CORE or "." in k}
    row["trial_id"] = trial_id
    return row


def _key(row: dict[str, Any]) -> RowKey:
    return str(row["trial_id"]), int(row.get("step") or 0)


def rewind(curve: dict[int, Any], step: int) -> None:
    """A row at ``step`` arrives: a trial's curve (step → row) drops every later step. A row
    at a step the trial already passed is a replay (a restart from a checkpoint): its curve is
    rewritten from there, and rows the new attempt never reaches (it was pruned or stopped
    sooner) must not outlive it."""
    for s in [s for s in curve if s > step]:
        del curve[s]


def tune_results(path: Path | Location) -> list[dict[str, Any]]:
    """The results in a Tune ``result.json``, oldest first; a line cut by a kill (or any line
    that is not JSON) is skipped: everything before it is whole."""
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


@dataclass
class LoadReport:
    from_parquet: int = 0
    from_log: int = 0
    from_tune: int = 0
    problems: list[str] = field(default_factory=list)


class ResultsSink:
    """In-memory rows, a durable log of every change, and a background Parquet writer."""

    def __init__(self, results_dir: str | Path | Location, flush_s: float = 10.0,
                 types: dict[str, pa.DataType] | None = None,
                 write: Callable[[Path, pa.Table], Any] = write_table):
        loc = Location.of(results_dir) if isinstance(results_dir, Location) or \
            is_url(results_dir) else None
        self.remote = loc is not None and not loc.is_local
        self.dir = loc if self.remote else Path(loc.path if loc is not None else results_dir)
        self.types = types or {}
        self.path = self.dir / RESULTS_FILE
        self.log_dir = self.dir / "rows"
        self.flush_s = flush_s
        self.trials: dict[str, dict[int, dict[str, Any]]] = {}  # trial → step → row
        self._last: dict[str, int] = {}  # trial → its highest step (a rewind check in O(1))
        self._write = write
        self._lock = threading.Lock()
        self._writer: threading.Thread | None = None
        self._pending = False
        self._last_flush = time.time()  # the first rewrite comes flush_s after the start
        self._segment = 0
        self._log = None
        self._tables: dict[str, pa.Table] = {}  # per trial, rebuilt only when it changed
        self._dirty: set[str] = set()
        self.write_errors: list[str] = []

    # ---- pickling: Tune pickles its callbacks into the experiment state -----------------------

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_lock=None, _writer=None, _log=None, trials={}, _last={}, _tables={},
                     _dirty=set())
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._last = {}  # absent from a sink pickled by an older version
        self._lock = threading.Lock()
        self._last_flush = time.time()

    # ---- the log ---------------------------------------------------------------------------

    def _segments(self) -> list[Any]:
        if self.remote:
            return [self.log_dir / f for f in self.log_dir.files(recursive=False)
                    if f.startswith("wal-") and f.endswith(".jsonl")]
        return sorted(self.log_dir.glob("wal-*.jsonl"))

    def _open_segment(self) -> None:
        if self.remote:  # one object per record, under the segment's prefix
            last = self._segments()
            self._segment = max([self._segment, *(int(p.name[4:10]) for p in last)]) + 1
            self._log = _ObjectLog(self.log_dir, self._segment)
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        last = self._segments()
        self._segment = max([self._segment, *(int(p.stem[4:]) for p in last)]) + 1
        self._log = open(self.log_dir / f"wal-{self._segment:06d}.jsonl", "a")
        fsync_dir(self.log_dir)

    def _append(self, record: dict[str, Any]) -> None:
        if self._log is None:
            self._open_segment()
        self._log.write(json.dumps(record, default=str) + "\n")
        self._log.flush()
        if not self.remote:
            os.fsync(self._log.fileno())

    # ---- rebuilding --------------------------------------------------------------------------

    def load(self, tune_dir: str | Path | None = None) -> LoadReport:
        """Rebuild the rows from whatever is durable (see the module docstring)."""
        rep = LoadReport()
        with self._lock:
            if self.path.exists():
                try:
                    for r in read_rows(self.path):
                        self._put(r)
                        rep.from_parquet += 1
                except Exception as e:  # noqa: BLE001 - any damage: rebuild from the rest
                    rep.problems.append(f"{self.path} is unreadable ({type(e).__name__}); "
                                        "rebuilt from the row log and Tune's records")
            for seg in self._segments():
                rep.from_log += self._replay(seg, rep)
            if tune_dir is not None:
                rep.from_tune = self._from_tune(
                    tune_dir if self.remote else Path(tune_dir), rep)
        return rep

    def _replay(self, seg: Path, rep: LoadReport) -> int:
        n = 0
        for i, line in enumerate(seg.read_text().splitlines()):
            try:
                rec = json.loads(line)
            except ValueError:  # a line cut by a kill: everything before it is whole
                rep.problems.append(f"{seg.name}:{i + 1} is truncated; skipped")
                continue
            if "row" in rec:
                self._put(rec["row"], replay=True)
                n += 1
            elif "mark" in rec:
                self._apply_mark(**rec["mark"])
        return n

    def _from_tune(self, tune_dir: Path | Location, rep: LoadReport) -> int:
        """Rows Tune recorded that nothing else kept. A trial's ``result.json`` holds every
        attempt's results in order: it is replayed with the same rewind as the log, so a row
        a later attempt rewrote away is not brought back."""
        n = 0
        if isinstance(tune_dir, (Location, str)):
            tune_dir = Location.of(tune_dir)
            found = [tune_dir / f for f in tune_dir.files()
                     if f.count("/") == 1 and f.endswith("/result.json")]
        else:
            found = sorted(tune_dir.glob("*/result.json"))
        for f in found:
            curve: dict[int, dict[str, Any]] = {}  # one trial's folder, one trial's curve
            for res in tune_results(f):
                tid = res.get("trial_id")
                if not tid or "step" not in res:
                    continue
                row = row_from_result(res, tid)
                step = _key(row)[1]
                rewind(curve, step)
                curve[step] = row
            for row in curve.values():
                if not self._has(row):
                    self._put(row)
                    n += 1
        return n

    # ---- changes ------------------------------------------------------------------------------

    @property
    def rows(self) -> dict[RowKey, dict[str, Any]]:
        """Every row by (trial, step) (a copy of the index)."""
        return {(t, s): r for t, steps in self.trials.items() for s, r in steps.items()}

    def _put(self, row: dict[str, Any], replay: bool = False) -> None:
        """Index a row. With ``replay`` (a row as it arrives, live or replayed from the log in
        order) the trial's later rows go (:func:`rewind`)."""
        t, step = _key(row)
        mine = self.trials.setdefault(t, {})
        last = self._last.get(t, step)
        if replay and step < last:  # rare: scan only then
            rewind(mine, step)
            last = step
        mine[step] = row
        self._last[t] = max(last, step)
        self._dirty.add(t)

    def _has(self, row: dict[str, Any]) -> bool:
        t, step = _key(row)
        return step in self.trials.get(t, {})

    def add(self, row: dict[str, Any]) -> None:
        """Record a row: durable (logged) when this returns."""
        row = json_safe(row)
        with self._lock:
            self._put(row, replay=True)
            self._append({"row": row})
        self.maybe_flush()

    def _apply_mark(self, trial_id: str, status: str, reason: str | None) -> bool:
        mine = self.trials.get(trial_id, {})
        if mine:
            self._dirty.add(trial_id)
        div = max((r for r in mine.values() if r.get("status") == "diverged"),
                  key=lambda r: r.get("step") or 0, default=None)
        if div is not None:  # a diverged trial reads as one, like a failed one: every row
            for row in mine.values():
                row["status"], row["reason"] = "diverged", div.get("reason")
            return True
        pruned = next((r for r in mine.values() if r.get("prune_rule")), None)
        if pruned is not None:  # so does a pruned one, with the rule and values that fired
            cols = {k: pruned.get(k) for k in PRUNE_COLUMNS}
            for row in mine.values():
                row.update(cols, status="pruned", reason=pruned.get("reason"))
            return True
        for row in mine.values():
            cur = row.get("status")
            if cur == "diverged":
                continue
            if cur in (None, "running", "interrupted") or status == "failed":
                row["status"] = status
                if reason:
                    row["reason"] = reason
        return bool(mine)

    def mark(self, trial_id: str, status: str, reason: str | None = None,
             placeholder: dict[str, Any] | None = None) -> None:
        """Set the outcome of a trial's rows; a trial with no row yet gets ``placeholder``."""
        with self._lock:
            if not self._apply_mark(trial_id, status, reason) and placeholder is not None:
                row = dict(placeholder, trial_id=trial_id, status=status, reason=reason,
                           step=0)
                self._put(row)
                self._append({"row": row})
            self._append({"mark": {"trial_id": trial_id, "status": status, "reason": reason}})

    def rows_of(self, trial_id: str) -> dict[int, dict[str, Any]]:
        """A copy of one trial's rows, by step."""
        with self._lock:
            return dict(self.trials.get(trial_id, {}))

    def trial_ids(self, status: str | None = None) -> set[str]:
        with self._lock:
            return {t for t, steps in self.trials.items()
                    if any(status is None or r.get("status") == status
                           for r in steps.values())}

    # ---- the Parquet file ----------------------------------------------------------------------

    def maybe_flush(self) -> None:
        if time.time() - self._last_flush >= self.flush_s:
            self.flush()

    def flush(self, wait: bool = False) -> None:
        """Rewrite results.parquet in the background (or now, with ``wait``)."""
        with self._lock:
            self._last_flush = time.time()
            if self._writer is not None and self._writer.is_alive():
                self._pending = True  # the running write is followed by one more
            else:
                self._writer = threading.Thread(target=self._write_loop, daemon=True,
                                                name="results-writer")
                self._writer.start()
        if wait:
            self.join()

    def join(self) -> None:
        w = self._writer
        if w is not None:
            w.join()

    def _write_loop(self) -> None:
        while True:
            with self._lock:
                self._pending = False
                if self._log is not None:  # rows after this point go to a new segment
                    self._log.close()
                    self._log = None
                covered = self._segments()
                changed = {t: [dict(self.trials[t][s]) for s in sorted(self.trials[t])]
                           for t in self._dirty}
                self._dirty = set()
            try:
                for t, rows in changed.items():  # O(rows of the trials that changed)
                    self._tables[t] = rows_table(rows, self.types)
                try:
                    table = concat_tables(self._tables[t] for t in sorted(self._tables))
                except (pa.ArrowInvalid, pa.ArrowTypeError):  # a column of mixed types
                    table = rows_table((r for t in sorted(self._tables)
                                        for r in self._tables[t].to_pylist()), self.types)
                self._write(self.path, with_provenance(table, provenance()))
                for seg in covered:  # every row they hold is in the file now
                    seg.delete() if self.remote else seg.unlink(missing_ok=True)
            except Exception as e:  # noqa: BLE001 - keep the log; report at the end
                self.write_errors.append(f"{type(e).__name__}: {e}")
            with self._lock:
                if not self._pending:
                    return

    def close(self) -> None:
        self.flush(wait=True)
        if self._log is not None:
            self._log.close()
            self._log = None


class _ObjectLog:
    """The row log on object storage: each record one write-once object, durable when
    ``write`` returns (object storage has no append)."""

    def __init__(self, log_dir: Location, segment: int):
        self.log_dir, self.segment, self.seq = log_dir, segment, 0

    def write(self, line: str) -> None:
        self.seq += 1
        (self.log_dir / f"wal-{self.segment:06d}-{self.seq:08d}.jsonl").write_text(line)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def reconcile(sink: ResultsSink, trials: Iterable[Any], signal: int | None = None) -> None:
    """Set each trial's outcome from Tune's own trial states (covers trials that finished in an
    earlier run, whose statuses a lost file would otherwise leave as 'running'). After a stop
    ``signal`` Tune marks the trials it cut as TERMINATED too: a trial with no outcome yet is
    then ``interrupted``, never ``ok`` (``--resume`` runs it on)."""
    for t in trials:
        status = getattr(t, "status", None)
        if status == "TERMINATED" and signal is not None:
            sink.mark(t.trial_id, "interrupted", f"cut by signal {signal} before its end; "
                      "rerun with --resume to finish it")
        elif status == "TERMINATED":
            sink.mark(t.trial_id, "ok")
        elif status == "ERROR":
            sink.mark(t.trial_id, "failed", error_reason(t))


def recorded_prune(rows: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """The prune columns of a health rule that already fired on these rows (a run before a
    ``--resume``): kept as they are, never relabelled as a scheduler's stop."""
    row = next((r for _, r in sorted(rows.items())
                if r.get("prune_rule") not in (None, "asha")), None)
    return None if row is None else {k: row.get(k) for k in (*PRUNE_COLUMNS, "reason")}


def error_reason(trial: Any) -> str:
    """The last line of a failed trial's error (not a path into Ray's session folder)."""
    path = getattr(trial, "error_file", None) or getattr(trial, "pickled_error_file", None)
    try:
        lines = [x for x in Path(path).read_text(errors="replace").splitlines() if x.strip()]
        return lines[-1][:500] if lines else "trial error"
    except (OSError, TypeError):
        return "trial error"

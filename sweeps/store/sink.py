"""Where the driver keeps a sweep's rows so that nothing reported is ever lost, in bounded
memory at any number of rows: every row and mark goes to a row log (``sweeps.store.wal``) before
Tune's callback returns; a marked trial is *sealed* (its rows written once into an immutable
Parquet part and dropped from memory, read back if it changes again); ``results.parquet`` is
stitched from the parts by a background writer (``sweeps.store.worker``); ``--resume`` rebuilds
from all of these and Tune's records. docs/guarantees.md ("Nothing reported is lost") has the
whole design, docs/storage.md the files, docs/reliability.md the crashes.
"""

from __future__ import annotations

import itertools
import json
import math
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sweeps.store.provenance import provenance
from sweeps.store.results import (
    CORE_COLUMNS,
    PROVENANCE_KEY,
    RESULTS_FILE,
    concat_tables,
    json_safe,
    last_rows,
    read_part,
    read_schema,
    read_table,
    rows_table,
    unify,
    write_stream,
)
from sweeps.store.storage import Location, is_url
from sweeps.store.trial_outcomes import REOPENED, apply_mark, mark_changes
from sweeps.store.trust import UntrustedStateError
from sweeps.store.wal import LocalLog, ObjectLog, Syncer
from sweeps.store.worker import Worker

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


STITCH_FACTOR = 5.0  # results.parquet: rewritten at most every 5x its last rewrite's time
# (so at 10⁶ rows it stays a small share of one core)
STITCH_MIN_S = 2.0  # and every 2 s (a flush with wait: now)
STITCH_S_PER_TRIAL = 0.05
"""And every 0.05 s per trial the sweep has: each rewrite is O(rows), so a fixed period over a
sweep whose length grows with its trials T cost the driver O(T²) CPU (bench/driver_cpu.py); a
period that grows with T keeps it linear, as Tune's state saves (``sweeps.run.driver``)."""
SEAL_BATCH = 64  # marked trials are sealed with a rewrite, or once this many wait
_OPEN = frozenset(REOPENED)  # not sealed on load: --resume may run them on


class ResultsSink:
    """The running trials' rows in memory, a durable log of every change, sealed trials in
    immutable Parquet parts, and a background writer (see the module docstring)."""

    def __init__(self, results_dir: str | Path | Location, flush_s: float = 10.0,
                 types: dict[str, pa.DataType] | None = None):
        loc = Location.of(results_dir) if isinstance(results_dir, Location) or \
            is_url(results_dir) else None
        self.remote = loc is not None and not loc.is_local
        # object storage: every row object, results.parquet and Tune's records are signed as
        # written and verified as read (sweeps.store.signing): an injected row is refused
        self.dir = loc.signed() if self.remote else \
            Path(loc.path if loc is not None else results_dir)
        self.types = types or {}
        self.path = self.dir / RESULTS_FILE
        self.log_dir = self.dir / "rows"
        self.part_dir = self.dir / "parts"
        self.flush_s = flush_s
        self._segment = 0
        self.write_errors: list[str] = []
        self._reset()

    def _reset(self) -> None:
        self._lock, self._worker, self._log = threading.Lock(), None, None
        self._syncer: Syncer | None = None
        self._last_flush = time.time()  # the first rewrite comes flush_s after the start
        self.trials: dict[str, dict[int, dict[str, Any]]] = {}  # running trial → step → row
        self._last: dict[str, int] = {}  # trial → its highest step (a rewind check in O(1))
        self._tables: dict[str, pa.Table] = {}  # running trials', rebuilt only when changed
        self._dirty: set[str] = set()  # running trials whose table is rebuilt whole
        self._fresh: dict[str, list[dict[str, Any]]] = {}  # or only appended to
        self._part_rows: dict[int, int] = {}  # part → rows in it
        self._to_seal: set[str] = set()  # trials marked since the last write
        self._owner: dict[str, int] = {}  # sealed trial → the part holding its rows
        self._part_trials: dict[int, set[str]] = {}  # part → the sealed trials it holds
        self._statuses: dict[str, frozenset] = {}  # every trial → the statuses of its rows
        self._by_status: dict[str, set[str]] = {}  # status → trials with a row of it
        self._part = 0
        self._stitch_s = 0.0
        self._last_stitch = 0.0
        self._force = self._seal_now = False

    # ---- pickling: Tune pickles its callbacks into the experiment state -----------------------

    def __getstate__(self) -> dict[str, Any]:  # where, not what: load() rebuilds the rows
        return {k: self.__dict__[k] for k in ("remote", "dir", "types", "path", "log_dir",
                                              "flush_s", "_segment", "write_errors", "part_dir")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    # ---- the log ---------------------------------------------------------------------------

    def _segments(self) -> list[Any]:
        if self.remote:
            return [self.log_dir / f for f in self.log_dir.files(recursive=False)
                    if f.startswith("wal-") and f.endswith(".jsonl")]
        return sorted(self.log_dir.glob("wal-*.jsonl"))

    def _parts(self) -> list[tuple[int, Any]]:
        if self.remote:
            names = [f for f in self.part_dir.files(recursive=False)  # [] when absent
                     if f.startswith("part-") and f.endswith(".parquet")]
            return sorted((int(f[5:11]), self.part_dir / f) for f in names)
        return sorted((int(p.name[5:11]), p) for p in self.part_dir.glob("part-*.parquet"))

    def _part_path(self, n: int) -> Any:
        return self.part_dir / f"part-{n:06d}.parquet"

    def _open_segment(self) -> None:
        if not self.remote:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        last = [int(p.name[4:10]) for p in self._segments()]  # wal-SSSSSS[-NNNNNNNN].jsonl
        self._segment = max([self._segment, *last]) + 1
        if self.remote:  # one object per record, under the segment's prefix
            self._log = ObjectLog(self.log_dir, self._segment)
        else:
            self._log = LocalLog(self.log_dir / f"wal-{self._segment:06d}.jsonl")
            if self._syncer is None:
                self._syncer = Syncer(lambda: self._log)

    def _append(self, record: dict[str, Any]) -> None:
        if self._log is None:
            self._open_segment()
        self._log.write(json.dumps(record, default=str) + "\n")

    # ---- rebuilding --------------------------------------------------------------------------

    def load(self, tune_dir: str | Path | None = None) -> LoadReport:
        """Rebuild the rows from whatever is durable (see the module docstring)."""
        rep = LoadReport()
        with self._lock:
            for n, part in self._parts():
                rep.from_parquet += self._load_part(n, part, rep)
            if self.path.exists():
                try:
                    table = read_table(self.path)
                    if table is not None and self._owner:  # the unsealed trials' rows only
                        table = table.filter(pc.invert(pc.is_in(
                            table["trial_id"], pa.array(sorted(self._owner), pa.string()))))
                    for r in ([] if table is None else table.to_pylist()):
                        self._put(r)
                        rep.from_parquet += 1
                except UntrustedStateError:  # a forged or unsigned object: never trusted
                    raise
                except Exception as e:  # noqa: BLE001 - any damage: rebuild from the rest
                    rep.problems.append(f"{self.path} is unreadable ({type(e).__name__}); "
                                        "rebuilt from the row log and Tune's records")
            for seg in self._segments():
                rep.from_log += self._replay(seg, rep)
            if tune_dir is not None:
                rep.from_tune = self._from_tune(
                    Location.of(tune_dir).signed() if self.remote else Path(tune_dir), rep)
            self._to_seal |= {t for t in self.trials if not self._statuses[t] & _OPEN}
        return rep

    def _load_part(self, n: int, part: Any, rep: LoadReport) -> int:
        try:
            ids = read_part(part, columns=["trial_id", "status"]).to_pydict()
        except Exception as e:  # noqa: BLE001 - a torn part: its trials come from the log
            rep.problems.append(f"{part} is unreadable ({type(e).__name__}); skipped")
            return 0
        found: dict[str, set] = {}
        for t, st in zip(ids["trial_id"], ids["status"]):
            found.setdefault(t, set()).add(st)
        for t, sts in found.items():
            self._seal(t, n)
            self._set_statuses(t, frozenset(sts))
        self._part = max(self._part, n)
        self._part_rows[n] = len(ids["trial_id"])
        return len(ids["trial_id"])

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
                self._mark_locked(**rec["mark"])
        return n

    def _from_tune(self, tune_dir: Path | Location, rep: LoadReport) -> int:
        """Rows Tune recorded that nothing else kept. A trial's ``result.json`` holds every
        attempt's results in order: it is replayed with the same rewind as the log, so a row
        a later attempt rewrote away is not brought back. A sealed trial is whole already."""
        n = 0
        if isinstance(tune_dir, Location):
            found = [tune_dir / f for f in tune_dir.files()
                     if f.count("/") == 1 and f.endswith("/result.json")]
        else:
            found = sorted(tune_dir.glob("*/result.json"))
        for f in found:
            curve: dict[int, dict[str, Any]] = {}  # one trial's folder, one trial's curve
            for res in tune_results(f):
                tid = res.get("trial_id")
                if not tid or "step" not in res or tid in self._owner:
                    continue
                row = row_from_result(res, tid)
                step = _key(row)[1]
                rewind(curve, step)
                curve[step] = row
            for row in curve.values():
                t, step = _key(row)
                if step not in self.trials.get(t, {}):  # (t is not sealed: skipped above)
                    self._put(row)
                    n += 1
        return n

    # ---- changes ------------------------------------------------------------------------------

    def _set_statuses(self, t: str, new: frozenset) -> None:
        old = self._statuses.get(t, frozenset())
        for s in old - new:
            self._by_status.get(s, set()).discard(t)
        for s in new - old:
            self._by_status.setdefault(s, set()).add(t)
        self._statuses[t] = new

    def _restatus(self, t: str) -> None:
        self._set_statuses(t, frozenset(r.get("status") for r in self.trials.get(t, {}).values()))

    def _seal(self, t: str, n: int) -> None:
        old = self._owner.get(t)
        if old is not None:
            self._part_trials[old].discard(t)
        self._owner[t] = n
        self._part_trials.setdefault(n, set()).add(t)

    def _unseal(self, t: str) -> None:
        """A sealed trial changes again (a restart, a late status): its rows back in memory."""
        n = self._owner.pop(t)
        self._part_trials[n].discard(t)
        rows = read_part(self._part_path(n), {t}).to_pylist()
        self.trials[t] = {_key(r)[1]: r for r in rows}
        self._last[t] = max(self.trials[t], default=0)
        self._dirty.add(t)

    @property
    def rows(self) -> dict[RowKey, dict[str, Any]]:
        """Every row by (trial, step), read back from the parts too: O(rows), for tests and
        small sweeps (the driver never calls it)."""
        return {(t, s): r for t, steps in self.rows_by_trial(self.trial_ids())
                for s, r in steps.items()}

    def _put(self, row: dict[str, Any], replay: bool = False) -> None:
        """Index a row. With ``replay`` (a row as it arrives, live or replayed from the log in
        order) the trial's later rows go (:func:`rewind`)."""
        t, step = _key(row)
        if t in self._owner:
            self._unseal(t)
        self._to_seal.discard(t)
        mine = self.trials.setdefault(t, {})
        last = self._last.get(t, step)
        old = mine.get(step)
        rewound = replay and step < last
        if rewound:  # rare: scan only then
            rewind(mine, step)
            last = step
        mine[step] = row
        self._last[t] = max(last, step)
        if old is not None or rewound or t in self._dirty:
            self._dirty.add(t)  # the trial's table is rebuilt whole
            self._fresh.pop(t, None)
        else:
            self._fresh.setdefault(t, []).append(row)
        if old is not None or rewound or t not in self._statuses:
            self._restatus(t)
        elif row.get("status") not in self._statuses[t]:
            self._set_statuses(t, self._statuses[t] | {row.get("status")})

    def add(self, row: dict[str, Any]) -> None:
        """Record a row: durable (logged) when this returns."""
        row = json_safe(row)
        with self._lock:
            self._put(row, replay=True)
            self._append({"row": row})
        if time.time() - self._last_flush >= self.flush_s:
            self.flush()

    def _mark_locked(self, trial_id: str, status: str, reason: str | None,
                     placeholder: dict[str, Any] | None = None,
                     columns: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """Apply a mark (live, or replayed from the log); the placeholder row it added, if
        any. A marked trial is sealed by the next write."""
        if trial_id in self._owner:
            if not mark_changes(self._statuses.get(trial_id, frozenset()), status):
                return None  # e.g. reconcile's "ok" for a trial sealed as ok: no read back
            self._unseal(trial_id)
        added, mine = None, self.trials.get(trial_id, {})
        if mine:
            self._dirty.add(trial_id)
        if not apply_mark(mine.values(), status, reason, columns) and placeholder is not None:
            added = dict(placeholder, **(columns or {}), trial_id=trial_id, status=status,
                         reason=reason, step=0)
            self._put(added)
        if trial_id in self.trials:
            self._restatus(trial_id)
            self._to_seal.add(trial_id)
        return added

    def mark(self, trial_id: str, status: str, reason: str | None = None,
             placeholder: dict[str, Any] | None = None,
             columns: dict[str, Any] | None = None) -> None:
        """Set a trial's outcome (and ``columns``) on its rows; one with no row yet gets
        ``placeholder``. Durable (fsynced, with every row logged before it) when this returns."""
        with self._lock:
            added = self._mark_locked(trial_id, status, reason, placeholder, columns)
            if added is not None:
                self._append({"row": added})
            mark = {"trial_id": trial_id, "status": status, "reason": reason}
            self._append({"mark": dict(mark, columns=columns) if columns else mark})
            log = self._log
        log.sync()  # outside the lock: rows keep arriving meanwhile (a closed segment: synced)

    def rows_of(self, trial_id: str) -> dict[int, dict[str, Any]]:
        """A copy of one trial's rows, by step (a sealed trial's read from its part)."""
        return dict(self.rows_by_trial([trial_id])).get(trial_id, {})

    def rows_by_trial(self, trial_ids: Iterable[str]) -> Iterator[tuple[str, dict[int, Any]]]:
        """(trial, its rows by step) for each of ``trial_ids`` that has rows, reading each part
        once."""
        want = set(trial_ids)
        with self._lock:
            live = {t: dict(self.trials[t]) for t in want if t in self.trials}
            parts: dict[int, set[str]] = {}
            for t in want - set(live):
                if t in self._owner:
                    parts.setdefault(self._owner[t], set()).add(t)
        yield from live.items()
        for n, ts in sorted(parts.items()):
            by: dict[str, dict[int, Any]] = {}
            for r in read_part(self._part_path(n), ts).to_pylist():
                by.setdefault(r["trial_id"], {})[_key(r)[1]] = r
            yield from by.items()

    def trial_ids(self, status: str | None = None) -> set[str]:
        """Trials with a row (of ``status``): from an index, never a scan of the rows."""
        with self._lock:
            if status is None:
                return set(self._statuses)
            return set(self._by_status.get(status, ()))

    def count(self, status: str) -> int:  # trials with a row of ``status``: O(1)
        with self._lock:
            return len(self._by_status.get(status, ()))

    def tables(self) -> Iterator[pa.Table]:
        """Every row as Arrow tables, one part (or the running trials) at a time."""
        with self._lock:
            parts = {n: set(ts) for n, ts in self._part_trials.items() if ts}
            live = [rows_table([r for _, r in sorted(self.trials[t].items())], self.types)
                    for t in sorted(self.trials)]
        for n, ts in sorted(parts.items()):
            yield read_part(self._part_path(n), ts)
        yield from live

    def final_rows(self) -> list[dict[str, Any]]:
        """The last row (max step) of each trial, one part at a time (each trial lives in one
        part or in memory): O(trials) memory."""
        return [r for t in self.tables() for r in last_rows(t)]

    # ---- the Parquet files ---------------------------------------------------------------------

    def flush(self, wait: bool = False, rewrite: bool = True) -> None:
        """Seal the marked trials and (when due) rewrite results.parquet, in the background (or
        now, with ``wait``: the rewrite too, unless not ``rewrite``)."""
        with self._lock:
            self._last_flush = time.time()
            self._force = self._force or (wait and rewrite)
            self._seal_now = self._seal_now or wait
            if self._worker is None:  # one writer thread, woken (never started) per flush
                self._worker = Worker(self._write_loop, "results-writer")
        ticket = self._worker.kick()
        wait and self._worker.wait(ticket)

    def join(self) -> None:
        self._worker is not None and self._worker.wait()

    def _write_loop(self) -> None:
        with self._lock:
            # rows after this point go to a new segment; the old one is fsynced and
            # closed below, outside the lock (as the folder's listing: short holds)
            old, self._log, last = self._log, None, self._segment
            changed = {t: [dict(r) for _, r in sorted(self.trials[t].items())]
                       for t in self._dirty if t in self.trials}  # rare: marks, rewinds
            fresh = {t: rows for t, rows in self._fresh.items()  # appended rows: O(1) here
                     if t in self.trials and t not in changed}
            self._dirty, self._fresh = set(), {}
            due = self._force or time.time() - self._last_stitch >= self._stitch_period()
            seal = due or self._seal_now or len(self._to_seal) >= SEAL_BATCH
            sealing = sorted(self._to_seal & set(self.trials)) if seal else []
            self._to_seal -= set(sealing)
            self._force = self._seal_now = False
        try:
            old is not None and old.close()
            covered = [p for p in self._segments() if int(p.name[4:10]) <= last]
            self._write_once(changed, fresh, sealing, due, covered)
        except Exception as e:  # noqa: BLE001 - keep the log; report at the end
            self.write_errors.append(f"{type(e).__name__}: {e}")
            with self._lock:  # sealed next time
                self._to_seal |= {t for t in sealing if t in self.trials}

    def _stitch_period(self) -> float:
        """Seconds between two rewrites of results.parquet (a flush with wait: now)."""
        return max(STITCH_MIN_S, STITCH_FACTOR * self._stitch_s,
                   STITCH_S_PER_TRIAL * len(self._statuses))

    def _write_once(self, changed: dict[str, list[dict[str, Any]]],
                    fresh: dict[str, list[dict[str, Any]]], sealing: list[str], due: bool,
                    covered: list[Any]) -> None:
        for t, rows in changed.items():  # O(rows of the trials that changed)
            self._tables[t] = rows_table(rows, self.types)
        for t, rows in fresh.items():  # O(new rows)
            new = rows_table(rows, self.types)
            self._tables[t] = concat_tables([self._tables[t], new]) if t in self._tables else new
        if sealing:
            tabs = [self._tables[t] for t in sealing if t in self._tables]
            n = self._part + 1
            write_stream(self._part_path(n), unify([x.schema for x in tabs]), tabs)
            self._part, self._part_rows[n] = n, sum(x.num_rows for x in tabs)
            with self._lock:
                for t in sealing:
                    if t in self._dirty or t in self._fresh or t in self._owner or \
                            t not in self.trials:
                        continue  # changed since (a restart): stays in memory
                    self._seal(t, n)
                    del self.trials[t]
                    self._last.pop(t, None)
                    self._tables.pop(t, None)
        self._compact()
        if not due:
            return
        t0 = time.perf_counter()
        with self._lock:
            parts = {n: set(ts) for n, ts in self._part_trials.items() if ts}
            live = [self._tables[t] for t in sorted(self._tables) if t in self.trials]
        schemas = [read_schema(self._part_path(n)) for n in sorted(parts)]
        schema = unify(schemas + [x.schema for x in live]) if schemas or live else \
            rows_table([], self.types).schema
        write_stream(self.path, schema, itertools.chain(  # one part in memory at a time
            (read_part(self._part_path(n), ts) for n, ts in sorted(parts.items())), live),
            metadata={PROVENANCE_KEY: json.dumps(provenance()).encode()})
        for seg in covered:  # every row they hold is in a part or in the file now
            seg.delete() if self.remote else seg.unlink(missing_ok=True)
        self._stitch_s = time.perf_counter() - t0
        self._last_stitch = time.time()

    def _compact(self) -> None:
        """Merge 4 parts of one size tier (rows within a factor of 4) into one, dropping the
        rows of trials read back since: O(rows log rows) over a sweep, and few files."""
        tiers: dict[int, list[int]] = {}
        for n, k in self._part_rows.items():
            tiers.setdefault(int(math.log(max(k, 1), 4)), []).append(n)
        group = next((sorted(ns)[:4] for _, ns in sorted(tiers.items()) if len(ns) >= 4), None)
        if group is None:
            return
        with self._lock:
            owned = {n: set(self._part_trials.get(n, ())) for n in group}
        keep = [n for n in group if owned[n]]
        m = self._part + 1
        counted = [0]

        def tables() -> Iterator[pa.Table]:
            for n in keep:
                tab = read_part(self._part_path(n), owned[n])
                counted[0] += tab.num_rows
                yield tab

        if keep:
            write_stream(self._part_path(m), unify([read_schema(self._part_path(n))
                                                    for n in keep]), tables())
            self._part, self._part_rows[m] = m, counted[0]
        with self._lock:
            for n in group:
                for t in owned[n]:
                    if self._owner.get(t) == n:
                        self._seal(t, m)
                self._part_trials.pop(n, None)
                self._part_rows.pop(n, None)
        for n in group:
            p = self._part_path(n)
            p.delete() if self.remote else p.unlink(missing_ok=True)

    def close(self) -> None:
        self.flush(wait=True)
        if self._log is not None:
            self._log, _ = None, self._log.close()
        for th in (self._syncer, self._worker):
            th is not None and th.stop()
        self._syncer = self._worker = None

"""Results sink at scale: what the driver holds and what a reported row costs it, at 10⁵ and
10⁶ rows (rows of a realistic width: the upcycle_lr trial's ~90 config, knob and metric columns,
100 evals per trial).

For each size N:
1. the sweep so far: N rows of N/100 finished trials in sealed Parquet parts of 10⁴ rows, as a
   resumed driver finds them; ``resume_load_s``: the sink's ``load`` (trial ids and statuses);
2. ``traced_bytes_per_row``: what the sink holds in Python objects after the load
   (tracemalloc), per row; ``rss_mib`` / ``bytes_per_row``: the process's resident memory after
   the load over before (allocator slack and Arrow's pool included; noisy at small sizes);
3. the live phase: 16 running trials report ``--adds`` rows through ``ResultsSink.add`` (logged;
   group-committed, ``sweeps.store.wal``; ``--commit each`` fsyncs every add, as before), one
   trial ends (``mark``, which fsyncs, + ``flush``, as the driver does) every 50 rows, with
   ``flush_s`` 0.05 so the writer keeps sealing, merging parts and rewriting ``results.parquet``
   meanwhile; ``add_ms`` p50 / p99 / max wall, ``add_own_ms_max`` (wall less the calling
   thread's wait for a core, from its ``/proc`` schedstat: the sink's own share) and
   ``add_cpu_ms_max`` (the calling thread's CPU: on a loaded machine the wall time is mostly
   waiting for a core), a histogram of the adds' wall times, and each add slower than
   ``SLOW_MS`` with its wait for a core and what ran meanwhile (GC pauses, the writer's steps,
   fsyncs, holds of the sink's lock: ``Trace``), ``end_ms_max`` (mark +
   flush) and ``index_us`` (the progress line's ``count``); ``control_ms``: the same number of
   fsynced lines written with no sink and no writer thread, the machine's own floor, and
   ``control_flush_ms``: the same lines only written and flushed (a group-committed add's);
4. ``stitch_s``: one rewrite of ``results.parquet`` (every row, streamed part by part), and
   its row count against N + the live rows;
5. ``reload_s``: a new sink rebuilding from disk (``load``, a ``--resume``), and the rows it
   accounts for.

    python bench/results_sink.py [--sizes 100000,1000000] [--adds 2000] [--commit group|each]
Prints each figure side by side per size with the ratio of the largest size to the smallest;
ends with one JSON line.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import statistics
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq

import sweeps.store.sink as sk
from moe_core.train import train_config_from_dict
from moe_core.train.config import load_yaml
from sweeps.store.results import config_columns, knob_columns, rows_table, write_stream
from sweeps.store.sink import ResultsSink

EVALS = 100
LIVE = 16
SLOW_MS = 10.0  # an add this slow is listed with what ran meanwhile
BUCKETS = (0.1, 1, 5, 10, 20, 50, 100)  # ms: the add-latency histogram's upper edges


class Trace:
    """What ran while an add was slow: (name, thread, t0, t1) spans of GC pauses
    (``gc.callbacks``), the writer's steps, the log's fsyncs and every hold of the sink's lock
    outside the calling thread (each wrapped)."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str, float, float]] = []
        self._gc0 = 0.0
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc0 = time.perf_counter()
        else:
            self.spans.append((f"gc{info['generation']}", threading.current_thread().name,
                               self._gc0, time.perf_counter()))

    def wrap(self, owner: object, name: str, least_s: float = 0.0) -> None:
        f = getattr(owner, name)

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                t1 = time.perf_counter()
                t1 - t0 >= least_s and self.spans.append(
                    (name, threading.current_thread().name, t0, t1))
        setattr(owner, name, timed)

    def lock(self, lock: threading.Lock) -> object:
        trace = self

        class Held:  # the sink's lock, its holds by other threads recorded
            def __enter__(self):
                t = time.perf_counter()
                lock.acquire()
                self.t0 = time.perf_counter()
                if self.t0 - t > 1e-3:  # a wait for the lock
                    trace.spans.append(("lock-wait", threading.current_thread().name, t,
                                        self.t0))

            def __exit__(self, *exc):
                name = threading.current_thread().name
                name != "MainThread" and trace.spans.append(("lock", name, self.t0,
                                                             time.perf_counter()))
                lock.release()

            def acquire(self, *a):
                return lock.acquire(*a)

            def release(self):
                lock.release()
        return Held()

    def during(self, t0: float, t1: float) -> list[str]:
        """The spans that overlap [t0, t1], longest first, as 'name@thread ms'."""
        hit = sorted((s for s in self.spans if s[2] < t1 and s[3] > t0),
                     key=lambda s: s[2] - s[3])
        return [f"{n}@{th} {(b - a) * 1e3:.1f}" for n, th, a, b in hit[:6]]

    def close(self) -> None:
        gc.callbacks.remove(self._gc)


def traced() -> Trace:
    import sweeps.store.wal as wal

    tr = Trace()
    for name in ("write_stream", "read_part", "read_schema", "rows_table", "concat_tables"):
        tr.wrap(sk, name)
    for name in ("_compact", "_write_once", "_segments"):
        tr.wrap(ResultsSink, name)
    tr.wrap(wal.LocalLog, "sync")
    tr.wrap(wal.LocalLog, "close")
    for owner, name in ((wal.LocalLog, "write"), (ResultsSink, "flush"), (sk, "json_safe"),
                        (ResultsSink, "_put")):  # an add's own steps, when one is slow
        tr.wrap(owner, name, least_s=1e-3)
    return tr


def histogram(lat: list[float]) -> dict:
    edges = (*BUCKETS, math.inf)
    return {f"<{e:g}ms" if e != math.inf else f">={BUCKETS[-1]:g}ms":
            sum(1 for x in lat if lo <= x < e) for lo, e in zip((0, *BUCKETS), edges)}


def template() -> dict:
    cfg = train_config_from_dict(load_yaml("search_spaces/upcycle_lr.yaml")["base"])
    row = {"sweep": "bench", "status": "running", "reason": None, "parent_key": "0" * 16,
           "kind": "upcycled", "seed": 0, "N1": 10**6, "N2": 10**6, "N_total": 4 * 10**6,
           "D1": 10**6, "ranks": 1, "parent_val_loss": 2.0, "lr": 1e-3, "train_loss": 2.0,
           "val_loss": 2.0, "aux_loss": 0.01, "wall_s": 1.0, "flops": 1e12}
    row.update(config_columns(cfg.to_dict()))
    row.update(knob_columns({"upcycle.lr_policy": {"policy": "reset", "peak": 3e-3}}))
    row.update({f"router.{k}": 0.5 for k in ("max_load", "min_load", "drop_rate", "entropy",
                                              "max1_max2", "max2_max3", "expert_similarity")})
    return row


def row(base: dict, trial: int, step: int) -> dict:
    return dict(base, trial_id=f"t{trial:07d}", step=step, tokens=step * 1000, D2=step * 1000,
                val_loss=2.0 + 1.0 / (1 + step) + trial * 1e-9)


def history(d: Path, base: dict, trials: int) -> None:
    """The sweep so far as a resumed driver finds it: ``trials`` finished trials' rows sealed in
    parts of 100 trials (10⁴ rows) each, written column-wise (a bench shortcut: the sink writes
    the same files one sealed batch at a time)."""
    per = min(100, trials)
    block = rows_table([dict(row(base, t, s), status="ok") for t in range(per)
                        for s in range(EVALS)], None)
    i = block.column_names.index("trial_id")
    for k, first in enumerate(range(0, trials, per)):
        ids = pa.array([f"t{first + t:07d}" for t in range(per) for _ in range(EVALS)])
        part = block.set_column(i, "trial_id", ids)
        write_stream(d / "parts" / f"part-{k + 1:06d}.parquet", part.schema, [part])


def runq_ms(stat) -> float:
    """The calling thread's time waiting for a core so far (schedstat: run, wait, slices)."""
    stat.seek(0)
    return int(stat.read().split()[1]) / 1e6


def live_phase(sink: ResultsSink, base: dict, first: int, adds: int, tr: Trace) -> dict:
    lat, cpu, ends, idx, at, runq = [], [], [], [], [], []
    stat = open(f"/proc/self/task/{threading.get_native_id()}/schedstat")  # noqa: SIM115
    trials = list(range(first, first + LIVE))
    step = {t: 0 for t in trials}
    nxt = first + LIVE
    for i in range(adds):
        t = trials[i % LIVE]
        r = row(base, t, step[t])
        q0 = runq_ms(stat)
        t0, c0 = time.perf_counter(), time.thread_time()
        sink.add(r)
        at.append((t0, time.perf_counter()))
        runq.append(runq_ms(stat) - q0)
        lat.append((at[-1][1] - t0) * 1e3)
        cpu.append((time.thread_time() - c0) * 1e3)
        step[t] += 1
        if i % 50 == 49:  # a trial ends: the driver's on_trial_complete
            done = trials.pop(0)
            t0 = time.perf_counter()
            sink.mark(f"t{done:07d}", "ok")
            sink.flush()
            ends.append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            sink.count("failed")
            idx.append((time.perf_counter() - t0) * 1e6)
            trials.append(nxt)
            step[nxt] = 0
            nxt += 1
    sink.join()
    slow = sorted(range(adds), key=lambda i: -lat[i])[:8]
    return {"add_hist": histogram(lat), "slow_adds": [
        {"i": i, "ms": round(lat[i], 1), "cpu_ms": round(cpu[i], 2),
         "runq_ms": round(runq[i], 1), "during": tr.during(*at[i])}
        for i in slow if lat[i] >= SLOW_MS],
            "add_own_ms_max": max(a - q for a, q in zip(lat, runq)),
            "add_ms_p50": statistics.median(lat),
            "add_ms_p99": sorted(lat)[int(0.99 * len(lat))], "add_ms_max": max(lat),
            "add_cpu_ms_max": max(cpu), "end_ms_max": max(ends), "index_us": max(idx),
            "trials_total": sum(1 for k in step.values() if k) + first}


def control(d: Path, base: dict, adds: int, fsync: bool = True) -> dict:
    """The machine's floor: the same number of log lines of the same rows, with no sink and no
    writer thread, each fsynced (``control_ms``: the floor of an add that fsyncs, on a loaded
    machine most of its worst wall time) or only written and flushed (``control_flush_ms``: the
    floor of a group-committed add)."""
    lat = []
    with open(d / "control.jsonl", "a") as f:
        for i in range(adds):
            line = json.dumps(row(base, i, i), default=str) + "\n"
            t0 = time.perf_counter()
            f.write(line)
            f.flush()
            fsync and os.fsync(f.fileno())
            lat.append((time.perf_counter() - t0) * 1e3)
    k = "control_ms" if fsync else "control_flush_ms"
    return {f"{k}_p99": sorted(lat)[int(0.99 * len(lat))], f"{k}_max": max(lat)}


def fsync_each_add() -> None:
    """The sink before group commit: every ``add`` fsyncs its line before it returns."""
    import sweeps.store.wal as wal

    write = wal.LocalLog.write

    def write_and_sync(self, line: str) -> None:
        write(self, line)
        self.sync()

    wal.LocalLog.write = write_and_sync


def measure(n: int, base: dict, adds: int) -> dict:
    d = Path(tempfile.mkdtemp(prefix="sink-bench-"))
    proc = psutil.Process()
    trials = max(1, n // EVALS)
    history(d, base, trials)
    gc.collect()
    rss0 = proc.memory_info().rss
    tracemalloc.start()
    sink = ResultsSink(d, flush_s=0.05)
    t0, c0 = time.perf_counter(), time.process_time()
    sink.load()  # a --resume: the parts' trial ids and statuses only
    out = {"rows": trials * EVALS, "resume_load_s": time.perf_counter() - t0,
           "resume_load_cpu_s": time.process_time() - c0,
           "traced_bytes_per_row": tracemalloc.get_traced_memory()[0] / (trials * EVALS)}
    tracemalloc.stop()
    gc.collect()
    rss = proc.memory_info().rss - rss0
    out.update(rss_mib=rss / 2**20, bytes_per_row=rss / (trials * EVALS),
               in_memory_rows=sum(len(v) for v in sink.trials.values()))
    tr = traced()
    sink._lock = tr.lock(sink._lock)
    out.update(live_phase(sink, base, trials, adds, tr))
    tr.close()
    out.update(control(d, base, adds))
    out.update(control(d, base, adds, fsync=False))
    t0 = time.perf_counter()
    sink.close()
    out["stitch_s"] = time.perf_counter() - t0
    in_file = pq.ParquetFile(d / "results.parquet").metadata.num_rows
    # every row reported: the history, every ended trial's rows and the running ones'
    out["file_rows_ok"] = in_file == out["rows"] + adds
    back = ResultsSink(d)
    t0 = time.perf_counter()
    back.load()
    out["reload_s"] = time.perf_counter() - t0
    out["reload_rows_ok"] = sum(len(r) for _, r in back.rows_by_trial(
        back.trial_ids())) == in_file and len(back.trial_ids()) == out["trials_total"]
    out["load_1m"] = os.getloadavg()[0]
    out["parquet_mib"] = sum(p.stat().st_size for p in d.rglob("*.parquet")) / 2**20
    shutil.rmtree(d, ignore_errors=True)
    return out


ORDER = ("rows", "resume_load_s", "resume_load_cpu_s", "traced_bytes_per_row", "rss_mib",
         "bytes_per_row",
         "in_memory_rows", "add_ms_p50", "add_ms_p99", "add_ms_max", "add_own_ms_max",
         "add_cpu_ms_max",
         "control_ms_p99", "control_ms_max", "control_flush_ms_p99", "control_flush_ms_max",
         "end_ms_max", "index_us", "stitch_s", "reload_s", "parquet_mib", "file_rows_ok",
         "reload_rows_ok", "load_1m")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--adds", type=int, default=2000)
    ap.add_argument("--commit", choices=("group", "each"), default="group",
                    help="each: fsync every add before it returns (the sink before group "
                         "commit), for a side-by-side run")
    args = ap.parse_args()
    if args.commit == "each":
        fsync_each_add()
    # rewrite results.parquet during the live phase as often as the time rules allow (a real
    # sweep of 10⁴ trials would wait 0.05 s per trial between rewrites): an add's worst case
    sk.STITCH_S_PER_TRIAL = 0.0
    base = template()
    sizes = [int(x) for x in args.sizes.split(",")]
    res = {}
    for n in sizes:
        res[n] = measure(n, base, args.adds)
        print(f"{n:>9,} rows measured", flush=True)
    lo, hi = res[sizes[0]], res[sizes[-1]]
    print(f"{'':>16}" + "".join(f"{n:>14,}" for n in sizes) + f"{'ratio':>10}")
    for n in sizes:
        print(f"{n:,} rows: add latency histogram {res[n]['add_hist']}")
        for s in res[n]["slow_adds"]:
            print(f"  slow add #{s['i']}: {s['ms']} ms (cpu {s['cpu_ms']}, waiting for a core "
                  f"{s['runq_ms']} ms) during {s['during']}")
    for k in ORDER:
        vals = "".join(f"{res[n][k]:>14.3f}" if isinstance(res[n][k], float) else
                       f"{str(res[n][k]):>14}" for n in sizes)
        ratio = hi[k] / lo[k] if not isinstance(lo[k], bool) and lo[k] else None
        print(f"{k:>16}{vals}{'' if ratio is None else f'{ratio:>10.2f}'}")
    print(json.dumps({"bench": "results_sink", "commit": args.commit,
                      "columns": len(base) + 5,
                      "results": {str(k): {kk: round(vv, 4) if isinstance(vv, float) else vv
                                           for kk, vv in v.items()} for k, v in res.items()}}))


if __name__ == "__main__":
    main()

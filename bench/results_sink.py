"""Results sink: what a reported row costs the driver at 10², 10⁴ and 10⁶ rows, side by side
with the previous design (the whole Parquet file rewritten on Tune's event loop).

For each size N (rows of a realistic width: the upcycle_lr trial's ~80 config, knob and metric
columns, 100 evals per trial) it measures
- ``add_ms``: the time of ``ResultsSink.add`` (the only work on Tune's event loop: a row into
  memory and one fsynced line into the log), p50 / p99 / max over 200 rows reported while the
  background writer keeps rewriting the file;
- ``rewrite_s``: one background rewrite after new rows of one trial (only that trial's table is
  rebuilt; the file is then concatenated and written in C++);
- ``old_flush_s``: the previous design's flush, ``write_rows`` of every row, which ran on the
  event loop every 10 s.

    python bench/results_sink.py [--sizes 100,10000,1000000]
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from moe_core.train import train_config_from_dict
from moe_core.train.config import load_yaml
from sweeps.store.results import config_columns, knob_columns, write_rows
from sweeps.store.sink import ResultsSink

EVALS = 100


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


def rows_for(base: dict, trial: int, steps: range) -> list[dict]:
    return [dict(base, trial_id=f"t{trial:06d}", step=s, tokens=s * 1000, D2=s * 1000)
            for s in steps]


def measure(n: int, base: dict, old: bool) -> dict:
    d = Path(tempfile.mkdtemp(prefix="sink-bench-"))
    sink = ResultsSink(d, flush_s=0.05)
    trials = max(1, n // EVALS)
    for t in range(trials):  # the sweep so far (bulk-loaded, as a resume would)
        for r in rows_for(base, t, range(min(EVALS, n))):
            sink._put(r)
    t0 = time.perf_counter()
    sink.flush(wait=True)
    full = time.perf_counter() - t0
    lat = []
    for i in range(200):  # two live trials report while the writer keeps rewriting
        r = rows_for(base, trials + i % 2, range(EVALS + i, EVALS + i + 1))[0]
        t = time.perf_counter()
        sink.add(r)
        lat.append((time.perf_counter() - t) * 1e3)
    sink.join()
    sink.add(rows_for(base, trials, range(10**6, 10**6 + 1))[0])
    t0 = time.perf_counter()
    sink.flush(wait=True)
    rewrite = time.perf_counter() - t0
    out = {"rows": len(sink.rows), "add_ms_p50": statistics.median(lat),
           "add_ms_p99": sorted(lat)[int(0.99 * len(lat))], "add_ms_max": max(lat),
           "first_write_s": full, "rewrite_s": rewrite}
    if old:
        allrows = sorted(sink.rows.values(), key=lambda r: (r["trial_id"], r["step"]))
        t0 = time.perf_counter()
        write_rows(d / "old.parquet", allrows)
        out["old_flush_s"] = time.perf_counter() - t0
        out["old_flush_vs_add_max"] = out["old_flush_s"] * 1e3 / out["add_ms_max"]
    sink.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="100,10000,1000000")
    ap.add_argument("--skip-old-above", type=int, default=10**6,
                    help="skip the old design's flush above this many rows (it is slow)")
    args = ap.parse_args()
    base = template()
    res = {}
    for n in (int(x) for x in args.sizes.split(",")):
        r = measure(n, base, old=n <= args.skip_old_above)
        res[n] = r
        line = (f"{n:>9,} rows: add p50 {r['add_ms_p50']:.2f} ms, p99 {r['add_ms_p99']:.2f} ms, "
                f"max {r['add_ms_max']:.1f} ms; background rewrite {r['rewrite_s']:.2f} s "
                f"(first write {r['first_write_s']:.2f} s)")
        if "old_flush_s" in r:
            line += (f"; old design: {r['old_flush_s']:.2f} s on the event loop per flush "
                     f"({r['old_flush_vs_add_max']:.0f}x the worst add)")
        print(line, flush=True)
    print(json.dumps({"bench": "results_sink", "columns": len(base) + 5,
                      "results": {str(k): {kk: round(vv, 4) for kk, vv in v.items()}
                                  for k, v in res.items()}}))


if __name__ == "__main__":
    main()

"""The sweep driver's own CPU against the number of trials T: T tiny simulated trials (each
reports one loss of ``sweeps.testing.simulate.SimulatedStudy``, no training) through the
driver's real Tune set-up (``sweeps.run.driver._tuner`` with its results callback, sink and run
config), on a local Ray. Measures the driver process's CPU time (``time.process_time``: Ray's
workers and daemons are other processes) of ``Tuner.fit`` per T, split into Tune's loop (the
main thread, ``time.thread_time``), the results sink's background writer threads, and the rest
(Ray's core-worker threads in the driver process), and fits a + b·T + c·T² to each by least
squares, with each coefficient's standard error (is c zero within it?).

    python bench/driver_cpu.py [--trials 16,32,64,128,256,512] [--profile T]
Ends with one JSON line (the CPU per T and the fit). ``--profile T`` prints the driver's top
functions by cumulative time at that T instead.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import tempfile
import time
from pathlib import Path

import numpy as np
import ray
from ray import tune

from sweeps.plan.build import build_plan
from sweeps.run import driver
from sweeps.spec.sweep import parse_spec
from sweeps.store.sink import ResultsSink
from sweeps.testing.simulate import SimulatedStudy

STUDY = SimulatedStudy(sigma=0.01, seed=0)


def trainable(config: dict) -> None:
    lr = float(config.get("optim.lr", 1e-3))
    loss = STUDY.loss({"D1": 1e9, "D2": 1e10 * (1 + 1e3 * lr)})
    tune.report({"val_loss": loss, "train_loss": loss, "step": 1, "tokens": 1000,
                 "status": "running"})


def spec_for(trials: int, results: Path):
    return parse_spec({
        "sweep": f"cpu{trials}", "results": str(results),
        "base": {"model": {"preset": "debug"},
                 "data": {"source": "synthetic", "synthetic_vocab": 32,
                          "synthetic_tokens": 60000, "seq_len": 32},
                 "batch": {"global_batch": 8, "micro_batch": 8}, "tokens": 512},
        "search": {"optim.lr": {"grid": [1e-4 * (i + 1) for i in range(trials)]}},
        "resources": {"cpus": 0.5, "gpus": 0},
        "logging": {"wandb": {"enabled": False}},
    })


WRITER_CPU = [0.0]
"""CPU of the results sink's background writer threads (``ResultsSink._write_loop``)."""


def _count_writer_cpu() -> None:
    loop = ResultsSink._write_loop

    def timed(self) -> None:
        c0 = time.thread_time()
        try:
            loop(self)
        finally:
            WRITER_CPU[0] += time.thread_time() - c0

    ResultsSink._write_loop = timed


def run(trials: int, tmp: Path) -> dict[str, float]:
    spec = spec_for(trials, tmp / f"r{trials}")
    plan = build_plan(spec)
    res = driver.results_location(spec, False)
    driver._local(res).mkdir(parents=True, exist_ok=True)
    train = tune.with_resources(trainable, {"cpu": 0.5})
    conc = driver._concurrency(spec, None)
    tuner = driver._tuner(spec, plan, train, res, driver._callbacks(spec, plan, res, None),
                          conc, False, False)
    t0, m0, w0, wall0 = time.process_time(), time.thread_time(), WRITER_CPU[0], time.time()
    settings = getattr(driver, "tune_settings", None)  # absent before: Tune's defaults
    with (settings(conc, trials) if settings else driver.pending_trials(conc)):
        grid = tuner.fit()
    cpu, main_cpu = time.process_time() - t0, time.thread_time() - m0
    assert len(grid) == trials and grid.num_errors == 0, (len(grid), grid.num_errors)
    writer = WRITER_CPU[0] - w0
    return {"cpu": cpu, "main": main_cpu, "writer": writer, "other": cpu - main_cpu - writer,
            "wall": time.time() - wall0}


def quadratic_fit(x: list[int], y: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """Least squares y ≈ c·x² + b·x + a: (c, b, a) and their standard errors (the unscaled
    covariance times the residual variance on N − 3 degrees of freedom; NaN with N ≤ 3)."""
    coef, cov = np.polyfit(x, y, 2, cov="unscaled")
    dof = len(x) - 3
    if dof <= 0:
        return coef, np.full(3, np.nan)
    resid = np.asarray(y) - np.polyval(coef, x)
    return coef, np.sqrt(np.diag(cov) * float(resid @ resid) / dof)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", default="16,32,64,128,256,512")
    ap.add_argument("--profile", type=int, default=None)
    args = ap.parse_args()
    os.environ.setdefault("WANDB_MODE", "disabled")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False,
             log_to_driver=False)
    tmp = Path(tempfile.mkdtemp(prefix="driver-cpu-"))
    if args.profile:
        prof = cProfile.Profile(time.process_time)
        prof.runcall(run, args.profile, tmp)
        top = int(os.environ.get("PROFILE_TOP", "40"))
        pstats.Stats(prof).sort_stats("cumulative").print_stats(top)
        return
    _count_writer_cpu()
    ts = [int(x) for x in args.trials.split(",")]
    by = {}
    for t in ts:
        by[t] = run(t, tmp)
        r = by[t]
        print(f"T={t:4d}: driver CPU {r['cpu']:7.2f} s ({r['cpu'] / t * 1e3:.1f} ms per trial; "
              f"Tune's loop {r['main']:.2f}, sink writer {r['writer']:.2f}, Ray's threads and "
              f"the rest {r['other']:.2f}; wall {r['wall']:.0f} s)", flush=True)
    cpu = {t: by[t]["cpu"] for t in ts}
    fits = {}
    for part in ("cpu", "main", "writer", "other"):
        (c, b, a), (se_c, se_b, se_a) = quadratic_fit(ts, [by[t][part] for t in ts])
        fits[part] = {"a": a, "b": b, "c": c, "se_a": se_a, "se_b": se_b, "se_c": se_c}
        print(f"fit {part:>6}: ({a:.3g} ± {se_a:.2g}) + ({b:.3g} ± {se_b:.2g})·T + "
              f"({c:.3g} ± {se_c:.2g})·T²  (at T={ts[-1]}: T² term {c * ts[-1] ** 2:.1f} s "
              f"of {by[ts[-1]][part]:.1f} s; c/se {c / se_c:.1f})")
    for lo, hi in zip(ts, ts[1:]):
        print(f"T {lo} -> {hi}: CPU x{cpu[hi] / cpu[lo]:.2f} for x{hi / lo:g} trials")
    a, b, c = fits["cpu"]["a"], fits["cpu"]["b"], fits["cpu"]["c"]
    print(json.dumps({"bench": "driver_cpu", "load_1m": os.getloadavg()[0],
                      "cpu_s": {str(t): round(v, 3) for t, v in cpu.items()},
                      "parts_s": {str(t): {k: round(v, 3) for k, v in by[t].items()} for t in ts},
                      "fit": {"a": a, "b": b, "c": c}, "fits": fits,
                      "state_save_period": "scaled" if hasattr(driver, "tune_settings") else
                      "tune default (auto)"}))
    ray.shutdown()


if __name__ == "__main__":
    main()

"""The sweep driver's own CPU against the number of trials T: T tiny simulated trials (each
reports one loss of ``sweeps.testing.simulate.SimulatedStudy``, no training) through the
driver's real Tune set-up (``sweeps.run.driver._tuner`` with its results callback, sink and run
config), on a local Ray. Measures the driver process's CPU time (``time.process_time``: Ray's
workers and daemons are other processes) of ``Tuner.fit`` per T, and fits a + b·T + c·T² by
least squares.

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


def run(trials: int, tmp: Path) -> float:
    spec = spec_for(trials, tmp / f"r{trials}")
    plan = build_plan(spec)
    res = driver.results_location(spec, False)
    driver._local(res).mkdir(parents=True, exist_ok=True)
    train = tune.with_resources(trainable, {"cpu": 0.5})
    conc = driver._concurrency(spec, None)
    tuner = driver._tuner(spec, plan, train, res, driver._callbacks(spec, plan, res, None),
                          conc, False, False)
    t0 = time.process_time()
    settings = getattr(driver, "tune_settings", None)  # absent before: Tune's defaults
    with (settings(conc, trials) if settings else driver.pending_trials(conc)):
        grid = tuner.fit()
    cpu = time.process_time() - t0
    assert len(grid) == trials and grid.num_errors == 0, (len(grid), grid.num_errors)
    return cpu


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
    ts = [int(x) for x in args.trials.split(",")]
    cpu = {}
    for t in ts:
        cpu[t] = run(t, tmp)
        print(f"T={t:4d}: driver CPU {cpu[t]:7.2f} s ({cpu[t] / t * 1e3:.1f} ms per trial)",
              flush=True)
    c, b, a = np.polyfit(ts, [cpu[t] for t in ts], 2)
    print(f"fit: {a:.3g} + {b:.3g}·T + {c:.3g}·T²  (at T={ts[-1]}: T² term "
          f"{c * ts[-1] ** 2:.1f} s of {cpu[ts[-1]]:.1f} s)")
    print(json.dumps({"bench": "driver_cpu", "cpu_s": {str(t): round(v, 3) for t, v in cpu.items()},
                      "fit": {"a": a, "b": b, "c": c},
                      "state_save_period": "scaled" if hasattr(driver, "tune_settings") else
                      "tune default (auto)"}))
    ray.shutdown()


if __name__ == "__main__":
    main()

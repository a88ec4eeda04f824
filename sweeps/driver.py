"""The sweep driver: Ray start-up, shared parents and stable runs, the Tuner, results, summary.

Every trial comes from the ``SweepPlan`` built once before Ray starts; the parents and WSD
stable runs are prepared first (``sweeps.parents``), then Ray Tune runs the trials
(``sweeps.trainable``) and ``ResultsCallback`` keeps ``results.parquet`` (``sweeps.results``).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import ray
from ray import tune

from moe_core.errors import SearchSpaceError
from sweeps import console, faults
from sweeps.parents import train_parents, train_stables
from sweeps.plan import SweepPlan
from sweeps.results import (
    CORE_COLUMNS,
    RESULTS_FILE,
    STATIC_COLUMNS,
    config_columns,
    final_rows,
    knob_columns,
    read_rows,
    summarize,
    write_rows,
    write_summary,
)
from sweeps.spec import SweepSpec
from sweeps.trainable import run_trial

PASS_ENV = ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DIR", "UPCYCLE_CACHE", faults.FAIL_ONCE_ENV,
            "OMP_NUM_THREADS")
_CORE = frozenset(CORE_COLUMNS)


class ResultsCallback(tune.Callback):
    """Collects every reported row into the sweep's Parquet file (atomic rewrites), marks trial
    outcomes, and prints progress with the best metric so far and an ETA."""

    def __init__(self, spec: SweepSpec, plan: SweepPlan, path: Path, flush_s: float = 10.0):
        self.spec, self.plan, self.path, self.total = spec, plan, path, plan.num_trials
        self.rows: dict[tuple[str, int], dict[str, Any]] = {}
        self.done: set[str] = set()
        self._loaded = False
        self.flush_s = flush_s
        self.last_flush = 0.0
        self.started = time.time()
        self.best = math.inf if spec.mode == "min" else -math.inf

    def _trial_id(self, trial) -> str:
        return trial.trial_id

    def _ensure_loaded(self) -> None:
        """Merge the rows already on disk (a resumed sweep). Done lazily, at first use: on
        ``--resume`` Tune restores this callback from the experiment state pickled at the
        sweep's start, so the constructor cannot be relied on to see the file."""
        if self._loaded:
            return
        for r in read_rows(self.path):
            self.rows.setdefault((r["trial_id"], int(r.get("step") or 0)), r)
        self.done |= {r["trial_id"] for r in self.rows.values() if r.get("status") == "ok"}
        self._loaded = True

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self._ensure_loaded()
        row = {k: v for k, v in result.items() if k in _CORE or "." in k}
        row["trial_id"] = self._trial_id(trial)
        step = int(row.get("step") or 0)
        self.rows[(row["trial_id"], step)] = row
        m = row.get(self.spec.metric)
        if isinstance(m, (int, float)) and m == m:
            self.best = min(self.best, m) if self.spec.mode == "min" else max(self.best, m)
        if time.time() - self.last_flush > self.flush_s:
            self.flush()

    def _mark(self, trial, status: str, reason: str | None) -> None:
        self._ensure_loaded()
        tid = self._trial_id(trial)
        mine = [k for k in self.rows if k[0] == tid]
        for k in mine:
            if self.rows[k].get("status") in (None, "running") or status == "failed":
                if self.rows[k].get("status") != "diverged":
                    self.rows[k]["status"] = status
                    if reason:
                        self.rows[k]["reason"] = reason
        if not mine:
            knobs = self.plan.trial(self.spec, dict(trial.config)).knobs
            self.rows[(tid, 0)] = {"sweep": self.spec.name, "trial_id": tid, "status": status,
                                   "reason": reason, "step": 0, **knob_columns(knobs)}

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._mark(trial, "ok", None)
        self.done.add(self._trial_id(trial))
        self.flush()
        n = len(self.done)
        console.progress(f"{n}/{self.total} trials done   best {self.spec.metric}="
                         f"{self.best:.4f}   ETA {console.eta(n, self.total, self.started)}")

    def on_trial_error(self, iteration, trials, trial, **info):
        err = getattr(trial, "error_file", None) or "trial error"
        self._mark(trial, "failed", str(err))
        self.flush()

    def on_experiment_end(self, trials, **info):
        self.flush()

    def flush(self) -> None:
        self._ensure_loaded()
        rows = sorted(self.rows.values(), key=lambda r: (r["trial_id"], r.get("step") or 0))
        write_rows(self.path, rows)
        self.last_flush = time.time()


def static_keys(plan: SweepPlan) -> list[str]:
    """Columns that are configuration, not metrics: W&B gets them as the run config (the
    searched knobs), not as curves."""
    keys = set(STATIC_COLUMNS)
    for t in plan.trials:
        keys.update(config_columns(t.config.to_dict()))
        keys.update(knob_columns(t.knobs))
    return sorted(keys)


def param_space(spec: SweepSpec) -> dict[str, Any]:
    space: dict[str, Any] = {}
    for p in spec.search:
        if p.kind == "grid":
            space[p.key] = tune.grid_search(list(p.values))
        elif p.kind == "choice":
            space[p.key] = tune.choice(list(p.values))
        elif p.kind == "uniform":
            space[p.key] = tune.uniform(*p.values)
        elif p.kind == "loguniform":
            space[p.key] = tune.loguniform(*p.values)
        elif p.kind == "int":
            space[p.key] = tune.randint(int(p.values[0]), int(p.values[1]) + 1)
    if spec.seeds:
        space["seed"] = tune.grid_search(list(spec.seeds))
    return space


def searcher(spec: SweepSpec):
    """None (Tune's variant generator: grid and random) or Optuna TPE / GridSampler."""
    if spec.algorithm != "optuna":
        return None
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    grid = spec.grid_params()
    if grid and spec.sampled_params():
        raise SearchSpaceError(
            f"search.{grid[0].key} is a grid, but algorithm=optuna (TPE) cannot mix grids with "
            "sampled knobs (Ray's OptunaSearch refuses grid_search); use choice for it, or make "
            "every knob a grid to use Optuna's GridSampler"
        )
    if grid:
        gs = {p.key: list(p.values) for p in grid}
        if spec.seeds:
            gs["seed"] = list(spec.seeds)
        space = {k: optuna.distributions.CategoricalDistribution(v) for k, v in gs.items()}
        return OptunaSearch(space=space, sampler=optuna.samplers.GridSampler(gs, seed=0),
                            metric=spec.metric, mode=spec.mode)
    return OptunaSearch(sampler=optuna.samplers.TPESampler(seed=0), metric=spec.metric,
                        mode=spec.mode)


def scheduler(spec: SweepSpec):
    if spec.scheduler != "asha":
        return None
    from ray.tune.schedulers import ASHAScheduler

    base = spec.base_config
    max_t = spec.asha.max_t or (base.steps // base.eval.every_steps + 2)
    return ASHAScheduler(time_attr="training_iteration", max_t=max_t,
                         grace_period=spec.asha.grace_period,
                         reduction_factor=spec.asha.reduction_factor)


def archive_previous(results_dir: Path) -> Path | None:
    """Move an earlier run's results, summary and Tune state to ``previous/<time>/`` so that a
    fresh (not ``--resume``) sweep neither merges nor destroys them. Cached parents stay."""
    names = [n for n in (RESULTS_FILE, "summary.json", "tune") if (results_dir / n).exists()]
    if RESULTS_FILE not in names:
        return None
    prev = results_dir / "previous" / time.strftime("%Y%m%d-%H%M%S")
    while prev.exists():
        prev = prev.with_name(prev.name + "_")
    prev.mkdir(parents=True)
    for n in names:
        os.replace(results_dir / n, prev / n)
    return prev


def _start_ray(spec: SweepSpec, address: str | None, verbose: bool) -> None:
    env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
    env.setdefault("OMP_NUM_THREADS", str(max(1, int(spec.resources.cpus))))
    if not ray.is_initialized():
        ray.init(address=address, runtime_env={"env_vars": env}, include_dashboard=False,
                 log_to_driver=verbose, configure_logging=False)


def _callbacks(spec: SweepSpec, plan: SweepPlan, results_dir: Path) -> list[Any]:
    callbacks: list[Any] = [ResultsCallback(spec, plan, results_dir / RESULTS_FILE,
                                            spec.storage.flush_s)]
    if spec.wandb.enabled and spec.wandb.mode != "disabled":
        from ray.air.integrations.wandb import WandbLoggerCallback

        callbacks.append(WandbLoggerCallback(
            project=spec.wandb.project, group=spec.wandb.group or spec.name,
            entity=spec.wandb.entity, mode=spec.wandb.mode, dir=str(results_dir),
            log_config=False, excludes=static_keys(plan),
            upload_timeout=15 if spec.wandb.mode == "offline" else 600,
        ))
    return callbacks


def _concurrency(spec: SweepSpec, max_concurrent: int | None) -> int:
    cpus = ray.cluster_resources().get("CPU", 1)
    per_trial = spec.resources.cpus * spec.resources.ranks
    conc = max_concurrent or spec.max_concurrent or max(1, int(cpus // per_trial))
    gpus = ray.cluster_resources().get("GPU", 0)
    if spec.resources.gpus > 0 and gpus:  # never oversubscribe GPUs (fractional packing ok)
        conc = min(conc, max(1, int(gpus // (spec.resources.gpus * spec.resources.ranks))))
    return conc


def _tuner(spec: SweepSpec, trainable: Any, results_dir: Path, callbacks: list[Any],
           conc: int, resume: bool, verbose: bool) -> tune.Tuner:
    exp_dir = results_dir / "tune"
    if resume and tune.Tuner.can_restore(str(exp_dir)):
        return tune.Tuner.restore(str(exp_dir), trainable=trainable, resume_unfinished=True,
                                  resume_errored=True)
    run_config = tune.RunConfig(
        name="tune", storage_path=str(results_dir),
        failure_config=tune.FailureConfig(max_failures=spec.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
        callbacks=callbacks, verbose=1 if verbose else 0,
    )
    return tune.Tuner(
        trainable, param_space=param_space(spec),
        tune_config=tune.TuneConfig(
            metric=spec.metric, mode=spec.mode, search_alg=searcher(spec),
            scheduler=scheduler(spec), num_samples=spec.num_samples,
            max_concurrent_trials=conc, reuse_actors=True,
        ),
        run_config=run_config,
    )


def run_sweep(spec: SweepSpec, plan: SweepPlan, *, address: str | None = None,
              resume: bool = False, max_concurrent: int | None = None,
              verbose: bool = False) -> dict[str, Any]:
    """Run the planned sweep to the end; returns the summary (also in ``summary.json``)."""
    os.environ.setdefault("WANDB_MODE", spec.wandb.mode)
    results_dir = spec.results_dir.resolve()
    results_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        prev = archive_previous(results_dir)
        if prev is not None:
            console.progress(f"{results_dir} held an earlier run: moved it to {prev} "
                             "(pass --resume to continue a sweep instead)")
    cache_dir = Path(spec.storage.parent_cache or results_dir / "parents").resolve()
    _start_ray(spec, address, verbose)
    t0 = time.time()
    refs = train_parents(spec, plan, cache_dir)
    stables = train_stables(spec, plan, refs, cache_dir, results_dir)
    parent_wall = time.time() - t0
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, spec=spec, plan=plan, parents=dict(refs),
                             cache_dir=str(cache_dir), stables=stables,
                             report=faults.report_function(cache_dir)),
        # A multi-rank trial's TorchTrainer workers reserve its CPUs/GPUs: not twice here.
        {"cpu": spec.resources.cpus, "gpu": spec.resources.gpus}
        if spec.resources.ranks == 1 else {"cpu": 0, "memory": 2**20},  # a token bundle
    )
    tuner = _tuner(spec, trainable, results_dir, _callbacks(spec, plan, results_dir),
                   _concurrency(spec, max_concurrent), resume, verbose)
    grid = tuner.fit()
    finals = final_rows(read_rows(results_dir / RESULTS_FILE))
    summary = summarize(finals, sweep=spec.name, metric=spec.metric, mode=spec.mode,
                        planned=plan.estimates(), results=str(spec.results_dir / RESULTS_FILE),
                        wall_s=time.time() - t0, parent_wall_s=parent_wall)
    summary["errors"] = grid.num_errors
    write_summary(results_dir, summary)
    console.print_ranked(spec, finals, summary)
    return summary

"""The sweep driver: Ray start-up, shared parents, the Tuner, results and the final table."""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import ray
from ray import tune

from sweeps.results import RESULTS_FILE, final_rows, format_knob, read_rows, write_rows
from sweeps.spec import SweepSpec, knob_values, trial_config
from sweeps.trainable import FAIL_ONCE_ENV, parent_payload, run_trial

PASS_ENV = ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DIR", "UPCYCLE_CACHE", FAIL_ONCE_ENV,
            "OMP_NUM_THREADS")


class ResultsCallback(tune.Callback):
    """Collects every reported row into the sweep's Parquet file (atomic rewrites), marks trial
    outcomes, and prints progress with the best metric so far and an ETA."""

    def __init__(self, spec: SweepSpec, path: Path, total: int, flush_s: float = 10.0):
        self.spec, self.path, self.total = spec, path, total
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
            self.rows[(tid, 0)] = {"sweep": self.spec.name, "trial_id": tid, "status": status,
                                   "reason": reason, "step": 0,
                                   **{f"knob.{k}": v for k, v in
                                      knob_values(self.spec, dict(trial.config)).items()}}

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._mark(trial, "ok", None)
        self.done.add(self._trial_id(trial))
        self.flush()
        from sweeps.run import eta

        n = len(self.done)
        print(f"[sweeps] {n}/{self.total} trials done   best {self.spec.metric}="
              f"{self.best:.4f}   ETA {eta(n, self.total, self.started)}",
              file=sys.stderr, flush=True)

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


_CORE = {"sweep", "trial_id", "status", "reason", "parent_key", "kind", "seed", "N1", "N2",
         "N_total", "D1", "D2", "step", "tokens", "lr", "train_loss", "val_loss", "aux_loss",
         "wall_s", "flops", "tokens_budget", "branch_from_step", "ranks"}


def static_keys(spec: SweepSpec, plan: dict[str, Any]) -> list[str]:
    """Columns that are configuration, not metrics: W&B gets them as the run config (the
    searched knobs), not as curves."""
    from sweeps.results import flatten_config

    keys = {"sweep", "trial_id", "status", "reason", "parent_key", "kind", "seed", "N1", "N2",
            "N_total", "D1", "tokens_budget", "branch_from_step", "ranks"}
    for r in plan["rows"]:
        keys.update(flatten_config(trial_config(spec, r["point"]).to_dict()))
        keys.update(f"knob.{k}" for k in knob_values(spec, r["point"]))
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

    from moe_core.errors import SearchSpaceError

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


@ray.remote
def _train_parent_task(spec: SweepSpec, point: dict[str, Any], cache_dir: str) -> dict[str, Any]:
    from moe_core.train.runner import train_parent

    cfg = trial_config(spec, point)
    state, trained = train_parent(cfg, Path(cache_dir))
    payload = parent_payload(state)
    payload["_trained_now"] = trained
    return payload


def train_parents(spec: SweepSpec, plan: dict[str, Any], cache_dir: Path) -> dict[str, Any]:
    """Train every distinct parent of the grid once (in parallel Ray tasks) and return their
    ObjectRefs keyed by parent hash. The state lives in the object store as numpy arrays."""
    refs: dict[str, Any] = {}
    for r in plan["rows"]:
        pk = r["parent"]
        if pk is not None and pk not in refs:
            # max_retries=0: no lineage reconstruction; a parent lost with its node is read back
            # from the disk cache by the trials instead of being retrained.
            refs[pk] = _train_parent_task.options(num_cpus=spec.resources.cpus,
                                                  max_retries=0).remote(
                spec, r["point"], str(cache_dir))
    if refs:
        print(f"[sweeps] preparing {len(refs)} parent(s) (cached by content hash in "
              f"{cache_dir})", file=sys.stderr, flush=True)
        ray.wait(list(refs.values()), num_returns=len(refs))
        ray.get(list(refs.values()))  # surface a failed parent now, not in every trial
    return refs


@ray.remote
def _train_stable_task(spec: SweepSpec, group: dict[str, Any], parents: dict[str, Any],
                       cache_dir: str, out_dir: str) -> dict[str, Any]:
    from sweeps.branches import train_stable_group
    from sweeps.trainable import get_parent

    cfg = trial_config(spec, group["point"])
    parent, _ = get_parent(cfg, parents, Path(cache_dir))
    return train_stable_group(spec, group, parent, Path(out_dir))


def train_stables(spec: SweepSpec, refs: dict[str, Any], cache_dir: Path,
                  results_dir: Path) -> dict[str, Any]:
    """Train each WSD stable run shared by a token-budget grid once; trials branch off it."""
    from sweeps.branches import plan_branches

    groups = plan_branches(spec)
    if not groups:
        return {}
    print(f"[sweeps] training {len(groups)} shared WSD stable run(s) for "
          f"{sum(len(g['starts']) for g in groups.values())} token budgets", file=sys.stderr,
          flush=True)
    tasks = {k: _train_stable_task.options(num_cpus=spec.resources.cpus).remote(
        spec, g, dict(refs), str(cache_dir), str(results_dir / "stable" / k))
        for k, g in groups.items()}
    return {k: ray.get(t) for k, t in tasks.items()}


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


def run_sweep(spec: SweepSpec, plan: dict[str, Any], *, address: str | None = None,
              resume: bool = False, max_concurrent: int | None = None,
              verbose: bool = False) -> dict[str, Any]:
    os.environ.setdefault("WANDB_MODE", spec.wandb.mode if spec.wandb.mode != "disabled"
                          else "disabled")
    results_dir = spec.results_dir.resolve()
    results_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        prev = archive_previous(results_dir)
        if prev is not None:
            print(f"[sweeps] {results_dir} held an earlier run: moved it to {prev} "
                  "(pass --resume to continue a sweep instead)", file=sys.stderr)
    cache_dir = Path(os.environ.get("UPCYCLE_PARENT_CACHE", results_dir / "parents")).resolve()
    env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
    env.setdefault("OMP_NUM_THREADS", str(max(1, int(spec.resources.cpus))))
    if not ray.is_initialized():
        ray.init(address=address, runtime_env={"env_vars": env}, include_dashboard=False,
                 log_to_driver=verbose, configure_logging=False)
    t0 = time.time()
    refs = train_parents(spec, plan, cache_dir)
    stables = train_stables(spec, refs, cache_dir, results_dir)
    parent_wall = time.time() - t0
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, spec=spec, parents=dict(refs), cache_dir=str(cache_dir),
                             stables=stables),
        # A multi-rank trial's TorchTrainer workers reserve its CPUs/GPUs: not twice here.
        {"cpu": spec.resources.cpus, "gpu": spec.resources.gpus}
        if spec.resources.ranks == 1 else {"cpu": 0, "memory": 2**20},  # a token bundle
    )
    total = plan["trials"]
    flush_s = float(os.environ.get("UPCYCLE_SWEEPS_FLUSH_S", "10"))
    callbacks: list[Any] = [ResultsCallback(spec, results_dir / RESULTS_FILE, total, flush_s)]
    if spec.wandb.enabled and spec.wandb.mode != "disabled":
        from ray.air.integrations.wandb import WandbLoggerCallback

        callbacks.append(WandbLoggerCallback(
            project=spec.wandb.project, group=spec.wandb.group or spec.name,
            entity=spec.wandb.entity, mode=spec.wandb.mode, dir=str(results_dir),
            log_config=False, excludes=static_keys(spec, plan),
            upload_timeout=15 if spec.wandb.mode == "offline" else 600,
        ))
    cpus = ray.cluster_resources().get("CPU", 1)
    per_trial = spec.resources.cpus * spec.resources.ranks
    conc = max_concurrent or spec.max_concurrent or max(1, int(cpus // per_trial))
    gpus = ray.cluster_resources().get("GPU", 0)
    if spec.resources.gpus > 0 and gpus:  # never oversubscribe GPUs (fractional packing ok)
        conc = min(conc, max(1, int(gpus // (spec.resources.gpus * spec.resources.ranks))))
    run_config = tune.RunConfig(
        name="tune", storage_path=str(results_dir),
        failure_config=tune.FailureConfig(max_failures=spec.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
        callbacks=callbacks, verbose=1 if verbose else 0,
    )
    exp_dir = results_dir / "tune"
    if resume and tune.Tuner.can_restore(str(exp_dir)):
        tuner = tune.Tuner.restore(str(exp_dir), trainable=trainable, resume_unfinished=True,
                                   resume_errored=True)
    else:
        tuner = tune.Tuner(
            trainable, param_space=param_space(spec),
            tune_config=tune.TuneConfig(
                metric=spec.metric, mode=spec.mode, search_alg=searcher(spec),
                scheduler=scheduler(spec), num_samples=spec.num_samples,
                max_concurrent_trials=conc, reuse_actors=True,
            ),
            run_config=run_config,
        )
    grid = tuner.fit()
    rows = read_rows(results_dir / RESULTS_FILE)
    finals = final_rows(rows)
    summary = summarize(spec, finals, plan, parent_wall, time.time() - t0)
    summary["errors"] = grid.num_errors
    write_summary(results_dir, summary)
    print_ranked(spec, finals, summary)
    return summary


def write_summary(results_dir: Path, summary: dict[str, Any]) -> None:
    """``summary.json`` next to the results (the compute ledger analysis.report reads)."""
    import json

    tmp = results_dir / f".summary.json.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(summary, indent=1, default=str))
    os.replace(tmp, results_dir / "summary.json")


def summarize(spec: SweepSpec, finals: list[dict[str, Any]], plan: dict[str, Any],
              parent_wall: float, wall: float) -> dict[str, Any]:
    ok = [r for r in finals if r.get("status") == "ok"]
    metric = spec.metric
    vals = [r[metric] for r in ok if isinstance(r.get(metric), (int, float))]
    best = (min if spec.mode == "min" else max)(vals) if vals else None
    return {
        "sweep": spec.name, "trials": len(finals), "ok": len(ok),
        "failed": sum(r.get("status") == "failed" for r in finals),
        "diverged": sum(r.get("status") == "diverged" for r in finals),
        "best": best, "metric": metric, "wall_s": round(wall, 1),
        "parent_wall_s": round(parent_wall, 1), "parents": len(plan["parents"]),
        "tokens_saved_by_sharing": plan["tokens_saved_by_sharing"],
        "tokens_saved_by_branches": plan["tokens_saved_by_branches"],
        "results": str(spec.results_dir / RESULTS_FILE),
        **{f"planned_{k}": plan.get(k)
           for k in ("trial_tokens", "trial_flops", "parent_tokens", "parent_flops")},
    }


def print_ranked(spec: SweepSpec, finals: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    metric = spec.metric
    knobs = sorted({k for r in finals for k in r if k.startswith("knob.")})
    sign = 1 if spec.mode == "min" else -1

    def key(r):
        v = r.get(metric)
        return (0, sign * v) if isinstance(v, (int, float)) and v == v else (1, 0)

    t = Table(title=f"{spec.name}: trials ranked by {metric} ({spec.mode})")
    for c in ["#", "trial", *[k[5:] for k in knobs], metric, "tokens", "status"]:
        t.add_column(c)
    for i, r in enumerate(sorted(finals, key=key), 1):
        v = r.get(metric)
        t.add_row(str(i), str(r["trial_id"]), *[format_knob(r.get(k)) for k in knobs],
                  f"{v:.4f}" if isinstance(v, (int, float)) and v == v else "-",
                  f"{r.get('tokens') or 0:,}", str(r.get("status")))
    con = Console()
    con.print(t)
    con.print(f"results: {summary['results']}   wall {summary['wall_s']} s "
              f"(parents and stable runs {summary['parent_wall_s']} s)   tokens saved: "
              f"{summary['tokens_saved_by_sharing']:,} by shared parents, "
              f"{summary['tokens_saved_by_branches']:,} by WSD branches")

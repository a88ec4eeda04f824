"""The sweep driver: Ray start-up, shared parents and stable runs (``sweeps.run.parents``), the
Tuner running the trials (``sweeps.run.trial``), results, summary. What differs between search
algorithms and schedulers is asked of the spec's two plug-ins (``sweeps.spec.algorithm``); this
module has no branch on either.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import ray
from ray import tune

from moe_core.errors import SearchSpaceError, UpcycleError
from moe_core.lazy import freeze_heap
from moe_core.train.config import TrainConfig
from sweeps.cluster.local import PRESTART_ENV
from sweeps.plan import resources, schedule
from sweeps.plan.build import SweepPlan
from sweeps.plan.devices import ALLOW_CPU_ENV, allow_cpu_for_gpu
from sweeps.plan.preflight import (
    check_cluster,
    custom_resources,
    enforce,
    max_trial_memory,
    parent_cache_problems,
)
from sweeps.run import _signals as signals
from sweeps.run import budget, console, setup_progress
from sweeps.run.address import check_address
from sweeps.run.guard import SPEC_FILE, ray_address, record_spec
from sweeps.run.health import HealthStopper
from sweeps.run.memory import stop_outcome, survive_oom
from sweeps.run.parents import (
    cache_paths,
    planned_ranks,
    report_diverged,
    start_parents,
    train_parents,
    train_stables,
)
from sweeps.run.results_callback import Results, ResultsCallback
from sweeps.run.resume import UnsoundStateError, check_tune_state, rebind
from sweeps.run.trial import TrialContext, run_trial
from sweeps.spec.algorithm import plugin, plugins
from sweeps.spec.budget import BudgetConfig
from sweeps.spec.naming import trial_dirname
from sweeps.spec.sweep import SweepSpec
from sweeps.store.generations import committed_uploads, handler_of, tune_storage
from sweeps.store.oom import OOM_STATUS, is_oom
from sweeps.store.provenance import provenance
from sweeps.store.results import (
    RESULTS_FILE,
    STATIC_COLUMNS,
    config_columns,
    config_types,
    knob_columns,
    summarize,
    write_summary,
)
from sweeps.store.signing import KEY_FILE_ENV, verify_tree
from sweeps.store.sink import ResultsSink
from sweeps.store.storage import S3_SETTINGS, STAGING_ENV, Location, join_uri, staging_dir
from sweeps.store.trial_outcomes import reconcile
from sweeps.store.trust import hide_cloud_keys, hide_wandb_key, verify_experiment_state
from sweeps.testing import faults

# Passed to every worker: inherited from this process by a Ray of the sweep's own, through the
# job's runtime_env on a cluster (Ray writes these into its session logs: never a secret here;
# the W&B key travels in a private netrc file named by NETRC, see sweeps.store.trust).
# Object-storage credentials are never here: each node reads them from its own environment or
# provider chain (docs/storage.md); the HMAC key file's path and the staging folder are paths.
PASS_ENV = ("WANDB_MODE", "WANDB_DIR", "NETRC", "UPCYCLE_CACHE", faults.FAIL_ONCE_ENV,
            faults.OOM_AFTER_ENV, faults.COST_ENV, faults.HOLD_ENV, faults.SIM_STEP_ENV,
            "OMP_NUM_THREADS", ALLOW_CPU_ENV, KEY_FILE_ENV, STAGING_ENV,
            "AWS_SHARED_CREDENTIALS_FILE", *S3_SETTINGS)
def static_keys(plan: SweepPlan) -> list[str]:
    """Columns that are configuration, not metrics: W&B gets them as the run config (the
    searched knobs), not as curves."""
    keys = set(STATIC_COLUMNS)
    for t in plan.trials:
        keys.update(config_columns(t.config.to_dict()))
        keys.update(knob_columns(t.knobs))
    return sorted(keys)


def scheduler(spec: SweepSpec) -> Any:
    """Tune's ``scheduler`` for the spec's scheduler (None: FIFO)."""
    return plugin(spec.scheduler).scheduler(spec)


def cluster_nodes(address: str) -> list[dict[str, float]]:
    """Each alive node's resources of the running cluster at ``address`` (``--dry-run
    --address`` checks them, ``sweeps.plan.preflight.check_cluster``): connects, reads,
    disconnects. The caller (``sweeps.run.cli``) has probed ``address`` (``check_address``)."""
    ray.init(address=address, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]
    finally:
        ray.shutdown()


def _local(results_dir: Results) -> Path:
    """A local folder for what must be local (W&B's files): the staging folder on object
    storage."""
    return results_dir if isinstance(results_dir, Path) else staging_dir(results_dir)


def archive_previous(results_dir: Results) -> Results | None:
    """Move an earlier run's results, row log, summary and Tune state to ``previous/<time>/``
    so that a fresh (not ``--resume``) sweep neither merges nor destroys them. Cached parents
    and WSD stable runs stay."""
    names = [n for n in (RESULTS_FILE, "rows", "parts", "summary.json", "tune", "train",
                         SPEC_FILE) if (results_dir / n).exists()]  # parts: the sink's sealed rows
    if not {RESULTS_FILE, "rows", "parts", "tune"} & set(names):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    while (results_dir / "previous" / stamp).exists():
        stamp += "_"
    prev = results_dir / "previous" / stamp
    if isinstance(results_dir, Location):  # object storage: copy, then delete
        for n in names:
            (results_dir / n).move_to(prev / n)
        return prev
    prev.mkdir(parents=True)
    for n in names:
        os.replace(results_dir / n, prev / n)
    return prev


def _start_ray(spec: SweepSpec, address: str | None, verbose: bool) -> None:
    if not verbose:  # the sweep's own lines: Ray's warnings stay in its session logs
        logging.getLogger("ray").setLevel(logging.ERROR)
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with Tune's verbose=0: no tables
    env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
    env.setdefault("OMP_NUM_THREADS", str(max(1, int(spec.resources.cpus))))
    env.update(resources.WORKER_ENV)  # a task or actor given no GPU sees none
    if ray.is_initialized():
        return
    where = ray_address(address)
    if where == "local":
        # A Ray of the sweep's own: its workers inherit this process's environment, so the
        # variables go there and the job has no runtime_env. With one, every worker started
        # through Ray's runtime-env agent and setup_worker.py: a 4-trial sweep of the tiny
        # model took 82-88 s against 38-42 s without on a busy machine, 16.5-17.4 s against
        # 16.0-16.2 s on a quiet one (two runs each, side by side).
        # Nor does its raylet prestart a worker per CPU: Tune gives every trial actor a
        # runtime_env, which a prestarted worker lacks, so they would only idle (on a 32-core
        # workstation, 32 processes importing Ray). A cluster's raylets are started elsewhere.
        os.environ.update(env)
        os.environ.setdefault(PRESTART_ENV, "0")
        ray.init(address=where, include_dashboard=False, log_to_driver=verbose,
                 configure_logging=False)
    else:  # a cluster's other nodes see only what the job's runtime_env carries
        ray.init(address=where, runtime_env={"env_vars": env},
                 include_dashboard=False, log_to_driver=verbose, configure_logging=False)
    # Ray, Tune, pyarrow and the spec: about 140,000 objects that live until exit, which each
    # full collection of Tune's loop would walk again
    freeze_heap()


def _callbacks(spec: SweepSpec, plan: SweepPlan, results_dir: Results,
               health: HealthStopper | None = None, setup_dir: Path | None = None
               ) -> list[Any]:
    callbacks: list[Any] = [ResultsCallback(spec, plan, results_dir, spec.storage.flush_s,
                                            health, setup_dir)]
    if wandb_on(spec):
        callbacks.append(wandb_callback(spec, plan, results_dir))
    return callbacks


def wandb_on(spec: SweepSpec) -> bool:
    """Whether trials log to W&B: the spec's ``logging.wandb`` unless the environment says
    ``WANDB_MODE=disabled``, W&B's own switch for "no W&B at all", which the spec's mode would
    otherwise override (it is passed to ``wandb.init``)."""
    return (spec.wandb.enabled and spec.wandb.mode != "disabled"
            and os.environ.get("WANDB_MODE") != "disabled")


def wandb_callback(spec: SweepSpec, plan: SweepPlan, results_dir: Results) -> Any:
    """One W&B run per trial, grouped by sweep, with the trial's columns as its config
    (``sweeps.run.wandb_logging``)."""
    from sweeps.run.wandb_logging import ProvenanceWandbLogger  # imports wandb

    cb = ProvenanceWandbLogger(
        project=spec.wandb.project, group=spec.wandb.group or spec.name,
        entity=spec.wandb.entity, mode=spec.wandb.mode, dir=str(_local(results_dir)),
        log_config=False, upload_timeout=15 if spec.wandb.mode == "offline" else 600,
        static=static_keys(plan),
    )
    # Ray builds its logging actor with max_restarts=-1 and the key in runtime_env env_vars;
    # ours is built here, on this node, without restarts (which also spares the console Ray's
    # warning about restarting an actor whose arguments live in the object store) and without
    # env vars (wandb reads the key from the private netrc, see sweeps.store.trust).
    from ray.air.util.node import _force_on_current_node

    cb._remote_logger_class = ray.remote(num_cpus=0, max_restarts=0,
                                         **_force_on_current_node())(cb._logger_actor_cls)
    return cb


def _concurrency(spec: SweepSpec, max_concurrent: int | None) -> int:
    cpus = ray.cluster_resources().get("CPU", 1)
    per_trial = spec.resources.cpus * spec.resources.ranks
    conc = max_concurrent or spec.max_concurrent or max(1, int(cpus // per_trial))
    gpus = ray.cluster_resources().get("GPU", 0)
    if spec.resources.gpus > 0 and gpus:  # never oversubscribe GPUs (fractional packing ok)
        conc = min(conc, max(1, int(gpus // (spec.resources.gpus * spec.resources.ranks))))
    return conc


STATE_SAVE_S_PER_TRIAL = 0.5
"""Seconds between Tune's experiment-state saves per planned trial (at least Tune's own 10 s).
Each save writes every trial's state, O(T); saved every 10 s over a sweep whose length grows
with T, that is O(T²) of driver CPU. A period that grows with T keeps it linear; what a crash
can lose is at most that period's Tune bookkeeping (the rows are in the sink's log)."""


def state_save_period(trials: int) -> float:
    return max(10.0, STATE_SAVE_S_PER_TRIAL * trials)


@contextlib.contextmanager
def _env_default(key: str, value: str) -> Iterator[None]:
    """``key`` set to ``value`` for the block unless the user set it (then kept as is)."""
    before = os.environ.get(key)
    os.environ.setdefault(key, value)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)


@contextlib.contextmanager
def tune_settings(conc: int, trials: int) -> Iterator[None]:
    """Tune's settings read from the environment when ``fit`` starts (a value the user set is
    kept): :func:`pending_trials` and :func:`state_save_period`."""
    with _env_default("TUNE_GLOBAL_CHECKPOINT_S", f"{state_save_period(trials):g}"), \
            pending_trials(conc):
        yield


def pending_trials(conc: int) -> contextlib.AbstractContextManager[None]:
    """Let as many trials wait for resources as may run at once, whatever the searcher: an
    autoscaler sees only the pending trials' resource requests, and Tune lets a custom
    searcher's trials pend one at a time by default."""
    return _env_default("TUNE_MAX_PENDING_TRIALS_PG", str(conc))


OLDER_STATE = (AttributeError, ImportError, TypeError)
"""What unpickling Tune's experiment state raises when a class it names moved or changed
(``sweeps.spec.sweep.Param`` became ``sweeps.spec.space``'s distributions; the flat modules such as
``sweeps.run.health`` moved into stage folders; see CHANGELOG.md)."""


def _restore(where: str, trainable: Any, fs: Any) -> tune.Tuner:
    """``Tuner.restore``; experiment state pickled by an older upcycle-sweeps whose classes
    moved is refused in one line, with the results left as they are."""
    try:
        return tune.Tuner.restore(where, trainable=trainable, resume_unfinished=True,
                                  resume_errored=True, storage_filesystem=fs)
    except (pickle.UnpicklingError, EOFError, ValueError) as e:  # a garbage tuner.pkl
        raise UnsoundStateError(f"--resume: {where}/tuner.pkl is unreadable ({type(e).__name__}"
                                "); restore the folder from a copy, or start afresh") from None
    except OLDER_STATE as e:
        raise SearchSpaceError(
            f"--resume: {where} holds Tune state this version cannot read ({type(e).__name__}: "
            f"{str(e)[:120]}); it was written by an older upcycle-sweeps: resume with that "
            "version, or rerun into a new results folder (nothing was changed)") from None


def _tuner(spec: SweepSpec, plan: SweepPlan, trainable: Any, results_dir: Results,
           callbacks: list[Any], conc: int, resume: bool, verbose: bool,
           health: HealthStopper | None = None) -> tune.Tuner:
    algorithm, sched = plugins(spec)
    # Tune's top-level state as generations and a manifest written last (a kill leaves one
    # whole save: sweeps.store.generations); on object storage through the HMAC-signing
    # filesystem, so each file and each trial checkpoint is signed as written (sweeps.store.signing)
    fs, storage_path, where = tune_storage(results_dir)
    if resume and tune.Tuner.can_restore(where, storage_filesystem=fs):
        # bound to this folder; a searcher that keeps its state in the results folder is made
        # afresh and reads it back (ray#30861)
        return rebind(_restore(where, trainable, fs), callbacks, health,
                      algorithm.searcher(spec, plan, results_dir)
                      if algorithm.keeps_state else None)
    run_config = tune.RunConfig(
        name="tune", storage_path=storage_path, storage_filesystem=fs,
        failure_config=tune.FailureConfig(max_failures=spec.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=spec.checkpoint.keep),
        callbacks=callbacks, verbose=1 if verbose else 0, stop=health,
    )
    search = algorithm.searcher(spec, plan, results_dir)
    return tune.Tuner(
        trainable, param_space=algorithm.param_space(spec),
        tune_config=tune.TuneConfig(
            metric=spec.metric, mode=spec.mode, search_alg=search,
            scheduler=sched.scheduler(spec), num_samples=algorithm.num_samples(spec, search),
            max_concurrent_trials=conc, reuse_actors=True,
            trial_dirname_creator=trial_dirname,  # lr=3e-05, not Ray's peak=0.0000
        ),
        run_config=run_config,
    )


def _final_results(results_dir: Results, grid: Any,
                   cut: tuple[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The last row of each trial, with its outcome taken from Tune's own trial states (a
    resumed sweep restores finished trials without calling back for them); read one part of
    the sink at a time. ``cut``: the sweep stopped for memory, the ``oom`` reason and columns
    of each trial it left running."""
    sink = ResultsSink(results_dir, types=config_types(TrainConfig))
    for p in sink.load(results_dir / "tune").problems:
        console.progress(p)
    reconcile(sink, getattr(getattr(grid, "_experiment_analysis", None), "trials", None) or [],
              signals.received(), budget.stopped_by())  # cut trials: interrupted or budget, not ok
    for t in sink.trial_ids("running") if cut else ():
        sink.mark(t, OOM_STATUS, cut[0], columns=cut[1])
    sink.close()
    if sink.write_errors:
        raise UpcycleError(f"could not write {sink.path}: {sink.write_errors[-1]}; the rows are "
                           f"kept in {sink.log_dir} and rerunning with --resume rebuilds it")
    return sink.final_rows()


def _fit(tuner: tune.Tuner, conc: int, trials: int, results: ResultsCallback
         ) -> tuple[Any, str | None, tuple[str, dict[str, Any]] | None]:
    """``tuner.fit()``: (its result grid, None, None); or, when a worker the sweep needs was
    killed for memory in a way Tune does not survive (``sweeps.run.memory``), (None, the one
    line that says so, the ``oom`` reason and columns of the trials it cut)."""
    try:
        with tune_settings(conc, trials), committed_uploads(), survive_oom():
            tensorboard_without_torch()
            return tuner.fit(), None, None
    except Exception as e:  # noqa: BLE001 - only memory is recorded; anything else re-raised
        if not is_oom(e):
            raise
        line, reason, cols = stop_outcome(e)
        results.sink.close()  # its rows durable before they are read back
        return None, line, (reason, cols)


def tensorboard_without_torch() -> None:
    """Import tensorboardX (Tune's default TensorBoard logger, which writes each trial's
    ``events.out.tfevents.*``) with torch hidden: its writer imports torch only to name
    ``torch.Tensor`` in type hints (Tune hands it Python and numpy values), and torch is over a
    second of CPU that the driver, which trains nothing, would pay at every sweep."""
    if "torch" in sys.modules or "tensorboardX" in sys.modules:
        return
    sys.modules["torch"] = None  # type: ignore[assignment]  # ``import torch`` raises ImportError
    try:  # tensorboardX not installed: Tune then warns and writes no event files, as before
        with contextlib.suppress(ImportError):
            import tensorboardX  # noqa: F401
    finally:
        del sys.modules["torch"]


def results_location(spec: SweepSpec, resume: bool) -> Results:
    """The sweep's results folder (a resolved local Path, or a Location on object storage),
    its Tune state checked before anything unpickles it: locally its owners and modes
    (``sweeps.store.trust``), on object storage every file's HMAC digest
    (``sweeps.store.signing``)."""
    loc = Location.of(spec.results_uri)
    results_dir = loc.local_path if loc.is_local else loc
    if not resume or not (results_dir / "tune").exists():
        return results_dir
    if loc.is_local:
        verify_experiment_state(results_dir / "tune")
    else:
        verify_tree(loc.fs, (loc / "tune").path)
    fs, _, where = tune_storage(results_dir)
    state = handler_of(fs)
    if state.skipped and not state.generation:
        raise UnsoundStateError(f"--resume: none of the {state.skipped} saves of Tune's state in "
                                f"{where} is whole, so the run cannot be resumed as it was; "
                                "restore the folder from a copy, or start afresh")
    if fs.get_file_info(f"{where}/tuner.pkl").type == pafs.FileType.File:  # else Tune starts
        check_tune_state(where, fs)  # over, after logging a traceback
    if state.skipped:
        console.progress(f"--resume: the newest {state.skipped} save(s) of Tune's state were cut "
                         f"short (a kill while saving): resuming from save {state.generation}")
    return results_dir


def _parents(spec: SweepSpec, plan: SweepPlan, cache_dir: str) -> tuple[dict[str, Any], bool]:
    """The parents' ObjectRefs, and whether the trials start while they train: each trial as
    soon as its own parent is ready (``sweeps.plan.schedule.policy_for``, as the forecast
    says; ``sweeps.run.parents.start_parents``), else every parent first."""
    up_front = plugins(spec)[0].trains_up_front  # else each trial trains its own
    if not up_front or not plan.parents:
        return {}, False
    # whether every parent task fits the cluster is checked by starting them (start_parents)
    if schedule.policy_for(up_front, len(plan.branch_groups), 0, 0) == schedule.OWN_PARENT:
        return start_parents(spec, plan, cache_dir)
    return train_parents(spec, plan, cache_dir), False


def _overlapped_wall(refs: dict[str, Any]) -> float:
    """The longest parent task's seconds (they trained in parallel), its diverged parents
    said on the console."""
    try:
        payloads = dict(zip(refs, ray.get(list(refs.values()))))
    except Exception as e:  # its trials read the disk cache instead (get_parent)
        console.progress(f"a parent task failed: {type(e).__name__}: {str(e)[:200]}")
        return 0.0
    report_diverged(payloads)
    return max((float(p.get("_seconds", 0.0)) for p in payloads.values()), default=0.0)


def parent_cache(spec: SweepSpec, plan: SweepPlan, results_dir: Results) -> str:
    """The parent cache (``storage.parent_cache``, else ``<results>/parents``), refused in one
    line where multi-rank parents on several machines would not all see it
    (``sweeps.plan.preflight.parent_cache_problems``)."""
    cache = spec.storage.parent_cache or join_uri(str(results_dir), "parents")
    cache = cache if "://" in cache else str(Path(cache).resolve())
    enforce(parent_cache_problems(cache, resources.ray_hosts(),
                                  max(planned_ranks(spec, plan).values(), default=1)),
            console.progress)
    return cache


def run_sweep(spec: SweepSpec, plan: SweepPlan, *, address: str | None = None,
              resume: bool = False, max_concurrent: int | None = None,
              verbose: bool = False, limits: BudgetConfig | None = None) -> dict[str, Any]:
    """Run the planned sweep to the end, or until ``limits`` (default: the spec's ``budget``)
    are spent; returns the summary (also in ``summary.json``)."""
    os.environ.setdefault("WANDB_MODE", spec.wandb.mode)
    hide_cloud_keys()  # before any S3 filesystem is built: keys never reach Ray's logs
    results_dir = results_location(spec, resume)
    ledger = budget.open_ledger(results_dir, resume, limits or spec.budget)
    check_address(address)  # an unreachable cluster fails here, before anything is moved
    allow_cpu_for_gpu()  # a bad value of the switch fails here, not in every trial
    hide_wandb_key()
    _start_ray(spec, address, verbose)
    spec = resources.resolve(spec, resources.ray_cluster())  # resources.gpus: auto -> 1 or 0
    ledger.devices = budget.trial_devices(spec.resources.ranks, spec.resources.gpus)
    signals.install()  # after ray.init, which replaces the SIGTERM handler
    enforce(check_cluster(spec, [n["Resources"] for n in ray.nodes() if n.get("Alive")],
                          "the Ray cluster" if address else "the local Ray", fit=address is None,
                          trial_bytes=max_trial_memory(spec, plan)),
            console.progress)
    cache_dir = parent_cache(spec, plan, results_dir)  # checked before any parent starts
    _local(results_dir).mkdir(parents=True, exist_ok=True)
    if not resume:
        prev = archive_previous(results_dir)
        if prev is not None:
            console.progress(f"{results_dir} held an earlier run: moved it to {prev} "
                             "(pass --resume to continue a sweep instead)")
        record_spec(spec, results_dir)  # what a later --resume must match
    algorithm, sched = plugins(spec)
    predictor = sched.predictor(spec)  # fitted before any training: fails in seconds
    t0 = time.time()
    refs, overlapped = _parents(spec, plan, cache_dir)
    stables = train_stables(spec, plan, refs, cache_dir, results_dir) \
        if algorithm.trains_up_front else {}
    parent_wall = time.time() - t0
    # the longest parent's ranks (resources.parent_ranks) over the parents' wall time
    parent_devices = budget.trial_devices(max(planned_ranks(spec, plan).values(), default=1),
                                          spec.resources.gpus)
    if not overlapped:  # overlapped: charged once they are done (after the trials)
        ledger.charge(parent_wall, parent_devices)
    health = HealthStopper(spec.prune) if spec.prune else None
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, ctx=TrialContext(
            spec=spec, plan=plan, parents=dict(refs), cache_dir=cache_dir, stables=stables,
            report=faults.report_function(cache_paths(cache_dir)[1]), predictor=predictor,
            export_dir=str(results_dir / "export") if spec.export else None,
            **algorithm.trial_options(spec, plan, results_dir))),
        {**resources.trial_resources(spec), **custom_resources(spec)},
    )
    conc = _concurrency(spec, max_concurrent)
    callbacks = _callbacks(spec, plan, results_dir, health,
                           setup_progress.board_dir(cache_paths(cache_dir)[1], spec.name))
    tuner = _tuner(spec, plan, trainable, results_dir, callbacks, conc, resume, verbose, health)
    budget.activate(ledger, console.progress)
    try:
        grid, memory_stop, cut = _fit(tuner, conc, plan.num_trials, callbacks[0])
        if overlapped:
            parent_wall = _overlapped_wall(refs)
            ledger.charge(parent_wall, parent_devices)
        finals = _final_results(results_dir, grid, cut)
    finally:
        budget.deactivate()
        setup_progress.kv_clear(spec.name)  # the boards other nodes' trials left in the GCS
    summary = summarize(finals, sweep=spec.name, metric=spec.metric, mode=spec.mode,
                        planned=algorithm.planned(spec, plan, results_dir),
                        results=join_uri(spec.results_uri, RESULTS_FILE),
                        wall_s=time.time() - t0, parent_wall_s=parent_wall)
    summary["errors"] = grid.num_errors if grid is not None else summary["failed"]
    summary["memory_stop"] = memory_stop  # the one line; the cut trials' rows say oom
    summary["budget"] = ledger.record()  # limits, spent (earlier runs included), status
    summary["provenance"] = provenance()  # the code, libraries and device (sweeps.store.provenance)
    summary.update(algorithm.after_run(spec, plan, results_dir))
    write_summary(results_dir, summary)
    console.print_ranked(spec, finals, summary)
    closing = algorithm.closing_line(spec, summary)
    if closing is not None:
        console.progress(closing)
    return summary

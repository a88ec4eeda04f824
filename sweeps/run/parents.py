"""Parents and shared WSD stable runs: trained once, cached on disk, handed to trials.

A parent's state travels to trials through Ray's object store as numpy arrays (an ObjectRef
carried inside a dict, so Ray does not resolve it early); when the object is gone (its node
died) a trial reads the parent's disk cache instead, training it under a file lock only if the
cache lacks it. Each WSD stable run (``plan.BranchGroup``) is trained once with a checkpoint where
each of its token budgets' decay starts; its manifest (``stable.json``) lets a rerun reuse it.
Under ``algorithm: law`` a trial extends its group's stable run on demand (``extend_stable``;
docs/law-search.md). On object storage every parent and stable run is trained in a node-local
staging folder and published file by file, its manifest last (docs/storage.md); the file lock is
node-local there, so two nodes may train the same content-hashed parent twice (both identical).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from filelock import FileLock

from moe_core.errors import DivergenceError
from moe_core.fsio import atomic_write_text, publish_dir
from moe_core.lazy import TRAINING_STACK, import_frozen, lazy_function
from moe_core.schedules import Phase, run_schedule
from moe_core.train.callbacks import Callback, ParentState
from moe_core.train.config import TrainConfig
from moe_core.train.keys import parent_key
from sweeps.plan import resources
from sweeps.plan.build import BranchGroup, SweepPlan, TrialPlan
from sweeps.plan.cost import parent_rank_counts
from sweeps.plan.devices import check_reserved_device
from sweeps.run import console
from sweeps.run.ranks import rank_trainer
from sweeps.run.setup_progress import secs
from sweeps.spec.sweep import SweepSpec
from sweeps.store.storage import Location, is_url, join_uri, staging_dir
from sweeps.testing import faults

# torch (and the model) load where a parent or a stable run is trained or read, in a Ray task or
# a trial, never in the sweep driver that only imports this module to start those tasks
load_checkpoint = lazy_function("moe_core.train.checkpoint", "load_checkpoint")
cached_parent = lazy_function("moe_core.train.runner", "cached_parent")
fit_parent = lazy_function("moe_core.train.runner", "fit_parent")
train_parent = lazy_function("moe_core.train.runner", "train_parent")
train_stable = lazy_function("moe_core.train.wsd", "train_stable")


@dataclass(frozen=True, slots=True)
class StableRun:
    """A trained WSD stable run: its checkpoint per token budget and its eval curve."""

    checkpoints: dict[int, str]
    curve: list[dict[str, Any]]
    peak: float
    source: str | None = None
    """The run's folder on object storage (its checkpoints are node-local staging paths,
    fetched from there by :func:`fetch_stable` where absent); None: a local folder."""


MANIFEST = "stable.json"


def parent_payload(state: ParentState, with_optimizer: bool = False) -> dict[str, Any]:
    """What goes into the object store: numpy arrays + small metadata, and the AdamW state
    only when a trial replicates experts from it (003 §3)."""
    fields = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
    return {**fields, "optimizer_state": state.optimizer_state if with_optimizer else None}


def cache_paths(cache_dir: str | Path) -> tuple[Location | None, Path]:
    """(the signed object-storage folder or None, the local folder to train and load in)."""
    if not is_url(str(cache_dir)):
        return None, Path(cache_dir)
    loc = Location.of(str(cache_dir))
    return (loc.signed(), staging_dir(loc)) if not loc.is_local else (None, loc.local_path)


def publish(remote: Location | None, local: Path, manifest: str) -> None:
    """Upload a finished local folder to object storage, its manifest last (no-op locally)."""
    if remote is not None and (local / manifest).exists():
        remote.upload_dir(local, last=(manifest,))


def fetch(remote: Location | None, local: Path, manifest: str) -> bool:
    """Fetch a published folder (its manifest is there) into ``local`` (verified, then renamed
    into place); True when ``local`` holds it now."""
    if (local / manifest).exists():
        return True
    if remote is None or not (remote / manifest).exists():
        return False
    tmp = local.with_name(f".{local.name}.fetch-{os.getpid()}")
    remote.download_dir(tmp)
    publish_dir(tmp, local)
    return True


def fetch_stable(st: StableRun) -> None:
    """Make a stable run's checkpoints present on this node (from its ``source`` folder)."""
    if st.source is None or all(Path(p).exists() for p in st.checkpoints.values()):
        return
    remote, local = cache_paths(st.source)
    shutil.rmtree(local, ignore_errors=True)  # a partial copy: fetch it whole
    fetch(remote, local, MANIFEST)


def get_parent(cfg: TrainConfig, key: str | None, parents: dict[str, Any],
               cache_dir: str | Path) -> ParentState | None:
    """The trial's parent: object store first, then the disk cache (training it if absent);
    on object storage the bucket's copy, fetched into this node's staging folder."""
    if key is None:
        return None
    ref = parents.get(key)
    if ref is not None:
        try:  # a parent task still training (sweeps.run.driver overlaps them): wait it out
            pending = not ray.wait([ref], timeout=0)[0]
            payload = ray.get(ref, timeout=None if pending else 600)
        except Exception:  # object lost with its node: fall back to the disk cache
            payload = None
        if payload is not None and "diverged" in payload:
            raise DivergenceError(payload["step"], f"parent {key} {payload['diverged']}")
        if payload is not None:
            return ParentState(**{k: v for k, v in payload.items() if not k.startswith("_")})
    remote, cache_dir = cache_paths(cache_dir)
    fetch(remote and remote / key, cache_dir / key, "meta.json")
    cached = cached_parent(cache_dir / key, key)  # a damaged entry: moved aside, retrained
    if cached is not None:
        return cached
    # a node-local kernel flock, dropped with its process; no timeout: a trial waits as long as
    # another trains the parent or stable run it needs, for hours if need be
    with FileLock(cache_dir / f"{key}.lock"):
        state, trained = train_parent(cfg, cache_dir)
    if trained:
        publish(remote and remote / key, cache_dir / key, "meta.json")
    return state


# a parent or stable-run task holds one trial rank's resources, GPUs included; the tasks are
# declared ``max_calls=1`` (a ``@ray.remote`` option): their worker exits when done, so its CUDA
# context and cached memory go with it
task_options = resources.task_options


def hashing_stage(child: TrainConfig) -> str:
    """The first stage of a parent task: hashing what determines the parent (a pretrained
    one's weight files: their size)."""
    src = child.parent.from_pretrained
    if src is None:
        return "hashing its inputs (its config)"
    size = sum(f.stat().st_size for f in Path(src).glob("*.safetensors"))
    return f"hashing its inputs ({size / 1e6:,.0f} MB of safetensors)"


@ray.remote(num_cpus=0, max_restarts=0)
class StartBoard:
    """The parent tasks that have started (each holds its resources then): the driver starts
    the trials only once every parent task has (:func:`start_parents`)."""

    def __init__(self) -> None:
        self.keys: set[str] = set()

    def mark(self, key: str) -> None:
        self.keys.add(key)

    def count(self) -> int:
        return len(self.keys)


@ray.remote(max_calls=1)
def _train_parent_task(child: TrainConfig, cache_dir: str, with_optimizer: bool = False,
                       planned_key: str | None = None, board: Any = None) -> dict[str, Any]:
    import_frozen(*TRAINING_STACK)
    check_reserved_device()
    if board is not None:
        ray.get(board.mark.remote(planned_key))
    t0 = time.time()
    remote, local = cache_paths(cache_dir)
    if planned_key is not None:  # the driver's key: the stage is shown while this hashes
        ProgressFile(local / f"{planned_key}.progress.json", 0).on_stage(hashing_stage(child))
    key = parent_key(child)
    steps = 0 if child.parent.from_pretrained is not None else child.parent_run().steps
    progress = ProgressFile(local / f"{key}.progress.json", steps)
    try:
        fetch(remote and remote / key, local / key, "meta.json")
        state, trained = train_parent(child, local, callbacks=(progress, *faults.stretch(
            "parent", steps)))
        if trained and (local / key / "meta.json").exists():  # the GPU Ray lent it; when
            resources.stamp_placement(local / key, started=t0)
            publish(remote and remote / key, local / key, "meta.json")
    except DivergenceError as e:  # the trials of this parent each report it as diverged
        return {"diverged": str(e), "step": e.step}
    finally:
        progress.path.unlink(missing_ok=True)
    return {**parent_payload(state, with_optimizer), "_trained_now": trained,
            "_seconds": time.time() - t0}


def _divergence(e: BaseException) -> DivergenceError | None:
    """The DivergenceError a failed TorchTrainer's ranks raised (Ray Train's
    ``WorkerGroupError.worker_failures``, each possibly wrapped by Ray), or None."""
    seen = [e, *getattr(e, "worker_failures", {}).values()]
    while seen:
        x = seen.pop()
        if isinstance(x, DivergenceError):
            return x
        seen += [c for c in (getattr(x, "cause", None), x.__cause__) if c is not None]
    return None


def _parent_rank(config: dict[str, Any]) -> None:
    """One rank of a data-parallel parent (Ray Train worker, ``torch.distributed`` set up):
    every rank trains, rank 0 marks the start board (every rank holds its resources now) and
    saves, stamps and publishes the parent as the one-rank task does."""
    import ray.train

    child, cache_dir = config["child"], config["cache_dir"]
    check_reserved_device()
    rank, t0 = ray.train.get_context().get_world_rank(), time.time()
    if rank == 0 and config["board"] is not None:
        ray.get(config["board"].mark.remote(config["planned_key"]))
    remote, local = cache_paths(cache_dir)
    key = parent_key(child)
    steps = child.parent_run().steps
    progress = ProgressFile(local / f"{key}.progress.json", steps)
    try:
        fit_parent(child, local / key, ((progress,) if rank == 0 else ()) +
                   faults.stretch("parent", steps), save=rank == 0)
        if rank == 0:
            resources.stamp_placement(local / key, started=t0)
            publish(remote and remote / key, local / key, "meta.json")
    finally:
        if rank == 0:
            progress.path.unlink(missing_ok=True)


@ray.remote(max_calls=1)
def _train_parent_ranks_task(spec: SweepSpec, child: TrainConfig, cache_dir: str,
                             with_optimizer: bool, planned_key: str, board: Any,
                             ranks: int) -> dict[str, Any]:
    """:func:`_train_parent_task` for a parent on ``ranks`` data-parallel ranks: a TorchTrainer
    (``sweeps.run.ranks``) whose workers hold the resources (this task holds none); its rank 0
    publishes the parent, which this task then reads back from the cache (fetched from object
    storage when the cache is a URL; a local cache must be shared by the nodes)."""
    t0 = time.time()
    remote, local = cache_paths(cache_dir)
    key = parent_key(child)
    fetch(remote and remote / key, local / key, "meta.json")
    state = cached_parent(local / key, key)
    trained = state is None
    if trained:
        try:
            rank_trainer(spec, _parent_rank, {"child": child, "cache_dir": cache_dir,
                                              "board": board, "planned_key": planned_key},
                         name=f"{spec.name}-parent-{key}", workers=ranks).fit()
        except Exception as e:  # noqa: BLE001 -- its trials report a divergence as theirs
            div = _divergence(e)
            if div is None:
                raise
            return {"diverged": str(div), "step": div.step}
        fetch(remote and remote / key, local / key, "meta.json")
        state = cached_parent(local / key, key)
        if state is None:
            raise FileNotFoundError(
                f"parent {key} trained on {ranks} ranks but {local / key} is not on this node: "
                "put storage.parent_cache on storage every node shares (or a URL)")
    elif board is not None:
        ray.get(board.mark.remote(planned_key))
    return {**parent_payload(state, with_optimizer), "_trained_now": trained,
            "_seconds": time.time() - t0, "_ranks": ranks}


def planned_ranks(spec: SweepSpec, plan: SweepPlan) -> dict[str, int]:
    """Ranks of each trained parent (``resources.parent_ranks``; ``auto`` against the GPUs the
    trials would hold at once on the running cluster, or on the nodes its autoscaler may add)."""
    r = spec.resources
    conc = spec.max_concurrent or plan.num_trials
    if r.gpus > 0:
        gpus = float(resources.ray_cluster().get("GPU", 0))  # autoscaler's node types too
        conc = min(conc, max(1, int(gpus // (r.gpus * r.ranks))))
    return parent_rank_counts(spec, plan, "cpu" if r.gpus == 0 else "gpu", conc)


class ProgressFile(Callback):
    """The run's last eval (step of steps, val loss, when the run started), or the stage of a
    parent that has no steps (loading a pretrained checkpoint, writing its cache) with the
    stage before it, in a small file the driver polls (:func:`progress_part` makes the ETA)."""

    def __init__(self, path: Path, steps: int):
        self.path, self.steps = path, steps
        self.started = time.time()
        self.stage: list[Any] | None = None

    def on_eval(self, metrics: dict[str, Any], checkpoint: Path | None) -> None:
        atomic_write_text(self.path, json.dumps({"step": metrics["step"], "steps": self.steps,
                                                 "val_loss": metrics.get("val_loss"),
                                                 "started": self.started}))

    def on_stage(self, text: str) -> None:
        now = time.time()
        prev = None if self.stage is None else [self.stage[0], now - self.stage[1]]
        self.stage = [text, now]
        atomic_write_text(self.path, json.dumps({"stage": text, "since": now, "prev": prev}))


def _mb(text: str) -> float | None:
    """The ``N MB`` size a stage's text names, or None."""
    m = re.search(r"([\d,.]+) MB", text)
    return float(m.group(1).replace(",", "")) if m else None


def stage_eta(p: dict[str, Any], now: float) -> str:
    """`` ETA ~N s`` of a parent's stage: the stage before it took ``t`` s for its size, this
    one is expected to take ``t`` × its size / that size (both name an ``N MB`` size); a
    trained parent: its seconds per step so far × the steps left. Empty when unknown."""
    if "stage" in p:
        prev = p.get("prev")
        a, b = _mb(p["stage"]), _mb(prev[0]) if prev else None
        if not (a and b):
            return ""
        left = float(prev[1]) * a / b - (now - float(p["since"]))
    elif p.get("started") is not None and p["step"] > 0:
        left = (now - float(p["started"])) / p["step"] * (p["steps"] - p["step"])
    else:
        return ""
    return f", ETA ~{secs(max(0.0, left))}"


def progress_part(key: str, p: dict[str, Any], now: float) -> str:
    """One parent's part of the progress line: its stage and for how long, or its last eval;
    with an ETA where one is known (:func:`stage_eta`)."""
    if "stage" in p:
        return f"{key[:8]} {p['stage']} ({now - float(p['since']):.0f} s{stage_eta(p, now)})"
    eta = stage_eta(p, now)
    return f"{key[:8]} step {p['step']}/{p['steps']} val {p['val_loss']:.4f}" + \
        (f" ({eta.removeprefix(', ')})" if eta else "")


def _wait_with_progress(what: str, tasks: dict[str, Any], progress: dict[str, Path],
                        every_s: float = 10.0) -> None:
    """Wait for Ray tasks, printing each unfinished one's step and val loss every ``every_s``
    (a parent that trains for minutes is not a silent minute)."""
    pending = dict(tasks)
    t0 = time.time()
    while pending:
        ready, _ = ray.wait(list(pending.values()), num_returns=len(pending), timeout=every_s)
        for k in [k for k, r in pending.items() if r in ready]:
            del pending[k]
        parts = []
        for k in pending:
            try:
                parts.append(progress_part(k, json.loads(progress[k].read_text()),
                                           time.time()))
            except (OSError, ValueError, KeyError, TypeError):
                parts.append(f"{k[:8]} waiting for its Ray worker (process start, "
                             f"imports; {time.time() - t0:.0f} s)")
        if pending:
            console.progress(f"{what}: {len(tasks) - len(pending)}/{len(tasks)} done; "
                             + "; ".join(parts))


def launch_parents(spec: SweepSpec, plan: SweepPlan, cache_dir: str | Path,
                   board: Any = None) -> dict[str, Any]:
    """Start one Ray task per distinct parent of the plan (its ranks' TorchTrainer for a parent
    on several ranks: ``resources.parent_ranks``); their ObjectRefs keyed by hash."""
    # max_retries=0: no lineage reconstruction; a parent lost with its node is read back from
    # the disk cache by the trials instead of being retrained.
    ranks = planned_ranks(spec, plan)
    refs = {key: _train_parent_ranks_task.options(num_cpus=0, max_retries=0).remote(
        spec, p.child, str(cache_dir), p.needs_optimizer, key, board, ranks[key])
        if ranks.get(key, 1) > 1 else
        _train_parent_task.options(**task_options(spec), max_retries=0)
        .remote(p.child, str(cache_dir), p.needs_optimizer, key, board)
        for key, p in plan.parents.items()}
    if refs:
        console.progress(f"preparing {len(refs)} parent(s) (cached by content hash in "
                         f"{cache_dir})")
    return refs


def settle_parents(refs: dict[str, Any], cache_dir: str | Path) -> dict[str, Any]:
    """Wait for every parent task (its progress shown) and put each payload from the driver;
    their ObjectRefs keyed by parent hash."""
    if not refs:
        return refs
    local = cache_paths(cache_dir)[1]
    _wait_with_progress("parents", refs, {k: local / f"{k}.progress.json" for k in refs})
    payloads = ray.get(list(refs.values()))  # a failure surfaces now
    report_diverged(dict(zip(refs, payloads)))
    # put from the driver: a task's return value lives on the node that ran it, and an
    # autoscaler never removes a node holding an object's primary copy
    return {key: ray.put(payload) for key, payload in zip(refs, payloads)}


def report_diverged(payloads: Mapping[str, Mapping[str, Any]]) -> None:
    for key, payload in payloads.items():
        if "diverged" in payload:
            console.progress(f"parent {key} {payload['diverged']}: its trials are "
                             "reported as diverged")


def train_parents(spec: SweepSpec, plan: SweepPlan, cache_dir: str | Path) -> dict[str, Any]:
    """Train every distinct parent of the plan once (in parallel Ray tasks) and return their
    ObjectRefs keyed by parent hash. The state lives in the object store as numpy arrays."""
    return settle_parents(launch_parents(spec, plan, cache_dir), cache_dir)


START_GRACE_S = 120.0
"""How long the driver waits for every parent task to start before it falls back to training
every parent first (their GPUs not free, or nodes still being added)."""


def start_parents(spec: SweepSpec, plan: SweepPlan, cache_dir: str | Path,
                  grace_s: float = START_GRACE_S) -> tuple[dict[str, Any], bool]:
    """Start every parent task and return (refs, True) once all of them have started: the
    trials may start now, each waiting in its set-up for its own parent's task
    (``get_parent``) while the other parents train (``sweeps.plan.schedule`` own_parent). A
    trial never takes a GPU that a parent still waits for, so none waits on a parent that
    cannot start. When not every one has started within ``grace_s``: every parent is trained
    first, as :func:`train_parents` does, and (refs, False)."""
    board = StartBoard.remote()
    refs = launch_parents(spec, plan, cache_dir, board)
    deadline = time.time() + grace_s
    try:
        while time.time() < deadline:  # refs: one per parent, and the plan has some (driver)
            if ray.get(board.count.remote()) >= len(refs):
                return refs, True
            ray.wait(list(refs.values()), num_returns=len(refs), timeout=1.0)
        console.progress(f"not every parent task started within {grace_s:g} s: training "
                         "every parent before the trials")
        return settle_parents(refs, cache_dir), False
    finally:
        ray.kill(board)


def stable_curve(curve: list[dict[str, Any]], every_steps: int) -> list[dict[str, Any]]:
    """The stable run's evals that a single run of any budget makes too (step 0 and every
    ``eval.every_steps``): the eval at the end of a stable run (or of one part of an extended
    one) is not one of them."""
    return [{k: v for k, v in m.items() if isinstance(v, (int, float, str, type(None)))}
            for m in curve if m["step"] % every_steps == 0]


def read_manifest(out_dir: Path) -> dict[str, Any]:
    """A stable run's manifest: ``checkpoints`` {token budget: path}, ``steps`` {step: path},
    ``curve``, ``peak`` and ``diverged_at`` (the step where it diverged, or None)."""
    path = out_dir / MANIFEST
    m = json.loads(path.read_text()) if path.exists() else {}
    return {"checkpoints": dict(m.get("checkpoints", {})), "steps": dict(m.get("steps", {})),
            "curve": list(m.get("curve", [])), "peak": m.get("peak"),
            "diverged_at": m.get("diverged_at")}


def _stable_run(m: Mapping[str, Any], every_steps: int) -> StableRun:
    return StableRun({int(k): v for k, v in m["checkpoints"].items()},
                     stable_curve(m["curve"], every_steps), m["peak"])


def train_stable_group(group: BranchGroup, parent: ParentState | None,
                       out_dir: Path, callbacks: tuple[Callback, ...] = ()) -> StableRun:
    """Train the group's stable run once (or reuse it from ``out_dir`` when it holds every
    budget's checkpoint)."""
    m, every = read_manifest(out_dir), group.representative.config.eval.every_steps
    if m["peak"] is not None and {str(t) for t in group.starts} <= set(m["checkpoints"]) and \
            all(Path(p).exists() for p in m["checkpoints"].values()):
        load_checkpoint(next(iter(m["checkpoints"].values())))  # checksum check
        return _stable_run(m, every)
    progress = ProgressFile(out_dir / "progress.json", group.steps[-1])
    try:
        res = train_stable(group.representative.config, out_dir, group.steps, parent=parent,
                           callbacks=(progress, *callbacks))
    finally:
        progress.path.unlink(missing_ok=True)
    m = {"checkpoints": {t: res.checkpoints[s] for t, s in group.starts.items()},
         "steps": {s: res.checkpoints[s] for s in group.steps},
         "curve": stable_curve(res.curve, every), "peak": res.peak_lr, "diverged_at": None}
    atomic_write_text(out_dir / MANIFEST, json.dumps(m))
    return _stable_run(m, every)


class _ManifestRecorder(Callback):
    """Puts each checkpoint of an extension into the manifest as soon as it is written (the
    manifest rewritten atomically), with the evals up to it: a crash mid-extension leaves a
    manifest that lists only complete checkpoints and keeps what was trained."""

    def __init__(self, out_dir: Path, manifest: dict[str, Any], budgets: Mapping[int, int],
                 every_steps: int):
        self.out_dir, self.m, self.budgets, self.every = out_dir, manifest, budgets, every_steps
        self.curve: dict[int, dict[str, Any]] = {c["step"]: c for c in manifest["curve"]}

    def on_eval(self, metrics: dict[str, Any], checkpoint: Path | None) -> None:
        for c in stable_curve([metrics], self.every):  # a retrained step keeps its row
            self.curve.setdefault(c["step"], c)

    def on_checkpoint(self, step: int, path: Path) -> None:
        self.m["steps"][str(step)] = str(path)
        self.m["checkpoints"].update({str(tok): str(path) for tok, s in self.budgets.items()
                                      if s == step})
        self.m["curve"] = [self.curve[k] for k in sorted(self.curve)]
        atomic_write_text(self.out_dir / MANIFEST, json.dumps(self.m))


def extend_stable(t: TrialPlan, parent: ParentState | None, out_dir: Path,
                  budgets: Mapping[int, int] | None = None) -> StableRun | None:
    """The stable run of ``t``'s branch group (in ``out_dir``) trained at least to ``t``'s
    decay start: reused when its checkpoint is there, else trained on from the furthest
    checkpoint before it (from scratch when there is none), saving a checkpoint at each start
    of ``budgets`` ({token budget: decay start}, the group's planned members) it passes. Under
    the group's file lock, so concurrent trials of a group never train it twice. None when the
    stable run diverged at or before that step: the trial then trains alone and reports its
    own divergence, as a grid trial does when its group's stable run diverged."""
    target, every = t.decay_start, t.config.eval.every_steps
    budgets = {**(budgets or {}), t.config.tokens: target}
    with FileLock(out_dir.parent / f"{out_dir.name}.lock"):  # as get_parent's
        m = read_manifest(out_dir)
        if m["diverged_at"] is not None and m["diverged_at"] <= target:
            return None
        have = {int(s): p for s, p in m["steps"].items() if Path(p).exists()}
        if target not in have:
            base = max((s for s in have if s < target), default=0)
            m["peak"] = run_schedule(t.config, parent, Phase.stable(target)).peak
            rec = _ManifestRecorder(out_dir, m, budgets, every)
            try:
                train_stable(t.config, out_dir, [s for s in budgets.values()
                                                 if base < s <= target],
                             parent=parent, callbacks=(rec,), resume_from=have.get(base))
            except DivergenceError as e:
                m["diverged_at"] = e.step
                atomic_write_text(out_dir / MANIFEST, json.dumps(m))
                return None
        elif m["checkpoints"].get(str(t.config.tokens)) != have[target]:
            m["checkpoints"][str(t.config.tokens)] = have[target]
            atomic_write_text(out_dir / MANIFEST, json.dumps(m))
    return _stable_run(m, every)


@ray.remote(max_calls=1)
def _train_stable_task(group: BranchGroup, parents: dict[str, Any], cache_dir: str,
                       out_dir: str) -> StableRun | None:
    check_reserved_device()
    rep = group.representative
    remote, local = cache_paths(out_dir)
    try:
        parent = get_parent(rep.config, rep.parent_key, parents, cache_dir)
        fetch(remote, local, MANIFEST)
        run = train_stable_group(group, parent, local, (resources.PlacementStamp(),))
        publish(remote, local, MANIFEST)
        return run if remote is None else dataclasses.replace(run, source=out_dir)
    except DivergenceError:  # no shared stable run: each trial trains (and reports) alone
        return None


def train_stables(spec: SweepSpec, plan: SweepPlan, refs: dict[str, Any],
                  cache_dir: str | Path, results_dir: str | Path) -> dict[str, StableRun]:
    """Train each WSD stable run shared by a token-budget grid once; trials branch off it."""
    groups = plan.branch_groups
    if not groups:
        return {}
    console.progress(f"training {len(groups)} shared WSD stable run(s) for "
                     f"{sum(len(g.starts) for g in groups.values())} token budgets")
    dirs = {k: join_uri(str(results_dir), "stable", k) for k in groups}
    tasks = {k: _train_stable_task.options(**task_options(spec)).remote(
        g, dict(refs), str(cache_dir), dirs[k]) for k, g in groups.items()}
    _wait_with_progress("stable runs", tasks,
                        {k: cache_paths(dirs[k])[1] / "progress.json" for k in tasks})
    runs = {k: ray.get(t) for k, t in tasks.items()}
    return {k: r for k, r in runs.items() if r is not None}

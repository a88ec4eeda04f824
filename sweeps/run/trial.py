"""The Tune function trainable: one trial = one ``moe_core.train.Trainer`` run on the DeepSpeed
engine, with one rank or, as a Ray Train TorchTrainer inside the Tune trial, several.

The trial's ``TrialPlan`` comes from the sweep plan, its parent and WSD stable run from
``sweeps.run.parents``. Every evaluation is reported, with a checkpoint where the spec's
``checkpoint:`` cadence says so (:class:`CheckpointCadence`): a failed trial restarts from its
last checkpoint and replays the evals after it. A diverged trial reports a final row with
``status="diverged"`` and ends normally.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import ray
from ray import tune

from moe_core.errors import DivergenceError
from moe_core.lazy import TRAINING_STACK, import_frozen, lazy_function
from moe_core.outdir import claim_out_dir
from moe_core.params import count_params
from moe_core.schedules import Phase, run_schedule
from moe_core.train.callbacks import Callback, ParentState
from scaling.predict import Calibration, Curve, predict_final
from sweeps.plan import resources
from sweeps.plan.build import SweepPlan, TrialPlan, extends_stable
from sweeps.plan.devices import check_reserved_device
from sweeps.run import compile_stats
from sweeps.run.not_retried import DETERMINISTIC, fail_once, failed_row
from sweeps.run.parents import (
    MANIFEST,
    StableRun,
    cache_paths,
    extend_stable,
    fetch,
    fetch_stable,
    get_parent,
    publish,
)
from sweeps.run.preemption import PreemptionWatch, RankWatch, this_node
from sweeps.run.ranks import rank_trainer, train_storage
from sweeps.run.setup_progress import SetupBoard, board_dir
from sweeps.spec.sweep import CheckpointSpec, SweepSpec
from sweeps.store.results import (
    FINAL_EVAL,
    STEP0_EVAL,
    config_columns,
    json_safe,
    knob_columns,
)
from sweeps.store.storage import join_uri, publishing, staging_dir
from sweeps.testing import faults

# torch, the model and DeepSpeed load when a trial runs (in its Ray worker), not when the sweep
# driver imports this module to hand ``run_trial`` to Tune
save_moe = lazy_function("moe_core.hf.save", "save_moe")
save_run_tokenizer = lazy_function("moe_core.hf.tokenizer", "save_run_tokenizer")
audit_knobs = lazy_function("moe_core.train.audit", "check")
Trainer = lazy_function("moe_core.train.loop", "Trainer")


class TrialReporter(Callback):
    """Reports each eval, with the checkpoint written at its step, in one call.

    ``report(row, checkpoint)`` is ``tune.report`` in a single-rank trial and
    ``ray.train.report`` on every rank of a multi-rank trial (where each rank attaches its own
    folder of the checkpoint, and Ray Train uploads them all into one). Once a
    checkpoint is reported (Ray has copied it, synchronously), the one reported before it is
    deleted: one local checkpoint per trial, besides the ones Tune keeps."""

    def __init__(self, static: dict[str, Any], report: Callable[..., None],
                 checkpoint_cls: Any, attach: bool = True,
                 predictor: PostDecayPredictor | None = None,
                 extra: Callable[[], dict[str, Any]] | None = None):
        self.static, self._report, self._ckpt_cls = static, report, checkpoint_cls
        self.attach, self.predictor = attach, predictor
        self.extra = extra  # columns measured at each eval (compile_stats.snapshot)
        self._latest: Path | None = None

    def row(self, m: dict[str, Any]) -> dict[str, Any]:
        out = {**self.static, **{k: v for k, v in m.items() if not isinstance(v, (list, dict))},
               "D2": m["tokens"], "flops": 6 * self.static["N2"] * m["tokens"], "status": "running"}
        if self.extra is not None:
            out.update(self.extra())
        if self.predictor is not None:
            out["predicted_final"] = self.predictor.observe(m["step"], m["val_loss"])
        return json_safe(out)

    def on_eval(self, metrics: dict[str, Any], checkpoint: Path | None) -> None:
        self.parent_loss_from([(metrics.get("step"), metrics.get("val_loss"))])
        self.report(self.row(metrics), checkpoint)

    def on_resume(self, evals: Sequence[tuple[int, float]]) -> None:
        """A restarted trial (or a branch) predicts from its whole curve, not just the evals
        after the checkpoint it resumed from."""
        self.parent_loss_from(evals)
        if self.predictor is not None:
            self.predictor.seed(evals)

    def parent_loss_from(self, evals: Sequence[tuple[Any, Any]]) -> None:
        """A ``parent.from_pretrained`` parent is loaded, never evaluated: its loss in every
        row (``parent_val_loss``, ``parent_loss_source: step-0 eval``) is the trial's step-0
        eval, the freshly upcycled model, taken from that eval or, resumed, from the lineage's
        evals the checkpoint recorded."""
        if self.static.get("parent_loss_source") != STEP0_EVAL or \
                self.static.get("parent_val_loss") is not None:
            return
        for step, loss in evals:
            if step == 0 and isinstance(loss, (int, float)) and math.isfinite(loss):
                self.static["parent_val_loss"] = float(loss)

    def report(self, row: dict[str, Any], checkpoint: Path | None = None) -> None:
        ckpt = None
        if checkpoint is not None and self.attach:
            ckpt = self._ckpt_cls.from_directory(str(checkpoint))
        self._report(row, checkpoint=ckpt)
        if ckpt is not None:
            prev, self._latest = self._latest, Path(checkpoint)
            if prev is not None and prev != self._latest:
                shutil.rmtree(prev, ignore_errors=True)

    def diverged(self, e: DivergenceError, tokens_per_step: int, wall_s: float) -> None:
        """The trial's final row: diverged at ``e.step`` (the trial then ends normally)."""
        row = dict(self.static)
        row.update(status="diverged", reason=str(e), step=e.step, tokens=e.step *
                   tokens_per_step, wall_s=wall_s, val_loss=None, train_loss=None)
        self._report(json_safe(row), checkpoint=None)


class PostDecayPredictor:
    """``predicted_final`` of each eval row: the loss the trial is predicted to reach after its
    WSD decay (``scaling.predict``), from its evals so far and its own LR schedule."""

    def __init__(self, method: str, cal: Calibration, lrs: tuple[float, ...], decay_start: int,
                 tokens_per_step: int):
        self.method, self.cal = method, cal
        self.curve = Curve((), (), lrs, decay_start, tokens_per_step)

    @classmethod
    def for_trial(cls, method: str, cal: Calibration, t: TrialPlan,
                  parent: ParentState | None) -> PostDecayPredictor:
        plan = run_schedule(t.config, parent, Phase.full())
        lrs = tuple(plan.lr(i) for i in range(plan.end_step))
        s = plan.schedule
        start = s.decay_start if s.kind == "wsd" and s.decay_steps > 0 else plan.end_step
        return cls(method, cal, lrs, start, t.config.tokens_per_step)

    def seed(self, evals: Sequence[tuple[int, float]]) -> None:
        """The evals reported before a resume (``Callback.on_resume``), without predicting:
        they replace what this predictor holds from their first step on."""
        if not evals:
            return
        c, first = self.curve, min(int(s) for s, _ in evals)
        old = [(s, v) for s, v in zip(c.steps, c.losses, strict=True) if s < first]
        merged = sorted({int(s): float(v) for s, v in [*old, *evals]}.items())
        self.curve = Curve(tuple(s for s, _ in merged), tuple(v for _, v in merged),
                           c.lrs, c.decay_start, c.tokens_per_step)

    def observe(self, step: int, loss: float) -> float:
        self.seed([(step, loss)])  # a replayed eval replaces the evals from its step on
        if not math.isfinite(loss):
            return math.nan
        return predict_final(self.curve, self.cal, self.method)


def static_columns(spec: SweepSpec, t: TrialPlan, parent: ParentState | None,
                   trial_id: str) -> dict[str, Any]:
    """The columns every row of the trial carries (see ``sweeps.store.results``)."""
    cfg = t.config
    pc = count_params(cfg.model_config())
    kind = "dense" if cfg.moe is None else "moe"
    n1, d1, lp, src = pc.non_embedding_total, 0, None, None
    if parent is not None:
        kind = "upcycled" if cfg.upcycle.method != "continue" else kind
        n1, d1 = count_params(parent.model_config).non_embedding_total, parent.tokens
        if cfg.parent is not None and cfg.parent.from_pretrained is not None:
            d1 = d1 or cfg.parent.tokens or 0  # D1 from the spec when the user knows it
        lp = parent.val_loss if math.isfinite(parent.val_loss) else None
        src = FINAL_EVAL if lp is not None else (
            STEP0_EVAL if cfg.parent is not None and cfg.parent.from_pretrained else None)
    return {
        "sweep": spec.name, "trial_id": trial_id, "parent_key": t.parent_key or "",
        "kind": kind, "seed": cfg.seed, "N1": n1, "N2": pc.non_embedding_active,
        "N_total": pc.non_embedding_total, "D1": d1, "reason": None,
        "ranks": spec.resources.ranks, "parent_val_loss": lp, "parent_loss_source": src,
        **config_columns(cfg.to_dict()), **knob_columns(t.knobs),
    }


class CheckpointCadence:
    """The spec's ``checkpoint:`` section as the Trainer's ``should_checkpoint(step, is_last)``,
    asked at each eval: every ``every_evals``-th eval (by step, so a restarted trial keeps the
    same steps), the first eval ``every_minutes`` after the trial's (re)start or its last
    checkpoint, the last step (``at_end``), and whenever ``now()`` says so (a preemption
    notice: ``sweeps.run.preemption``). Every eval is reported either way."""

    def __init__(self, spec: CheckpointSpec, eval_every_steps: int,
                 clock: Callable[[], float] = time.monotonic,
                 now: Callable[[], bool] | None = None):
        self.spec, self.eval_every, self.clock, self.now = spec, eval_every_steps, clock, now
        self.since = clock()

    def __call__(self, step: int, is_last: bool) -> bool:
        s = self.spec
        due = (is_last and s.at_end) or (self.now is not None and self.now()) or (
            s.every_evals is not None and step % (s.every_evals * self.eval_every) == 0) or (
            s.every_minutes is not None and self.clock() - self.since >= 60 * s.every_minutes)
        if due:
            self.since = self.clock()
        return due


def export_hf(state: Any, cfg: Any, out: Path) -> str:
    """A finished trial's model as a Hugging Face folder at ``out`` (``export: hf``): refused
    when ``out`` holds files this project did not write (``moe_core.outdir``); the folder
    appears atomically with its marker inside."""
    claim_out_dir(out, what="export folder")
    return save_moe(state, cfg, out)  # which leaves the marker inside


def free_accelerator_memory() -> None:
    """Hand the CUDA caching allocator's blocks back once a trial's objects are gone: a reused
    Tune actor (or a trial sharing the GPU) must not find them still reserved. On the host, the
    C allocator's freed heap goes back to the OS too (:func:`trim_heap`)."""
    import torch

    gc.collect()
    trim_heap()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def trim_heap() -> bool:
    """glibc's ``malloc_trim(0)``: return the freed heap of every malloc arena to the OS.

    A reused Tune actor runs each trial in a new thread, so in another arena: without this the
    real-model sweep's second trial found the first's 4.5 GB still held (freed, not returned)
    and peaked at 8.1 GB instead of 5.2 (docs/own-checkpoint.md). False where there is no
    glibc (macOS, musl)."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return False
    trim(0)
    return True


def _restored_checkpoint(work: Path) -> Path | None:
    """This trial's own last checkpoint when Tune restarts it (a failure, a resumed sweep)."""
    ck = tune.get_checkpoint()
    if ck is None:
        return None
    dest = work / "resume"
    with ck.as_directory() as d:
        shutil.copytree(d, dest)
    return dest


@dataclass(frozen=True)
class TrialContext:
    """What every trial of a sweep shares, built once by the driver and handed to
    :func:`run_trial` (through ``tune.with_parameters``) as one argument."""

    spec: SweepSpec
    plan: SweepPlan
    parents: dict[str, Any]
    """Parent key → its ObjectRef (carried inside this dict, so Ray does not resolve it early)."""
    cache_dir: str
    """The parent cache (a folder or an object-storage URL)."""
    stables: dict[str, StableRun] | None = None
    """Branch-group key → its trained WSD stable run (grid sweeps with branches)."""
    report: Callable[..., None] = tune.report
    export_dir: str | None = None
    """Spec ``export: hf``: the final model is written here, in ``<trial_id>/``."""
    predictor: tuple[str, Calibration] | None = None
    """(method, calibration): adds ``predicted_final`` to every row
    (``scheduler.rung_metric: predicted_final``)."""
    stable_dir: str | None = None
    """``algorithm: law``: where branch groups' stable runs are trained on demand."""
    stable_starts: Mapping[str, Mapping[int, int]] | None = None
    """``algorithm: law``: per group, its candidates' ``{budget: decay start}``."""


@fail_once(static_columns)  # a ConfigError: failed once, in one line, not retried by Tune
def run_trial(config: dict[str, Any], ctx: TrialContext) -> None:
    """Tune function trainable. ``config`` holds the search point (dotted keys); ``ctx`` what
    the sweep's trials share (:class:`TrialContext`). A trial that extends its group's stable
    run on demand (``ctx.stable_dir``) counts that run's seconds in its ``wall_s``, as a grid
    branch's does."""
    spec, plan, parents, cache_dir = ctx.spec, ctx.plan, ctx.parents, ctx.cache_dir
    import_frozen(*TRAINING_STACK)
    t = plan.trial(spec, config)
    trial_id = tune.get_context().get_trial_id()
    board = setup_board(spec, t, cache_dir, trial_id)
    if t.parent_key is not None:
        ref = parents.get(t.parent_key)
        training = ref is not None and not ray.wait([ref], timeout=0)[0]
        board.on_stage(f"parent: {t.parent_key[:8]} from the object store"
                       f"{' (still training: waiting for it)' if training else ''}"
                       f"{'' if ref is not None else ' (else its disk cache)'}")
    try:
        parent = _start(t, parents, cache_dir)
    except DivergenceError as e:  # its parent diverged: a row that says so, not a crash
        TrialReporter(static_columns(spec, t, None, trial_id), ctx.report, tune.Checkpoint
                      ).diverged(e, t.config.tokens_per_step, 0.0)
        return
    static = static_columns(spec, t, parent, trial_id)
    work = Path(tempfile.mkdtemp(prefix="trial-"))
    try:
        resume_from = _restored_checkpoint(work)
        group = plan.branch_of(t) if ctx.stables else None
        st = ctx.stables.get(group.key) if group is not None else None
        on_demand = ctx.stable_dir is not None and extends_stable(spec, t)
        if on_demand and resume_from is None:  # trained on demand: what the stable run lacks
            starts = {**plan.branch_starts(t), **(ctx.stable_starts or {}).get(t.stable_key, {})}
            # on object storage: this node's staging copy, fetched first and published after
            remote, local = cache_paths(join_uri(ctx.stable_dir, t.stable_key))
            fetch(remote, local, MANIFEST)
            st = extend_stable(t, parent, local, starts)
            publish(remote, local, MANIFEST)
        pred = None if ctx.predictor is None else \
            PostDecayPredictor.for_trial(*ctx.predictor, t, parent)
        reporter = TrialReporter(static, ctx.report, tune.Checkpoint, predictor=pred,
                                 extra=compile_stats.snapshot)
        if st is not None or (on_demand and resume_from is not None):
            # a WSD decay branch of the group's shared stable run
            static["branch_from_step"] = t.decay_start
            if resume_from is None:
                for m in st.curve:  # the stable phase's evals are this trial's too
                    if m["step"] <= t.decay_start:
                        reporter.report(reporter.row(m))
                fetch_stable(st)  # on object storage: this node's copy
                resume_from = Path(st.checkpoints[t.config.tokens])
        run = RankRun(trial=t, static=static, checkpoint=spec.checkpoint, predictor=ctx.predictor,
                      export_dir=ctx.export_dir, parents=parents, cache_dir=cache_dir,
                      resume=str(resume_from) if resume_from else None, stable=st)
        if spec.resources.ranks > 1:
            run_multi_rank(spec, run)
        else:
            fit_rank(run, parent, resume_from, work / "ckpt", reporter, board=board,
                     watch=_watch(spec.checkpoint, reporter))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        free_accelerator_memory()


@dataclass(frozen=True)
class RankRun:
    """What a rank trains (a single-rank trial is rank 0 of one): built once per trial by
    :func:`run_trial`, and handed as is to each Ray Train worker of a multi-rank trial."""

    trial: TrialPlan
    static: Mapping[str, Any]
    """The columns every row of the trial carries (:func:`static_columns`)."""
    checkpoint: CheckpointSpec
    predictor: tuple[str, Calibration] | None = None
    export_dir: str | None = None
    parents: Mapping[str, Any] = field(default_factory=dict)
    """Parent key → its ObjectRef (each rank fetches its parent on its own node)."""
    cache_dir: str = ""
    resume: str | None = None
    """The checkpoint the trial restarts or branches from."""
    stable: StableRun | None = None
    """A WSD branch's stable run (fetched on each rank's node)."""
    ckpt_root: str | None = None
    """Multi-rank: the node-local root of the ranks' checkpoint folders (``rank<r>``)."""


def setup_board(spec: SweepSpec, t: TrialPlan, cache_dir: str, trial_id: str) -> SetupBoard:
    """The trial's set-up board (``sweeps.run.setup_progress``): parent, data, model, engine,
    knob audit, first eval; one stage more for a checkpoint read and one less without a
    parent."""
    n = count_params(t.config.model_config()).total
    stages = 5 + (t.parent_key is not None)
    return SetupBoard(board_dir(cache_paths(cache_dir)[1], spec.name) / f"{trial_id}.json",
                      4 * n, stages, node=resources.node_id())


def _start(t: TrialPlan, parents: Mapping[str, Any], cache_dir: str) -> ParentState | None:
    """Every rank's set-up: refuse a GPU reservation without CUDA (one line, before any
    training), no dynamo cache from a reused actor's earlier trials, and the trial's parent."""
    check_reserved_device()
    compile_stats.start_trial()
    return get_parent(t.config, t.parent_key, parents, cache_dir)


def _watch(c: CheckpointSpec, reporter: TrialReporter, rank: int | None = None,
           device: Any = None) -> PreemptionWatch | RankWatch | None:
    """The trial's watch for its node's preemption notice (``checkpoint.on_preemption``); with
    ``rank`` (a multi-rank trial) each rank's watch of its own node, agreed among the ranks at
    a bounded cadence (``RankWatch``, collectives on ``device``); its timings join every row
    the reporter builds."""
    if not c.on_preemption:
        return None
    own = PreemptionWatch(this_node(), c.preemption_poll_s)
    watch = own if rank is None else RankWatch(own, rank, device)
    extra = reporter.extra
    reporter.extra = lambda: {**(extra() if extra else {}), **watch.columns()}
    return watch


def fit_rank(run: RankRun, parent: ParentState | None, resume_from: Path | None,
             out_dir: Path, reporter: TrialReporter, *, rank: int = 0,
             per_rank: bool = False, board: SetupBoard | None = None,
             watch: PreemptionWatch | RankWatch | None = None) -> None:
    """Train one rank of the trial to its end (or its divergence, reported as the final row);
    with ``export_dir`` every rank gathers its experts and rank 0 writes the model. ``board``
    hears each set-up stage up to the first eval (``sweeps.run.setup_progress``). With
    ``watch`` a preemption notice checkpoints at once (every rank at the same step: its
    ``should_stop`` is asked first, every step, on every rank) and raises ``Preempted`` once that
    checkpoint is reported."""
    t = run.trial
    if board is not None:
        board.state["of"] += resume_from is not None  # a checkpoint to read
    trainer = Trainer(t.config, parent=parent, resume_from=resume_from, phase=Phase.full(),
                      out_dir=out_dir, out_dir_per_rank=per_rank,
                      callbacks=tuple(c for c in (watch, board, reporter) if c is not None)
                      + faults.stretch("trial", t.config.steps),
                      should_checkpoint=CheckpointCadence(
                          run.checkpoint, t.config.eval.every_steps,
                          now=None if watch is None else watch.due))
    say = board.on_stage if board is not None else (lambda _: None)
    say(f"audit: reading {len(t.knobs)} knob(s) back from the engine")
    reporter.static.update(audit_knobs(trainer))  # the knobs read back; one line if one differs
    c = t.config
    say(f"first eval: {c.eval.batches} batches of {c.batch.micro_batch} x {c.seq_len}"
        f"{', compiling the model' if trainer.model.compiled else ''}" if trainer.fresh else
        f"training to the first eval (from step {trainer.step_count})")
    try:
        if watch is not None:
            watch.start()
        trainer.fit()
    except DivergenceError as e:  # every rank sees the same all-reduced loss
        reporter.diverged(e, t.config.tokens_per_step, trainer.elapsed())
        return
    finally:
        if watch is not None:
            watch.close()
    if watch is not None:
        watch.check(trainer.step_count, trainer.plan.end_step)
    if run.export_dir is not None:
        state = trainer.full_model_state()
        if rank == 0:
            with publishing(join_uri(run.export_dir, run.static["trial_id"]),
                            "config.json") as dest:
                export_hf(state, trainer.model.config, dest)  # with the run's tokenizer
                p = t.config.parent
                save_run_tokenizer(dest, t.config.data,
                                   parent_dir=p.from_pretrained if p else None)


# ---- multi-rank trials: a Ray Train TorchTrainer inside the Tune trial ---------------------------


def _train_worker(config: dict[str, Any]) -> None:
    """Ray Train worker: one DeepSpeed rank (torch.distributed already set up by Ray Train) of
    ``config["run"]``, a :class:`RankRun`. A deterministic configuration error
    (``sweeps.run.not_retried``) fails alike on every rank: each reports the trial's failed row
    once and returns, so neither Ray Train nor Tune retries it."""
    import ray.train

    run: RankRun = config["run"]
    try:
        _train_rank(run)
    except DETERMINISTIC as e:
        ray.train.report(json_safe(failed_row(None, lambda: dict(run.static), e)))


def _train_rank(run: RankRun) -> None:
    import ray.train.torch

    import_frozen(*TRAINING_STACK)
    t = run.trial
    parent = _start(t, run.parents, run.cache_dir)
    rank = ray.train.get_context().get_world_rank()
    own = Path(run.ckpt_root) / f"rank{rank}"  # this rank's node-local folder, unshared
    resume = run.resume
    if run.stable is not None:  # a WSD branch: its stable run's checkpoint, on this node
        fetch_stable(run.stable)
    ck = ray.train.get_checkpoint()  # a worker-group restart after a failure
    if ck is not None:
        resume = local_checkpoint(ck, own / "resume")
    report = ray.train.report if rank else faults.report_function(
        cache_paths(run.cache_dir)[1], ray.train.report, lambda: run.static["trial_id"])
    # every rank attaches its own files: Ray Train uploads them all into one checkpoint folder
    # and commits it once every rank's report (after its upload) is in
    reporter = TrialReporter(dict(run.static), report, ray.train.Checkpoint,
                             predictor=None if run.predictor is None else
                             PostDecayPredictor.for_trial(*run.predictor, t, parent),
                             extra=compile_stats.snapshot)
    fit_rank(run, parent, resume, own, reporter, rank=rank, per_rank=True,
             watch=_watch(run.checkpoint, reporter, rank, ray.train.torch.get_device()))


def local_checkpoint(ck: Any, dest: Path) -> Path:
    """A Ray Train checkpoint as a local folder: its own path on a local filesystem (shared
    storage), else downloaded whole (every rank's files; through the signed filesystem, so each
    object's digest is checked) into ``dest``, this rank's own."""
    if isinstance(ck.filesystem, pafs.LocalFileSystem):
        return Path(ck.path)
    shutil.rmtree(dest, ignore_errors=True)
    return Path(ck.to_directory(str(dest)))


def run_multi_rank(spec: SweepSpec, run: RankRun) -> None:
    """Run the trial as a TorchTrainer with ``resources.ranks`` workers (expert parallelism across
    them), which hold the trial's resources (the Tune trial reserves none); metrics reach Tune
    through ``TuneReportCallback``. The ranks may share no local folder: each writes its
    checkpoint files in its own staging folder, Ray Train uploads every rank's files into one
    checkpoint folder under ``<results>/train`` and commits it after all ranks reported; a
    restarted rank downloads it whole."""
    from ray.tune.integration.ray_train import TuneReportCallback

    trial_id = run.static["trial_id"]
    # each rank writes into its own subfolder (``rank<r>``), on its own node
    ckpt_root = staging_dir(train_storage(spec)) / "rank_checkpoints" / trial_id
    rank_trainer(spec, _train_worker, {"run": dataclasses.replace(run, ckpt_root=str(ckpt_root))},
                 name=f"{spec.name}-{trial_id}", workers=spec.resources.ranks,
                 max_failures=spec.max_failures, keep=spec.checkpoint.keep,
                 callbacks=[TuneReportCallback()]).fit()

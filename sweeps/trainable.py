"""The Tune function trainable: one trial = one ``moe_core.train`` run on the DeepSpeed engine.

The trial's parent arrives as numpy arrays through Ray's object store (``ray.get`` of an
ObjectRef carried inside a dict, so Ray does not resolve it early); when the object is gone
(its node died) the trial falls back to the parent's disk cache. Each evaluation is reported with
a checkpoint, so a failed trial restarts from its last eval and a resumed sweep reruns nothing
finished. A diverged trial reports a final row with ``status="diverged"`` and ends normally.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
from ray import tune

from moe_core.errors import DivergenceError
from moe_core.params import count_params
from moe_core.train.runner import load_parent, parent_key, train_parent
from moe_core.train.trainer import Callback, ParentState, train
from sweeps.spec import SweepSpec, knob_values, trial_config

# Test hook: raise inside the trainable once, after this many reports (fault-tolerance tests).
FAIL_ONCE_ENV = "UPCYCLE_SWEEPS_FAIL_ONCE_AFTER"


class _TuneReporter(Callback):
    """Reports each eval to Tune together with the checkpoint written right after it."""

    def __init__(self, static: dict[str, Any], fail_after: int | None, marker: Path | None):
        self.static = static
        self.pending: dict[str, Any] | None = None
        self.reports = 0
        self.fail_after = fail_after
        self.marker = marker

    def row(self, m: dict[str, Any]) -> dict[str, Any]:
        out = dict(self.static)
        out.update({k: v for k, v in m.items() if not isinstance(v, (list, dict))})
        out["D2"] = m["tokens"]
        out["flops"] = 6 * self.static["N2"] * m["tokens"]
        out["status"] = "running"
        return out

    def on_eval(self, metrics: dict[str, Any]) -> None:
        row = self.row(metrics)
        if metrics["step"] == 0 or math.isnan(metrics.get("train_loss", math.nan)):
            self._report(row, None)
        else:
            self.pending = row

    def on_checkpoint(self, step: int, path: Path) -> None:
        if self.pending is not None:
            self._report(self.pending, path)
            self.pending = None

    def _report(self, row: dict[str, Any], path: Path | None) -> None:
        ckpt = tune.Checkpoint.from_directory(str(path)) if path is not None else None
        tune.report(_clean(row), checkpoint=ckpt)
        self.reports += 1
        if self.fail_after is not None and self.reports >= self.fail_after and \
                self.marker is not None and not self.marker.exists():
            self.marker.write_text("failed once")
            raise RuntimeError(f"injected failure after {self.reports} reports (test hook)")


def _clean(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}


def get_parent(cfg, parents: dict[str, Any], cache_dir: Path) -> tuple[ParentState | None, str]:
    """The trial's parent: object store first, then the disk cache (training it if absent)."""
    if cfg.parent is None:
        return None, ""
    key = parent_key(cfg)
    ref = parents.get(key)
    if ref is not None:
        try:
            payload = ray.get(ref, timeout=600)
            return ParentState(**payload), key
        except Exception:  # object lost with its node: fall back to the disk cache
            pass
    if (cache_dir / key / "meta.json").exists():
        return load_parent(cache_dir / key), key
    with _file_lock(cache_dir / f"{key}.lock"):
        state, _ = train_parent(cfg, cache_dir)
    return state, key


class _file_lock:
    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(self.path, "w")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        import fcntl

        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def static_columns(spec: SweepSpec, cfg, point: dict[str, Any], pkey: str,
                   parent: ParentState | None) -> dict[str, Any]:
    from sweeps.results import flatten_config

    mc = cfg.model_config()
    pc = count_params(mc)
    kind = "dense" if cfg.moe is None else "moe"
    n1 = pc.non_embedding_total
    d1 = 0
    if parent is not None:
        kind = "upcycled" if cfg.upcycle.method != "continue" else kind
        n1 = count_params(parent.model_config).non_embedding_total
        d1 = parent.tokens
    row = {
        "sweep": spec.name, "trial_id": tune.get_context().get_trial_id(), "parent_key": pkey,
        "kind": kind, "seed": cfg.seed, "N1": n1, "N2": pc.non_embedding_active,
        "N_total": pc.non_embedding_total, "D1": d1, "reason": None,
        "ranks": spec.resources.ranks,
    }
    row.update(flatten_config(cfg.to_dict()))
    row.update({f"knob.{k}": v for k, v in knob_values(spec, point).items()})
    return row


def run_trial(config: dict[str, Any], spec: SweepSpec, parents: dict[str, Any],
              cache_dir: str, stables: dict[str, Any] | None = None) -> None:
    """Tune function trainable. ``config`` holds the search point (dotted keys)."""
    point = {k: v for k, v in config.items()}
    cfg = trial_config(spec, point)
    cache = Path(cache_dir)
    parent, pkey = get_parent(cfg, parents, cache)
    static = static_columns(spec, cfg, point, pkey, parent)
    fail_after = os.environ.get(FAIL_ONCE_ENV)
    marker = None
    if fail_after:
        marker = cache / f".failed-{static['trial_id']}"
    reporter = _TuneReporter(static, int(fail_after) if fail_after else None, marker)
    work = Path(tempfile.mkdtemp(prefix="trial-"))
    resume_from = None
    ck = tune.get_checkpoint()
    if ck is not None:
        resume_from = work / "resume"
        with ck.as_directory() as d:
            shutil.copytree(d, resume_from)
    eval_steps = report_steps(cfg)
    t0 = time.perf_counter()
    eval_at_start = resume_from is None
    branch = _branch_for(spec, point, cfg, stables or {})
    if branch is not None:  # a WSD decay branch of the group's shared stable run
        start_ckpt, stable_curve, start_step = branch
        static["branch_from_step"] = start_step
        if resume_from is None:
            for m in stable_curve:  # the stable phase's evals are this trial's too
                if m["step"] <= start_step:
                    reporter._report(reporter.row(m), None)
            resume_from = Path(start_ckpt)
        eval_at_start = False
        eval_steps = [s for s in eval_steps if s > start_step]
    if spec.resources.ranks > 1:
        run_multi_rank(spec, point, parents, cache_dir, static, resume_from, eval_at_start)
        shutil.rmtree(work, ignore_errors=True)
        return
    try:
        train(cfg, out_dir=work / "ckpt", callbacks=(reporter,), parent=parent,
              resume_from=resume_from, checkpoint_steps=eval_steps,
              eval_at_start=eval_at_start)
    except DivergenceError as e:
        row = dict(static)
        row.update(status="diverged", reason=str(e), step=e.step,
                   tokens=e.step * cfg.tokens_per_step, wall_s=time.perf_counter() - t0,
                   val_loss=None, train_loss=None)
        tune.report(_clean(row))
        return
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report_steps(cfg) -> list[int]:
    """Steps whose eval is reported with a checkpoint: every ``eval.every_steps`` and always the
    last step (a run shorter than the eval period, or a WSD branch starting after the last
    periodic eval, still reports its final eval)."""
    every = cfg.eval.every_steps
    return sorted(set(range(every, cfg.steps + 1, every)) | {cfg.steps})


def _branch_for(spec: SweepSpec, point: dict[str, Any], cfg, stables: dict[str, Any]):
    """(checkpoint, stable curve, decay-start step) when this trial is a WSD branch."""
    if not stables:
        return None
    from sweeps.branches import decay_start, stable_key

    st = stables.get(stable_key(spec, point))
    if st is None or cfg.tokens not in st["checkpoints"]:
        return None
    return st["checkpoints"][cfg.tokens], st["curve"], decay_start(cfg)


def parent_payload(state: ParentState) -> dict[str, Any]:
    """What goes into the object store: numpy arrays + small metadata (no torch tensors)."""
    return {
        "model_state": state.model_state, "model_config": state.model_config,
        "peak_lr": state.peak_lr, "final_lr": state.final_lr, "tokens": state.tokens,
        "optimizer_state": None,
    }



# ---- multi-rank trials: a Ray Train TorchTrainer inside the Tune trial ---------------------------


class _RankReporter(Callback):
    """Every rank reports each eval (the same number of times); rank 0 attaches the checkpoint
    directory, which holds every rank's files (a path on storage all ranks share)."""

    def __init__(self, static: dict[str, Any], rank: int):
        self.base = _TuneReporter(static, None, None)
        self.rank = rank
        self.pending: dict[str, Any] | None = None

    def on_eval(self, metrics: dict[str, Any]) -> None:
        import ray.train

        row = _clean(self.base.row(metrics))
        if metrics["step"] == 0 or math.isnan(metrics.get("train_loss", math.nan)):
            ray.train.report(row)
        else:
            self.pending = row

    def on_checkpoint(self, step: int, path: Path) -> None:
        import ray.train

        if self.pending is None:
            return
        ckpt = ray.train.Checkpoint.from_directory(str(path)) if self.rank == 0 else None
        ray.train.report(self.pending, checkpoint=ckpt)
        self.pending = None


def _train_worker(box: dict[str, Any]) -> None:
    """Ray Train worker: one DeepSpeed rank (torch.distributed already set up by Ray Train)."""
    import ray.train

    spec, point = box["spec"], box["point"]
    cfg = trial_config(spec, point)
    parent, _ = get_parent(cfg, box["parents"], Path(box["cache_dir"]))
    rank = ray.train.get_context().get_world_rank()
    resume = box["resume"]
    ck = ray.train.get_checkpoint()  # a worker-group restart after a failure
    if ck is not None:
        resume = ck.path
    eval_steps = report_steps(cfg)
    train(cfg, out_dir=Path(box["ckpt_root"]), callbacks=(_RankReporter(box["static"], rank),),
          parent=parent, resume_from=resume, checkpoint_steps=eval_steps,
          eval_at_start=resume is None and box["eval_at_start"])


def run_multi_rank(spec: SweepSpec, point: dict[str, Any], parents: dict[str, Any],
                   cache_dir: str, static: dict[str, Any], resume_from: Path | None,
                   eval_at_start: bool) -> None:
    """Run the trial as a TorchTrainer with ``resources.ranks`` workers (expert parallelism
    across them); metrics reach Tune through ``TuneReportCallback``. The trainer's workers hold
    the trial's resources (the Tune trial itself reserves none)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    r = spec.resources
    trial_id = static["trial_id"]
    storage = (spec.results_dir / "train").resolve()
    ckpt_root = storage / "rank_checkpoints" / trial_id
    trainer = TorchTrainer(
        _train_worker,
        train_loop_config={"spec": spec, "point": point, "parents": parents,
                           "cache_dir": cache_dir, "static": static,
                           "resume": str(resume_from) if resume_from else None,
                           "ckpt_root": str(ckpt_root), "eval_at_start": eval_at_start},
        torch_config=TorchConfig(backend="nccl" if r.gpus > 0 else "gloo"),
        scaling_config=ScalingConfig(num_workers=r.ranks, use_gpu=r.gpus > 0,
                                     resources_per_worker={"CPU": r.cpus,
                                                           **({"GPU": r.gpus} if r.gpus else {})}),
        run_config=RunConfig(name=f"{spec.name}-{trial_id}", storage_path=str(storage),
                             failure_config=FailureConfig(max_failures=spec.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=2),
                             callbacks=[TuneReportCallback()]),
    )
    trainer.fit()

"""The training loop on the DeepSpeed engine (torchtitan / OLMo-core shape).

``Trainer(cfg, ...)`` sets a run up: ranks, data, the initial model (fresh or upcycled from a
parent), a resumed checkpoint, the LR schedule of its phase, the engine. ``step()`` runs one
optimizer step, ``fit()`` the loop with evaluation, checkpoints and callbacks. ``train(cfg, ...)``
is ``Trainer(cfg, ...).fit()``. Every LR decision comes from ``schedules.run_schedule``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import moe_core.train.engine as eng
from moe_core import upcycle
from moe_core.data import TokenBatcher, load_dataset
from moe_core.errors import ConfigError, DivergenceError
from moe_core.moe.named_state import load_model_state
from moe_core.params import count_params
from moe_core.schedules import Phase, run_schedule
from moe_core.train.callbacks import Callback, ParentState, TrainResult
from moe_core.train.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from moe_core.train.config import TrainConfig
from moe_core.train.evaluate import evaluate, parent_reference_mlp
from moe_core.train.init import (
    build_initial_model,
    initial_optimizer_state,
    needs_calibration,
    with_own_groups,
)
from moe_core.train.prefetch import Prefetcher


@dataclass(frozen=True, slots=True)
class StepOutput:
    step: int
    train_loss: float
    aux_loss: float
    lr: float


def lineage_evals(resume: Checkpoint | None) -> tuple[tuple[int, float], ...]:
    """The (step, validation loss) pairs a checkpoint's meta records (``Trainer.evals``; none
    in a checkpoint written before they were recorded); a null loss reads as NaN."""
    if resume is None:
        return ()
    return tuple((int(s), math.nan if v is None else float(v))
                 for s, v in resume.meta.get("evals") or ())


class Trainer:
    """One training run.

    parent: upcycle from this state (``cfg.upcycle`` says how; the LR policy uses its LR facts).
    resume_from: a checkpoint directory; model, optimizer, step (= data position) and RNG are
        restored exactly. A fresh run (no resume) evaluates once before its first step.
    phase: which part of the schedule to train (``Phase.full()``, ``Phase.stable(end)`` for a
        WSD stable run, ``Phase.decay(start, n)`` for a decay branch).
    checkpoint_steps: optimizer-step counts after which to write a checkpoint into out_dir
        (and, when any are given, the last step).
    should_checkpoint: a checkpoint policy asked at every evaluation, ``(step, is_last) ->
        bool`` (e.g. a sweep's cadence: every n-th eval, every m minutes, the last step); True
        writes a checkpoint into out_dir there. With several ranks rank 0's answer holds.
    out_dir_per_rank: with several ranks, ``out_dir`` is this rank's own folder (on its own
        node), not one the ranks share: each rank writes its own checkpoint files there and
        rank 0 adds ``meta.json`` (``save_checkpoint``'s ``gather``); the ranks' folders of a
        step joined are the checkpoint.

    ``wall_s`` (in each eval row and the result) counts the seconds of the run's lineage: a
    resumed run continues from the ``wall_s`` its checkpoint recorded (a WSD branch from its
    stable run's), so it never goes backwards along a curve.
    """

    def __init__(self, cfg: TrainConfig, *, parent: ParentState | None = None,
                 resume_from: str | Path | None = None, phase: Phase = Phase(),
                 out_dir: str | Path | None = None, checkpoint_steps: Sequence[int] = (),
                 callbacks: Sequence[Callback] = (),
                 should_checkpoint: Callable[[int, bool], bool] | None = None,
                 out_dir_per_rank: bool = False):
        self.t0 = time.perf_counter()
        self.out_dir_per_rank = out_dir_per_rank
        self.should_checkpoint = should_checkpoint
        self.cfg, self.parent, self.callbacks = cfg, parent, tuple(callbacks)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.checkpoint_steps = frozenset(int(s) for s in checkpoint_steps)
        self.rank, self.world = eng.init_distributed()
        self.device = eng.pick_device()
        self.dtype = eng.pick_dtype(cfg.optim.dtype, self.device)
        self.gas = cfg.batch.accumulation_steps(self.world)
        self._stage(f"data: {cfg.data.source} tokens, {cfg.eval.batches} val batches of "
                    f"{cfg.batch.micro_batch} x {cfg.seq_len}")
        self._setup_data()
        if resume_from is not None:
            self._stage(f"checkpoint: reading {Path(resume_from).name}")
        resume = load_checkpoint(resume_from) if resume_from is not None else None
        self.wall0 = float(resume.meta.get("wall_s") or 0.0) if resume is not None else 0.0
        # the loss jump at the transition tau (first eval minus the parent's final loss) is
        # carried by every later eval, across resumes, through the checkpoint's meta
        self.transition_jump = resume.meta.get("transition_jump") if resume is not None else None
        # the lineage's evals up to the checkpoint (a branch: its stable run's), so a reporter
        # that predicts from the whole curve (sweeps' predicted_final) survives a restart
        self.history = lineage_evals(resume)
        self.model = self._setup_model(resume)
        self.plan = run_schedule(cfg, parent, phase)
        n = sum(p.numel() for p in self.model.parameters())
        self._stage(f"engine: DeepSpeed ZeRO-{cfg.optim.zero_stage}, "
                    f"{str(self.dtype).removeprefix('torch.')}, {n / 1e6:,.1f} M params")
        self.engine, self.optimizer = eng.build_engine(self.model, cfg, self.world, self.dtype,
                                                       self.plan.peak)
        self.clip_in_loop = eng.clips_in_loop(cfg)
        self.batches = Prefetcher(self.batcher.batch, self.device, self.gas)
        self.ep_group = next((m.ep_group for m in self.model.moe_layers()), None) \
            if self.ep > 1 else None
        self.start = self._restore(resume)
        self.step_count = self.start
        self.fresh = resume is None
        self.lr = self.plan.lr(self.start) if self.start < self.plan.schedule.total_steps else 0.0
        self.train_loss = self.aux_loss = math.nan
        self.result = self._new_result()
        if resume is not None:
            for cb in self.callbacks:
                cb.on_resume(self.history)

    # ---- set-up ----------------------------------------------------------------------------

    def _stage(self, text: str) -> None:
        """Announce a set-up stage to the callbacks (``Callback.on_stage``): what and how large."""
        for cb in self.callbacks:
            cb.on_stage(text)

    def _setup_data(self) -> None:
        cfg = self.cfg
        self.dataset = dataset = load_dataset(cfg.data)
        self.vocab_size = dataset.vocab_size
        self.eval_every = cfg.eval.every_steps  # the cadence the loop evaluates at
        self.batcher = TokenBatcher(
            dataset.train, seq_len=cfg.seq_len, global_batch=cfg.batch.global_batch,
            micro_batch=cfg.batch.micro_batch, seed=cfg.seed, rank=self.rank,
            world_size=self.world,
        )
        self.val = dataset.val_batches(
            seq_len=cfg.seq_len, batch_size=cfg.batch.micro_batch,
            num_batches=cfg.eval.batches, seed=cfg.eval.seed,
        )

    def _setup_model(self, resume: Checkpoint | None) -> torch.nn.Module:
        """Initial model (fresh or upcycled), resumed weights, expert shards, device, dtype."""
        cfg = self.cfg
        calib = None
        n = count_params(cfg.model_config(self.vocab_size)).total
        how = "fresh" if self.parent is None else \
            f"upcycled ({getattr(cfg.upcycle, 'method', 'continue')})"
        self._stage(f"model: {how}, {n / 1e6:,.1f} M params, {n * 4 / 1e6:,.0f} MB fp32")
        if self.parent is not None and needs_calibration(cfg):
            calib = self.batcher.batch(0, 0)  # (inputs, targets) calibration pair
        self.ep, layer_cls = eng.expert_parallel_layer(cfg, self.world)
        model, self.expansion = build_initial_model(cfg, self.vocab_size, self.parent, calib,
                                                    layer_cls)
        if resume is not None:  # an expert-parallel checkpoint's shards joined, then re-cut
            _check_reshard(resume, cfg, self.world)
            load_model_state(model, resume.full_model_state(), resume=True)
        if self.ep > 1:
            for m in model.moe_layers():
                m.shard_experts(self.rank % self.ep, self.ep)
        model = model.to(self.device)
        if eng.param_dtype(cfg, self.dtype) != torch.float32:  # torch_autocast keeps fp32
            model = model.to(self.dtype)
        self.reference = parent_reference_mlp(self.parent, model)  # on the model's device
        for m in model.moe_layers():  # moe.experts_kernel (a ConfigError where liger can't run)
            m.select_experts_kernel(self.device, self.dtype)
        model.enable_speedups(compile=cfg.model.compile,
                              activation_checkpointing=cfg.model.activation_checkpointing,
                              chunked_loss=cfg.model.chunked_loss,
                              fused_head=eng.pick_fused_head(cfg.model.fused_head, self.device))
        return model

    def _restore(self, resume: Checkpoint | None) -> int:
        """Optimizer state and RNG of a resumed run (returns its step); for a fresh run whose
        experts were replicated from its parent's, the parent's AdamW state expanded with them
        (003 §3); else a fresh AdamW."""
        if resume is not None:
            old_world = resume.world_size
            opt_state = (resume.optimizer_state(self.rank) if old_world == self.world else
                         self._resharded_optimizer_state(resume))
            if opt_state is not None:
                eng.load_optimizer(self.optimizer, opt_state, self.rank, self.world)
            resume.restore_rng(self.rank % old_world)  # CPU, and CUDA when saved on CUDA
            return resume.step
        state = initial_optimizer_state(self.parent, self.expansion, self.model,
                                        self.optimizer, ep=(self.rank % self.ep, self.ep))
        if state is not None:
            eng.load_optimizer(self.optimizer, state, self.rank, self.world)
        return 0

    def _resharded_optimizer_state(self, resume: Checkpoint) -> dict[str, Any] | None:
        """The optimizer state of a ZeRO-0 checkpoint written by another number of ranks: the
        old expert ranks' states joined, then cut to this rank's experts."""
        old_ep = resume.expert_ranks if self.model.moe_layers() else 1
        states = [resume.optimizer_state(r) for r in range(old_ep)]
        if any(st is None for st in states):
            return None
        names = upcycle.optimizer_param_names(self.model, self.optimizer)
        state = upcycle.join_optimizer_states(states, names)
        if self.ep > 1:
            state = upcycle.shard_optimizer_state(state, names, self.rank % self.ep, self.ep)
        return with_own_groups(state, self.optimizer)

    def _new_result(self) -> TrainResult:
        pc = count_params(self.model.config)
        moe = self.model.moe_layers()
        return TrainResult(
            initial_val_loss=math.nan, val_loss=math.nan, train_loss=math.nan, tokens=0,
            steps=0, wall_s=0.0, peak_lr=self.plan.peak,
            params={"N_total": pc.non_embedding_total, "N_active": pc.non_embedding_active,
                    "expert_parallel": self.ep,
                    "local_experts": moe[0].num_local_experts if moe else 0},
        )

    # ---- one step --------------------------------------------------------------------------

    def step(self) -> StepOutput:
        """One optimizer step (all micro-batches, balancing updates); raises
        ``DivergenceError`` on a non-finite training loss."""
        step = self.step_count + 1
        lr = self.plan.lr(step - 1)
        eng.set_lr(self.optimizer, lr)
        # loss and aux summed on the device in fp64 (the sums the Python floats made before,
        # bit for bit) and read once per step: no host sync per micro-batch
        sums = torch.zeros(2, dtype=torch.float64, device=self.device)
        for micro in range(self.gas):
            x, y = self.batches.get(step - 1, micro)
            out = self.engine(x, y)
            self.engine.backward(out.loss + out.aux_loss)
            if micro == self.gas - 1 and self.clip_in_loop:  # gradients now reduced
                eng.clip_gradients(self.model, self.cfg.optim.grad_clip, self.ep_group)
            self.engine.step()
            sums += torch.stack([out.loss.detach(), out.aux_loss.detach()]).double()
        stats = sums / self.gas
        if self.world > 1:  # nccl reduces CUDA tensors only: stats live on the device
            torch.distributed.all_reduce(stats)
            stats /= self.world
        train_loss, aux = stats.tolist()
        if not math.isfinite(train_loss):
            raise DivergenceError(step, f"train loss is {train_loss} (lr={lr:.3g})")
        eng.sync_balancing(self.model, self.world)
        self.model.update_balancing()
        self.step_count, self.lr, self.train_loss, self.aux_loss = step, lr, train_loss, aux
        return StepOutput(step, train_loss, aux, lr)

    # ---- the loop --------------------------------------------------------------------------

    def elapsed(self) -> float:
        """Seconds of this run's lineage: the resumed checkpoint's ``wall_s`` plus this run's."""
        return self.wall0 + time.perf_counter() - self.t0

    def evaluate(self) -> dict[str, Any]:
        """Evaluate now; the metrics row joins the curve."""
        with eng.autocast(self.cfg, self.dtype, self.device):
            m = evaluate(self.model, self.val, self.device, self.reference)
        step = self.step_count
        m.update(step=step, tokens=step * self.cfg.tokens_per_step, lr=self.lr,
                 train_loss=self.train_loss, aux_loss=self.aux_loss, wall_s=self.elapsed())
        if self.transition_jump is None and step == 0 and self.parent is not None and \
                math.isfinite(self.parent.val_loss):
            self.transition_jump = m["val_loss"] - self.parent.val_loss
        if self.transition_jump is not None:
            m["transition_jump"] = self.transition_jump
        self.result.curve.append(m)
        return m

    def save(self, path: Path) -> Path:
        """Checkpoint model, optimizer, step (= data position), RNG and the schedule."""
        cfg, step = self.cfg, self.step_count
        save_checkpoint(
            path, model_state=self.model.state_dict(),
            optimizer_state=self.optimizer.state_dict(),
            meta={"step": step, "tokens": step * cfg.tokens_per_step, "lr": self.lr,
                  "peak_lr": self.plan.peak, "wall_s": self.elapsed(),
                  "data_seed": self.batcher.seed, "tokens_per_step": self.tokens_per_step(),
                  "transition_jump": self.transition_jump, "evals": self.evals(),
                  "schedule": dataclasses.asdict(self.plan.schedule), "config": cfg.to_dict()},
            rank=self.rank, world_size=self.world,
            barrier=eng.barrier if self.world > 1 else None, per_rank_model=self.ep > 1,
            gather=eng.all_gather_object if self.out_dir_per_rank and self.world > 1 else None,
        )
        self.result.checkpoints[step] = str(path)
        return path

    def evals(self) -> list[tuple[int, float | None]]:
        """(step, validation loss) of every eval of the run's lineage so far, oldest first (a
        non-finite loss as None, so the checkpoint's meta stays valid JSON)."""
        mine = [(int(m["step"]), float(m["val_loss"])) for m in self.result.curve]
        first = mine[0][0] if mine else math.inf
        return [(s, v if v is not None and math.isfinite(v) else None)
                for s, v in [*(h for h in self.history if h[0] < first), *mine]]

    def fit(self, until: int | None = None) -> TrainResult:
        """Train to the phase's last step (or to ``until``): an eval every
        ``eval.every_steps``, at the last step and when a callback asks to stop; checkpoints at
        ``checkpoint_steps`` and the last step, and where ``should_checkpoint`` says so at an
        eval; then the callbacks."""
        last = self.plan.end_step if until is None else until
        if self.fresh and self.step_count == self.start and not self.result.curve:
            m0 = self.evaluate()
            self.result.initial_val_loss = m0["val_loss"]
            for cb in self.callbacks:
                cb.on_eval(m0, None)
        self.engine.train()
        while self.step_count < last:
            step = self.step().step
            is_last = step == last
            stop = any(cb.should_stop() for cb in self.callbacks)
            m = None
            if step % self.eval_every == 0 or is_last or stop:
                m = self.evaluate()
                if not math.isfinite(m["val_loss"]):
                    raise DivergenceError(step, f"validation loss is {m['val_loss']}")
            path = None
            if self.out_dir is not None and self._checkpoint_due(step, is_last, m is not None):
                path = self.save(self.out_dir / f"step_{step:08d}")
            self._notify(m, path)
            if stop:
                break
        return self._finish()

    def _checkpoint_due(self, step: int, is_last: bool, evaluated: bool) -> bool:
        due = step in self.checkpoint_steps or (is_last and bool(self.checkpoint_steps))
        if evaluated and self.should_checkpoint is not None:
            want = bool(self.should_checkpoint(step, is_last))
            if self.world > 1:  # a clock-based policy may differ across ranks: rank 0 decides
                flag = torch.tensor([float(want)], device=self.device)
                torch.distributed.broadcast(flag, src=0)
                want = bool(flag.item())
            due = due or want
        return due

    def _notify(self, metrics: dict[str, Any] | None, path: Path | None) -> None:
        for cb in self.callbacks:
            if metrics is not None:
                cb.on_eval(metrics, path)
            if path is not None:
                cb.on_checkpoint(self.step_count, path)

    def _finish(self) -> TrainResult:
        r = self.result
        r.steps = self.step_count
        r.tokens = self.step_count * self.cfg.tokens_per_step
        r.train_loss = self.train_loss
        r.val_loss = r.curve[-1]["val_loss"] if r.curve else math.nan
        r.final_lr = self.lr
        r.wall_s = self.elapsed()
        return r

    # ---- hand-off ----------------------------------------------------------------------------

    def model_state_numpy(self) -> dict[str, Any]:
        """The model's state as fp32 numpy arrays (what Ray's object store shares zero-copy)."""
        return {k: v.detach().float().cpu().numpy() for k, v in self.model.state_dict().items()}

    def full_model_state(self) -> dict[str, torch.Tensor]:
        """The whole model's weights on every rank, expert-parallel shards gathered in expert
        order (a collective on more than one expert rank), e.g. for ``moe_core.hf.save_moe``."""
        return self.model.state_dict() if self.ep == 1 else eng.full_state_dict(self.model)

    def parent_state(self) -> ParentState:
        """This run as the parent of others: final weights, optimizer state and LR facts.
        One rank's: an expert-parallel run's ranks each hold a slice of the experts and of
        their moments (its checkpoint holds them all: resume a child from it instead)."""
        if self.ep > 1:
            raise ConfigError(
                f"parent_state of a run on {self.ep} expert-parallel ranks would hold one "
                "rank's experts; train parents on one rank, or start the child from this "
                "run's checkpoint")
        return ParentState(
            model_state=self.model_state_numpy(), model_config=self.model.config,
            peak_lr=self.plan.peak, final_lr=self.lr,
            tokens=self.step_count * self.cfg.tokens_per_step,
            optimizer_state=self.optimizer.state_dict(), val_loss=self.result.val_loss,
            seed=self.batcher.seed, tokens_per_step=self.tokens_per_step(),
        )

    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step as the live batcher draws them: micro-batch ×
        gradient accumulation × data-parallel ranks × sequence length."""
        return self.batcher.micro_batch * self.gas * self.world * self.batcher.seq_len


def _check_reshard(resume: Checkpoint, cfg: TrainConfig, world: int) -> None:
    """A checkpoint resumes on another number of ranks only at ZeRO 0 (the expert shards and
    optimizer moments are re-cut); ZeRO 1/2 partitions are tied to their rank count."""
    old = resume.world_size
    old_zero = int(resume.optim.get("zero_stage", 0))
    if old != world and (old_zero or cfg.optim.zero_stage):
        raise ConfigError(
            f"checkpoint {resume.path} was written by {old} ranks at optim.zero_stage="
            f"{old_zero}; at ZeRO 1/2 resume it with the same number of ranks (now {world}), "
            "or train at optim.zero_stage=0, whose checkpoints resume on any number")


def train(cfg: TrainConfig, **kwargs: Any) -> TrainResult:
    """``Trainer(cfg, **kwargs).fit()``: one run from set-up to its last step."""
    return Trainer(cfg, **kwargs).fit()

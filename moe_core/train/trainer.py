"""The training loop on the DeepSpeed engine.

``train(cfg, ...)`` runs one training run: dense, MoE, upcycled from a parent state, resumed from
a checkpoint, or a WSD decay branch of a stable-phase checkpoint (000 §3.1). It reports through
callbacks (OLMo-core style) and never imports Ray or W&B.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from moe_core.data import TokenBatcher, load_dataset
from moe_core.errors import ConfigError, DivergenceError
from moe_core.model import Transformer, build_model
from moe_core.moe import stats as moe_stats
from moe_core.params import count_params
from moe_core.schedules import ScheduleConfig, lr_at, resolve_lr_policy
from moe_core.train.checkpoint import (
    load_checkpoint,
    save_checkpoint,
    state_from_numpy,
)
from moe_core.train.config import TrainConfig

log = logging.getLogger("moe_core.train")


class Callback:
    """Hooks the loop calls; every method is optional."""

    def on_eval(self, metrics: dict[str, Any]) -> None:  # noqa: B027
        """After each evaluation, with the metrics row (step, tokens, losses, router stats)."""

    def on_checkpoint(self, step: int, path: Path) -> None:  # noqa: B027
        """After a checkpoint directory was written."""

    def should_stop(self) -> bool:
        """Return True to end the run after the current step (e.g. an ASHA stop)."""
        return False


@dataclass
class ParentState:
    """What a run needs from its parent: weights (numpy or torch), optionally optimizer state,
    and the LR facts the LR policies need (000 App. A.6)."""

    model_state: dict[str, Any]
    model_config: Any
    """ModelConfig of the parent."""
    peak_lr: float
    final_lr: float
    tokens: int
    optimizer_state: dict[str, Any] | None = None


@dataclass
class TrainResult:
    initial_val_loss: float
    val_loss: float
    train_loss: float
    tokens: int
    steps: int
    wall_s: float
    curve: list[dict[str, Any]] = field(default_factory=list)
    peak_lr: float = 0.0
    final_lr: float = 0.0
    checkpoints: dict[int, str] = field(default_factory=dict)
    params: dict[str, int] = field(default_factory=dict)
    state: dict[str, Any] | None = None
    """Final model state as numpy arrays (``keep_state=True``)."""
    optimizer_state: dict[str, Any] | None = None
    model_config: Any = None

    def summary(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in (
            "initial_val_loss", "val_loss", "train_loss", "tokens", "steps", "wall_s",
            "peak_lr", "final_lr", "params")}


# ---- distributed / device --------------------------------------------------------------------


def init_distributed() -> tuple[int, int]:
    """Initialise torch.distributed through DeepSpeed (gloo on CPU, nccl on CUDA); a single
    process without launcher variables becomes rank 0 of 1."""
    import deepspeed

    if not torch.distributed.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "1")) == 1:
            # A lone process: a fresh loopback port every time, never one inherited from a
            # parent process (concurrent trials on one machine would collide).
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
                              RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        deepspeed.init_distributed(dist_backend=backend, verbose=False)
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pick_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def pick_dtype(cfg_dtype: str, device: torch.device) -> torch.dtype:
    if cfg_dtype == "fp32":
        return torch.float32
    if cfg_dtype == "bf16":
        if device.type == "cpu":
            raise ConfigError("optim.dtype=bf16 needs a CUDA device here; use fp32 or auto")
        return torch.bfloat16
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


# ---- building blocks ---------------------------------------------------------------------------


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices, none on norm weights (1-D); MoE expert parameters in their own
    groups (DeepSpeed's ``split_params_into_different_moe_groups_for_optimizer``)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay, "name": "decay"}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0, "name": "no_decay"})
    if any(getattr(p, "allreduce", True) is False for p in decay):
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

        groups = split_params_into_different_moe_groups_for_optimizer(groups)
    return groups


def deepspeed_config(cfg: TrainConfig, world_size: int, dtype: torch.dtype) -> dict[str, Any]:
    gas = cfg.batch.accumulation_steps(world_size)
    ds: dict[str, Any] = {
        "train_batch_size": cfg.batch.global_batch,
        "train_micro_batch_size_per_gpu": cfg.batch.micro_batch,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": cfg.optim.grad_clip,
        "zero_optimization": {"stage": cfg.optim.zero_stage},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if dtype == torch.bfloat16:
        ds["bf16"] = {"enabled": True}
    return ds


def _set_lr(optimizer: Any, lr: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = lr


def build_initial_model(
    cfg: TrainConfig,
    vocab_size: int,
    parent: ParentState | None,
    calib: torch.Tensor | None,
    moe_layer_cls: type | None = None,
) -> Transformer:
    """The run's model at step 0 (all experts): fresh, or upcycled from the parent state."""
    torch.manual_seed(cfg.seed)
    mcfg = cfg.model_config(vocab_size)
    kw = {"moe_layer_cls": moe_layer_cls} if moe_layer_cls is not None else {}
    if parent is None:
        return build_model(mcfg, **kw)
    from moe_core import upcycle

    u = cfg.upcycle
    state = state_from_numpy(parent.model_state)
    if u.method == "continue":
        model = build_model(mcfg, **kw)
        model.load_state_dict(state)
        return model
    if u.method == "dense_to_moe":
        new_state, new_cfg = upcycle.dense_to_moe_state(
            state, parent.model_config, cfg.moe,
            virtual_groups=u.virtual_groups, weight_scaling=u.weight_scaling, seed=cfg.seed,
        )
    else:
        new_state, new_cfg = upcycle.expand_experts_state(
            state, parent.model_config, u.factor, strategy=u.strategy, batch=calib,
            router_noise=u.router_noise, seed=cfg.seed,
        )[:2]
    model = build_model(dataclasses.replace(new_cfg, moe=mcfg.moe), **kw)
    model.load_state_dict(new_state)
    return model


@torch.no_grad()
def evaluate(
    model: Transformer,
    val_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    device: torch.device,
    reference_mlp: dict[int, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """Validation loss over fixed batches, plus router statistics averaged over MoE layers."""
    was_training = model.training
    model.eval()
    model.record_router_stats(True)
    losses, per_layer = [], []
    for x, y in val_batches:
        out = model(x.to(device), y.to(device))
        losses.append(float(out.loss))
        per_layer.append(out.router_stats)
    model.record_router_stats(False)
    model.train(was_training)
    metrics: dict[str, Any] = {"val_loss": float(np.mean(losses))}
    moe_layers = model.moe_layers()
    if moe_layers:
        keys = ("drop_rate", "overflow_rate_cf1", "entropy", "max1_max2", "max2_max3",
                "aux_switch", "aux_coef")
        for k in keys:
            vals = [s[k] for batch in per_layer for s in batch]
            metrics[f"router.{k}"] = float(np.nanmean(vals)) if vals else math.nan
        loads = np.array([[s["load"] for s in batch] for batch in per_layer]).mean(0)  # [L, E]
        metrics["router.max_load"] = float(loads.max(-1).mean())
        metrics["router.min_load"] = float(loads.min(-1).mean())
        sims = [moe_stats.mean_pairwise_cosine(m.expert_vectors().float()) for m in moe_layers]
        metrics["router.expert_similarity"] = float(np.nanmean(sims))
        if reference_mlp:
            cos = []
            for i, m in enumerate(moe_layers):
                ref = reference_mlp.get(i)
                if ref is not None and ref.numel() == m.expert_vectors().shape[1]:
                    cos.append(moe_stats.cosine_to_reference(m.expert_vectors().float(), ref))
            if cos:
                metrics["router.cos_to_parent"] = float(np.mean(cos))
    return metrics


def _parent_reference_mlp(parent: ParentState | None, model: Transformer) -> dict[int, Any]:
    """Flattened dense-parent MLP per MoE layer, for 004 Fig. 6's cosine similarity (coarse
    upcycling only: a granular expert is a shard and has another shape)."""
    if parent is None or parent.model_config.moe is not None:
        return {}
    out, j = {}, 0
    for i, b in enumerate(model.blocks):
        if b.is_moe:
            try:
                parts = [parent.model_state[f"blocks.{i}.mlp.{w}"] for w in
                         ("w_gate", "w_up", "w_down")]
            except KeyError:
                return {}
            out[j] = torch.cat([torch.as_tensor(np.asarray(p)).reshape(-1) for p in parts])
            j += 1
    return out


# ---- the loop ----------------------------------------------------------------------------------


def train(
    cfg: TrainConfig,
    *,
    out_dir: str | Path | None = None,
    callbacks: Sequence[Callback] = (),
    parent: ParentState | None = None,
    resume_from: str | Path | None = None,
    schedule_override: tuple[float, ScheduleConfig] | None = None,
    checkpoint_steps: Sequence[int] = (),
    end_step: int | None = None,
    eval_at_start: bool = True,
    keep_state: bool = False,
) -> TrainResult:
    """Train ``cfg`` and return its result.

    parent: upcycle from this state (``cfg.upcycle`` says how; the LR policy uses its LR facts).
    resume_from: a checkpoint directory; model, optimizer, step (= data position) and RNG are
        restored exactly.
    schedule_override: (peak, ScheduleConfig) replacing the run's LR schedule (WSD branches).
    checkpoint_steps: optimizer-step counts after which to write a checkpoint into out_dir.
    end_step: stop after this many optimizer steps in total (default: cfg.steps, or the
        override schedule's total_steps).
    keep_state: attach the final model state (numpy) and optimizer state to the result as
        ``result.state`` / ``result.optimizer_state`` (for parents).
    """
    import deepspeed

    t0 = time.perf_counter()
    rank, world = init_distributed()
    device = pick_device()
    dtype = pick_dtype(cfg.optim.dtype, device)
    dataset = load_dataset(cfg.data)
    vocab = dataset.vocab_size
    gas = cfg.batch.accumulation_steps(world)
    batcher = TokenBatcher(
        dataset.train, seq_len=cfg.seq_len, global_batch=cfg.batch.global_batch,
        micro_batch=cfg.batch.micro_batch, seed=cfg.seed, rank=rank, world_size=world,
    )
    val = dataset.val_batches(
        seq_len=cfg.seq_len, batch_size=cfg.batch.micro_batch, num_batches=cfg.eval.batches,
        seed=cfg.eval.seed,
    )

    calib = None
    if parent is not None and cfg.upcycle.method == "expand_experts" and \
            cfg.upcycle.strategy != "uniform":
        calib = batcher.batch(0, 0)  # (inputs, targets) calibration pair
    ep = 1
    layer_cls = None
    if cfg.moe is not None:
        from moe_core.train.parallel import deepspeed_moe_layer_cls

        ep = cfg.optim.expert_parallel or world
        if world % ep or cfg.moe.num_experts % ep:
            raise ConfigError(
                f"optim.expert_parallel={ep} must divide the {world} ranks and "
                f"moe.num_experts={cfg.moe.num_experts}"
            )
        layer_cls = deepspeed_moe_layer_cls(ep)
    model = build_initial_model(cfg, vocab, parent, calib, layer_cls)
    reference = _parent_reference_mlp(parent, model)
    resume = load_checkpoint(resume_from) if resume_from is not None else None
    if resume is not None and resume.meta.get("world_size", 1) == world:
        model.load_state_dict(resume.model_state(rank))  # full or this rank's shard
        resume_loaded = True
    else:
        resume_loaded = False
    if ep > 1:
        for m in model.moe_layers():
            m.shard_experts(rank % ep, ep)
    model = model.to(device)
    if dtype != torch.float32:
        model = model.to(dtype)

    # LR: the run's own schedule, or the LR policy against the parent (000 App. A.6).
    steps = cfg.steps
    if schedule_override is not None:
        peak, sched = schedule_override
    else:
        sched = dataclasses.replace(cfg.schedule, total_steps=steps)
        peak = cfg.optim.lr
        if parent is not None:
            peak, sched = resolve_lr_policy(
                cfg.upcycle.lr_policy, parent_peak=parent.peak_lr,
                parent_final_lr=parent.final_lr, schedule_cfg=sched, default_peak=peak,
            )
    last_step = end_step if end_step is not None else sched.total_steps

    optimizer = torch.optim.AdamW(
        param_groups(model, cfg.optim.weight_decay), lr=peak, betas=tuple(cfg.optim.betas),
        eps=cfg.optim.eps,
    )
    engine, ds_opt, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=deepspeed_config(cfg, world, dtype)
    )
    start = 0
    if resume is not None:
        ck = resume
        if not resume_loaded:
            raise ConfigError(
                f"checkpoint {ck.path} was written by {ck.meta.get('world_size')} ranks; "
                f"resume it with the same number of ranks (now {world})"
            )
        opt_state = ck.optimizer_state(rank)
        if opt_state is not None:
            _load_optimizer(ds_opt, opt_state, rank, world)
        rng = ck.rng_state(rank)
        if rng is not None:
            torch.set_rng_state(rng)
        start = ck.step
    elif parent is not None and parent.optimizer_state is not None and \
            cfg.upcycle.method == "continue":
        ds_opt.load_state_dict(parent.optimizer_state)

    out_dir = Path(out_dir) if out_dir is not None else None
    ck_steps = set(int(s) for s in checkpoint_steps)
    pc = count_params(model.config)
    result = TrainResult(
        initial_val_loss=math.nan, val_loss=math.nan, train_loss=math.nan, tokens=0, steps=0,
        wall_s=0.0, peak_lr=peak,
        params={"N_total": pc.non_embedding_total, "N_active": pc.non_embedding_active,
                "expert_parallel": ep,
                "local_experts": model.moe_layers()[0].num_local_experts
                if model.moe_layers() else 0},
    )

    def emit(step: int, train_loss: float, aux: float, lr: float) -> dict[str, Any]:
        m = evaluate(model, val, device, reference)
        m.update(step=step, tokens=step * cfg.tokens_per_step, lr=lr, train_loss=train_loss,
                 aux_loss=aux, wall_s=time.perf_counter() - t0)
        result.curve.append(m)
        for cb in callbacks:
            cb.on_eval(m)
        return m

    lr = lr_at(start, peak=peak, cfg=sched) if start < sched.total_steps else 0.0
    if eval_at_start:
        m0 = emit(start, math.nan, math.nan, lr)
        result.initial_val_loss = m0["val_loss"]
    train_loss = aux_val = math.nan
    engine.train()
    step = start
    for step in range(start + 1, last_step + 1):
        lr = lr_at(step - 1, peak=peak, cfg=sched)
        _set_lr(ds_opt, lr)
        ce_sum = aux_sum = 0.0
        for micro in range(gas):
            x, y = batcher.batch(step - 1, micro)
            out = engine(x.to(device), y.to(device))
            engine.backward(out.loss + out.aux_loss)
            engine.step()
            ce_sum += float(out.loss.detach())
            aux_sum += float(out.aux_loss.detach())
        stats = torch.tensor([ce_sum / gas, aux_sum / gas], dtype=torch.float64)
        if world > 1:
            torch.distributed.all_reduce(stats)
            stats /= world
        train_loss, aux_val = float(stats[0]), float(stats[1])
        if not math.isfinite(train_loss):
            raise DivergenceError(step, f"train loss is {train_loss} (lr={lr:.3g})")
        _sync_balancing(model, world)
        model.update_balancing()
        is_last = step == last_step
        stop = any(cb.should_stop() for cb in callbacks)
        if step % cfg.eval.every_steps == 0 or is_last or stop:
            m = emit(step, train_loss, aux_val, lr)
            if not math.isfinite(m["val_loss"]):
                raise DivergenceError(step, f"validation loss is {m['val_loss']}")
        if out_dir is not None and (step in ck_steps or (is_last and ck_steps)):
            per_rank = ep > 1
            path = out_dir / f"step_{step:08d}"
            save_checkpoint(
                path, model_state=model.state_dict(), optimizer_state=ds_opt.state_dict(),
                meta={"step": step, "tokens": step * cfg.tokens_per_step, "lr": lr,
                      "peak_lr": peak, "schedule": dataclasses.asdict(sched),
                      "config": cfg.to_dict()},
                rank=rank, world_size=world, barrier=_barrier if world > 1 else None,
                per_rank_model=per_rank,
            )
            result.checkpoints[step] = str(path)
            for cb in callbacks:
                cb.on_checkpoint(step, path)
        if stop:
            break
    result.steps = step
    result.tokens = step * cfg.tokens_per_step
    result.train_loss = train_loss
    result.val_loss = result.curve[-1]["val_loss"] if result.curve else math.nan
    result.final_lr = lr
    result.wall_s = time.perf_counter() - t0
    if keep_state:
        result.state = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
        result.optimizer_state = ds_opt.state_dict()
        result.model_config = model.config
    return result


def _load_optimizer(ds_opt: Any, state: dict[str, Any], rank: int, world: int) -> None:
    """Torch optimizers take their state dict; DeepSpeed's ZeRO optimizer takes a list indexed
    by data-parallel rank (each rank saved its own partition)."""
    if isinstance(ds_opt, torch.optim.Optimizer):
        ds_opt.load_state_dict(state)
    else:
        states: list[Any] = [None] * world
        states[rank] = state
        ds_opt.load_state_dict(states, load_from_fp32_weights=True)


def _barrier() -> None:
    torch.distributed.barrier()


def _sync_balancing(model: Transformer, world: int) -> None:
    """Sum router loads over data-parallel ranks so every rank applies the same loss-free and
    adaptive updates (the router is replicated)."""
    if world == 1:
        return
    for m in model.moe_layers():
        torch.distributed.all_reduce(m.load_accum)
        torch.distributed.all_reduce(m.drop_accum)


Hook = Callable[[dict[str, Any]], None]


class FunctionCallback(Callback):
    """Adapter: ``FunctionCallback(on_eval=fn)``."""

    def __init__(self, on_eval: Hook | None = None, on_checkpoint: Any = None):
        self._on_eval, self._on_checkpoint = on_eval, on_checkpoint

    def on_eval(self, metrics: dict[str, Any]) -> None:
        if self._on_eval:
            self._on_eval(metrics)

    def on_checkpoint(self, step: int, path: Path) -> None:
        if self._on_checkpoint:
            self._on_checkpoint(step, path)

"""The engine room: torch.distributed through DeepSpeed, device and dtype, the DeepSpeed config,
the optimizer and its state, and the collectives the loop needs."""

from __future__ import annotations

import gc
import os
from typing import Any

import torch

from moe_core import loss as lm_loss
from moe_core.errors import ConfigError
from moe_core.model import Transformer
from moe_core.train.config import BF16_MODE_AUTO, TrainConfig
from moe_core.train.dsops import skip_unneeded_ops


def init_distributed() -> tuple[int, int]:
    """Initialise torch.distributed through DeepSpeed (gloo on CPU, nccl on CUDA); a single
    process without launcher variables becomes rank 0 of 1."""
    import deepspeed

    # no JIT build, no stale build lock to hang on (moe_core.train.dsops): also where Ray Train
    # set up the process group, since DeepSpeed's comm layer still starts (deepspeed.initialize)
    skip_unneeded_ops()
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


def pick_fused_head(setting: bool | str, device: torch.device) -> bool:
    """``model.fused_head``: ``auto`` = Liger's fused LM-head loss on CUDA when liger-kernel is
    installed (``pip install -e '.[gpu]'``), else the chunked loss; ``false`` = never; ``true``
    = always, an error where it cannot run (no liger-kernel; no CUDA device and no Triton
    interpreter, ``TRITON_INTERPRET=1``)."""
    if setting is False:
        return False
    runs_here = device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    if setting == "auto":
        return device.type == "cuda" and lm_loss.liger_available()
    if not lm_loss.liger_available() or not runs_here:
        raise ConfigError(
            "model.fused_head=true needs liger-kernel and triton (pip install -e '.[gpu]') and "
            f"a CUDA device (this run is on {device.type}); set model.fused_head: auto")
    return True


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
        # at ZeRO 0 the loop clips (clip_gradients): DeepSpeed's ZeRO-0 norms are wrong for
        # MoE (the bf16 wrapper leaves expert gradients out; the fp32 path averages per-rank
        # norms of different experts under expert parallelism)
        "gradient_clipping": 0.0 if clips_in_loop(cfg) else cfg.optim.grad_clip,
        "zero_optimization": {"stage": cfg.optim.zero_stage},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    mode = bf16_mode(cfg, dtype)
    if mode in ("deepspeed", "bf16_optimizer"):
        ds["bf16"] = {"enabled": True}
    if mode == "bf16_optimizer":  # bf16 weights at ZeRO 1 + fp32 accumulation: BF16_Optimizer
        ds["data_types"] = {"grad_accum_dtype": "fp32"}
    elif mode == "torch_autocast":  # fp32 weights; no optimizer wrapper at all
        ds["torch_autocast"] = {"enabled": True, "dtype": "bfloat16"}
    return ds


DEFAULT_BF16_MODE = BF16_MODE_AUTO
"""``optim.bf16_mode: auto`` per ZeRO stage: of the modes correct at the stage, the one with
the fewest host syncs per optimizer step on the CUDA path (``bench/optimizer_step.py
--force-cuda-paths``, docs/gpu-training-step.md §4). ZeRO 0: ``torch_autocast`` (1: the loss
read; DeepSpeed's unfused wrapper reads once per parameter). ZeRO 1: ``BF16_Optimizer`` (5,
bf16 weights kept). ZeRO 2: DeepSpeed's ZeRO optimizer (6, bf16 weights kept; autocast would
save 1 and replicate fp32 weights on every rank, the memory ZeRO 2 is chosen to save). The
same dict as ``moe_core.train.config.BF16_MODE_AUTO``."""


def bf16_mode(cfg: TrainConfig, dtype: torch.dtype) -> str | None:
    """How a bf16 run is done (``optim.bf16_mode``, ``auto`` resolved by ZeRO stage); None for
    an fp32 run. ``deepspeed``: bf16 weights and DeepSpeed's wrapper for the stage (ZeRO 0:
    ``FP16_UnfusedOptimizer``, the behaviour before the option existed); ``bf16_optimizer``:
    bf16 weights, ZeRO 1, fp32 gradient accumulation (DeepSpeed's ``BF16_Optimizer``);
    ``torch_autocast``: fp32 weights and AdamW state, bf16 compute under ``torch.autocast``,
    the plain torch AdamW (fused on CUDA)."""
    if dtype != torch.bfloat16:
        return None
    return cfg.optim.resolved_bf16_mode()


def param_dtype(cfg: TrainConfig, dtype: torch.dtype) -> torch.dtype:
    """The dtype the model's weights are kept in: fp32 under ``torch_autocast`` (bf16 is the
    compute dtype only), else the run's dtype."""
    return torch.float32 if bf16_mode(cfg, dtype) == "torch_autocast" else dtype


def autocast(cfg: TrainConfig, dtype: torch.dtype, device: torch.device) -> Any:
    """The autocast context of a ``torch_autocast`` run (evaluation runs outside the engine's
    forward and needs it too); a no-op context otherwise."""
    import contextlib

    if bf16_mode(cfg, dtype) != "torch_autocast":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def clips_in_loop(cfg: TrainConfig) -> bool:
    """Whether the training loop clips gradients itself (``clip_gradients``, ZeRO 0) rather
    than DeepSpeed (ZeRO 1/2: its gradients live in its partitions, and its norm there counts
    each expert once: tested on one rank and on 2 expert ranks)."""
    return cfg.optim.zero_stage == 0 and cfg.optim.grad_clip > 0


def clip_gradients(model: torch.nn.Module, max_norm: float,
                   ep_group: Any = None) -> torch.Tensor:
    """Clip every gradient by the global L2 norm over the whole model, each expert counted
    once (000 Table 4: clip 1.0); returns that norm. Call after the gradients are reduced
    (DeepSpeed's backward at an accumulation boundary) and before the optimizer step.

    Expert gradients (``allreduce=False``) differ across the expert-parallel ranks of
    ``ep_group``, so their squared norm is summed over it; every other gradient is the same on
    all ranks after the data-parallel reduction and counts once. This replaces DeepSpeed
    0.19.8's ZeRO-0 clipping, which is wrong for MoE models: ``FP16_UnfusedOptimizer`` (bf16)
    leaves expert gradients out of the norm, and ``clip_grad_norm_`` (fp32) averages per-rank
    norms that cover different experts (deepspeedai/DeepSpeed#8475, #8613). On one expert rank
    the arithmetic is ``clip_grad_norm_``'s step for step, so fp32 single-rank runs are
    unchanged bit for bit. In bf16 the scaled gradients are rounded to bf16 once more.

    All on the device, no host read: the per-tensor norms come from one ``torch._foreach_norm``
    (bf16 gradients read in place and accumulated in fp32, no fp32 copy of each gradient) and
    the scaling is one ``torch._foreach_mul_`` per dtype, not one launch per parameter."""
    params = [p for p in model.parameters() if p.grad is not None]
    grads = [p.grad.detach() for p in params]
    # one fused norm per dtype group on the device (no fp32 copy of a bf16 gradient, no sync);
    # fp32 gradients: the same per-tensor norms as ``p.grad.norm()``, so bit for bit
    norms = list(torch._foreach_norm(grads, 2.0, dtype=torch.float32))
    if ep_group is None:
        total = torch.stack(norms).pow(2.0).sum().float()
    else:
        expert = [getattr(p, "allreduce", True) is False for p in params]
        zero = torch.zeros((), device=norms[0].device)
        shared = sum((n.pow(2.0) for n, e in zip(norms, expert) if not e), zero)
        experts = sum((n.pow(2.0) for n, e in zip(norms, expert) if e), zero)
        torch.distributed.all_reduce(experts, group=ep_group)
        total = shared + experts
    total = total.pow(0.5)
    coef = torch.tensor([float(max_norm)], device=total.device) / (total + 1e-6)
    coef = torch.min(torch.tensor([1.0], device=coef.device), coef)
    for dtype in {g.dtype for g in grads}:  # one launch per dtype, not one per parameter
        torch._foreach_mul_([g for g in grads if g.dtype == dtype], coef.reshape(()))
    return total


def set_lr(optimizer: Any, lr: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = lr


def load_optimizer(ds_opt: Any, state: dict[str, Any], rank: int, world: int) -> None:
    """Restore ``state`` (saved by ``ds_opt.state_dict()`` of the same class and ranks) into
    whichever optimizer ``deepspeed.initialize`` handed back; it picks the class from the ZeRO
    stage and the dtype, and their ``load_state_dict`` signatures differ:

    - ``torch.optim.Optimizer`` (fp32, ZeRO 0): its own state dict;
    - ``FP16_UnfusedOptimizer`` (bf16 or fp16 at ZeRO 0 around a torch optimizer) and
      ``FP16_Optimizer`` (the same around a fused Adam): one state dict, from which they copy
      their fp32 master weights back (they take no ``load_from_fp32_weights``);
    - ``DeepSpeedZeroOptimizer`` (ZeRO 1/2) and ``BF16_Optimizer`` (bf16 at ZeRO 1 with fp32
      gradient accumulation): a list indexed by data-parallel rank (each rank saved its own
      partition), fp32 master partitions taken from the checkpoint rather than re-rounded from
      the bf16 weights (``load_from_fp32_weights=True``), so a resume is exact.
    """
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    if isinstance(ds_opt, torch.optim.Optimizer):
        ds_opt.load_state_dict(state)
    elif isinstance(ds_opt, (FP16_UnfusedOptimizer, FP16_Optimizer)):
        ds_opt.load_state_dict(state, load_optimizer_states=True)
    elif isinstance(ds_opt, (DeepSpeedZeroOptimizer, BF16_Optimizer)):
        states: list[Any] = [None] * world
        states[rank] = state
        ds_opt.load_state_dict(states, load_optimizer_states=True, load_from_fp32_weights=True)
    else:
        raise TypeError(f"cannot restore the state of DeepSpeed's {type(ds_opt).__name__}: "
                        "moe_core.train.engine.load_optimizer knows no such optimizer class")


def barrier() -> None:
    torch.distributed.barrier()


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def sync_balancing(model: Transformer, world: int) -> None:
    """Sum router loads over data-parallel ranks so every rank applies the same loss-free and
    adaptive updates (the router is replicated)."""
    if world == 1:
        return
    for m in model.moe_layers():
        torch.distributed.all_reduce(m.load_accum)
        torch.distributed.all_reduce(m.drop_accum)


def full_state_dict(model: Any) -> dict[str, Any]:
    """The whole model's state dict, on every rank: each expert-parallel layer's expert
    weights (``w_gate``, ``w_up``, ``w_down``, sliced by ``MoELayer.shard_experts``) are
    all-gathered over the layer's expert-parallel group and put back in expert order, so the
    result loads into an unsharded model of the same config. A collective: every rank of each
    expert-parallel group calls it. Single-rank layers pass through unchanged."""
    dist = torch.distributed
    state = dict(model.state_dict())
    for name, m in model.named_modules():
        n = getattr(m, "ep_size", 1)
        if n == 1:
            continue
        dev = m.w_gate.device
        ranks = [torch.zeros(1, dtype=torch.long, device=dev) for _ in range(n)]
        dist.all_gather(ranks, torch.tensor([m.ep_rank], device=dev), group=m.ep_group)
        order = [int(r) for r in torch.cat(ranks).tolist()]
        if sorted(order) != list(range(n)):
            raise RuntimeError(f"{name}: expert ranks {order} of one group are not 0..{n - 1}")
        for w in ("w_gate", "w_up", "w_down"):
            local = getattr(m, w).detach().contiguous()
            parts = [torch.empty_like(local) for _ in range(n)]
            dist.all_gather(parts, local, group=m.ep_group)
            by_rank = dict(zip(order, parts))
            state[f"{name}.{w}" if name else w] = torch.cat([by_rank[r] for r in range(n)])
    return state


def build_engine(model: Transformer, cfg: TrainConfig, world: int, dtype: torch.dtype,
                 peak: float) -> tuple[Any, Any]:
    """AdamW (000 Table 4) in the DeepSpeed engine; returns (engine, DeepSpeed optimizer)."""
    import deepspeed

    optimizer = torch.optim.AdamW(
        param_groups(model, cfg.optim.weight_decay), lr=peak, betas=tuple(cfg.optim.betas),
        eps=cfg.optim.eps, **adamw_impl(cfg, dtype, next(model.parameters()).device),
    )
    # DeepSpeed's BF16_Optimizer calls gc.collect() about nine times as it is built
    # (see_memory_usage(force=True)), each a walk over the whole heap: torch, DeepSpeed and Ray
    # in a trial's process, about 0.4 s a walk. Frozen for the build (unless already frozen, as
    # the test process is), those walks see only the objects the build makes; unfrozen after,
    # the rest is collected as before.
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    try:
        engine, ds_opt, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=deepspeed_config(cfg, world, dtype)
        )
    finally:
        if freeze:
            gc.unfreeze()
    return engine, ds_opt


def adamw_impl(cfg: TrainConfig, dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
    """AdamW's implementation keyword: ``fused=True`` (one kernel for all parameters, its step
    counters on the device, no host read) for a ``torch_autocast`` run, where the optimizer is
    the plain torch one; otherwise torch's default (foreach), as before the option existed,
    so fp32 runs and DeepSpeed's wrappers are unchanged bit for bit."""
    if bf16_mode(cfg, dtype) == "torch_autocast" and device.type in ("cuda", "cpu"):
        return {"fused": True}
    return {}


def expert_parallel_layer(cfg: TrainConfig, world: int) -> tuple[int, type | None]:
    """(expert-parallel degree, the DeepSpeed-MoE layer class) of an MoE run; (1, None) dense."""
    if cfg.moe is None:
        return 1, None
    from moe_core.train.parallel import deepspeed_moe_layer_cls

    ep = cfg.optim.expert_parallel or world
    if world % ep or cfg.moe.num_experts % ep:
        raise ConfigError(
            f"optim.expert_parallel={ep} must divide the {world} ranks and "
            f"moe.num_experts={cfg.moe.num_experts}"
        )
    return ep, deepspeed_moe_layer_cls(ep)

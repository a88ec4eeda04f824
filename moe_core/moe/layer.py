"""The MoE feed-forward layer: router, sort-based dispatch, stacked SwiGLU experts.

Shape legend: T tokens, D model dim, F expert hidden dim, E experts, K top-K, N = T·K assignments
(all of them, also with a capacity: a dropped one keeps its row with routing weight 0).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from moe_core.config import MoEConfig
from moe_core.moe import balancing, kernel_choice, stats
from moe_core.moe.routing import Routing, capacity, overflow_count, route
from moe_core.nn import FixedDtypeBuffers, SwiGLU, in_recompute


# compile-excluded (exclude_from_compile): per-expert Python-int splits would recompile at
# every new load
def swiglu_experts_loop(
    x_ND: torch.Tensor,
    counts: list[int],
    w_gate_EDF: torch.Tensor,
    w_up_EDF: torch.Tensor,
    w_down_EFD: torch.Tensor,
    scale_N: torch.Tensor,
) -> torch.Tensor:
    """scale · SwiGLU of each contiguous segment of ``x_ND`` through its expert (rows sorted by
    expert). The routing weight multiplies whichever of the hidden [N, F] or output [N, D]
    activations is smaller (the down projection is linear, so both are exact).

    One matmul per expert and projection, with one host read of ``counts`` (a list) per call;
    :func:`swiglu_experts_grouped` is the same maths in three grouped GEMMs (``_use_grouped_mm``
    says which one runs where).
    """
    # unbind, not w[e]: indexing's backward materialises a zero [E, D, F] gradient per expert
    # (O(E²) memory traffic); unbind's backward stacks the E gradients once.
    wg, wu, wd = w_gate_EDF.unbind(0), w_up_EDF.unbind(0), w_down_EFD.unbind(0)
    scale_hidden = w_down_EFD.shape[1] <= w_down_EFD.shape[2]
    scales = torch.split(scale_N.unsqueeze(-1).to(x_ND.dtype), counts)
    outs = []
    for e, x_e in enumerate(torch.split(x_ND, counts)):
        if x_e.shape[0] == 0:
            continue
        h = F.silu(x_e @ wg[e]) * (x_e @ wu[e])
        if scale_hidden:
            outs.append((h * scales[e]) @ wd[e])
        else:
            outs.append((h @ wd[e]) * scales[e])
    if not outs:
        return x_ND.new_zeros((0, w_down_EFD.shape[-1]))
    return torch.cat(outs, dim=0)


def swiglu_experts_grouped(
    x_ND: torch.Tensor,
    counts_E: torch.Tensor,
    w_gate_EDF: torch.Tensor,
    w_up_EDF: torch.Tensor,
    w_down_EFD: torch.Tensor,
    scale_N: torch.Tensor,
) -> torch.Tensor:
    """Same as :func:`swiglu_experts_loop` with ``torch._grouped_mm``: no host sync, no
    per-expert Python. torch 2.13 runs it forward and backward on CUDA (bf16 CUTLASS kernels on
    sm90, a per-group fallback otherwise) and on CPU, fp32 and bf16, empty groups included.
    Dynamo's fake kernel accepts bf16 only, so other dtypes go through
    :func:`_swiglu_experts_grouped_eager`."""
    offs = torch.cumsum(counts_E, 0).to(torch.int32)
    h = F.silu(torch._grouped_mm(x_ND, w_gate_EDF, offs=offs)) * torch._grouped_mm(
        x_ND, w_up_EDF, offs=offs
    )
    h = h * scale_N.unsqueeze(-1).to(h.dtype)
    return torch._grouped_mm(h, w_down_EFD, offs=offs)


_swiglu_experts_grouped_eager = swiglu_experts_grouped  # compile-excluded (exclude_from_compile)
"""The grouped experts outside any compiled graph (fp32: dynamo's ``_grouped_mm`` fake kernel
rejects it, eager runs it)."""


# compile-excluded (exclude_from_compile): Triton kernels and one host read (the tile
# count) per call
def liger_experts(
    x_TD: torch.Tensor,
    topk_idx_TK: torch.Tensor,
    w_TK: torch.Tensor,
    w_gate_EDF: torch.Tensor,
    w_up_EDF: torch.Tensor,
    w_down_EFD: torch.Tensor,
) -> torch.Tensor:
    """[T, D] = sum_k w[t, k] · SwiGLU_{idx[t, k]}(x[t]) by liger-kernel's fused MoE
    (``LigerFusedMoEFunction``: routing metadata, gather, gate/up GEMM and SwiGLU fused, the down
    GEMM, an atomic-free weighted combine; a memory-saving backward). The same maths as dispatch,
    :func:`swiglu_experts_grouped` and :func:`combine`, with the routing weight on the output
    rather than the hidden activation. Liger's layout is built from the parameters with
    differentiable ops each call, so the gradients reach the [E, D, F] / [E, F, D] parameters:
    gate_up [E, 2F, D] = cat(gateᵀ, upᵀ) (a copy), down [E, D, F] = downᵀ (Liger copies it
    contiguous). The routing weights get their gradient (Liger's dS). Under autocast it computes
    in the autocast dtype. Triton: CUDA, or a CPU under ``TRITON_INTERPRET=1`` set before the
    process starts (with ``LIGER_FUSED_MOE_AUTOTUNE=0``; tests)."""
    from liger_kernel.ops.fused_moe import LigerFusedMoEFunction

    dev = x_TD.device.type
    dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x_TD.dtype
    gate_up = torch.cat([w_gate_EDF.transpose(1, 2), w_up_EDF.transpose(1, 2)], 1).to(dt)
    down = w_down_EFD.transpose(1, 2).to(dt)
    return LigerFusedMoEFunction.apply(x_TD.to(dt), gate_up, down, topk_idx_TK.to(torch.int32),
                                       w_TK.to(dt))


def combine(y_ND: torch.Tensor, slot_N: torch.Tensor, T: int, K: int, *,
              dropless: bool) -> torch.Tensor:
    """[T, D] sum over each token's K expert outputs, without atomics: the rows of ``y_ND``
    (in expert order; row n belongs to slot ``slot_N[n]`` = t·K + k) are written back to their
    slots, the inverse permutation of the dispatch sort, and summed over K. Slots with no row
    (assignments a capacity dropped) stay 0. Backward is a gather of the [T·K, D] gradient,
    also atomic-free. For K = 2 the sum equals the ``index_add_`` it replaced bit for bit
    (a + b == b + a); for K > 2 the order of the K additions differs."""
    D = y_ND.shape[-1]
    new = y_ND.new_empty if dropless else y_ND.new_zeros  # dropless: every slot is written
    y_TKD = new((T * K, D)).index_copy(0, slot_N, y_ND).view(T, K, D)
    return y_TKD.sum(1)


class _Dispatch(torch.autograd.Function):
    """Rows ``x_TD[slot_N // K]`` (each token once per kept assignment, in expert order), with
    a backward that is :func:`combine` of the row gradients (a gather and a sum over K) rather
    than the atomic ``index_add_`` of indexing's backward; equal to it bit for bit for K <= 2."""

    @staticmethod
    def forward(ctx: Any, x_TD: torch.Tensor, slot_N: torch.Tensor, K: int,
                dropless: bool) -> torch.Tensor:
        ctx.save_for_backward(slot_N)
        ctx.T, ctx.K, ctx.dropless = x_TD.shape[0], K, dropless
        return x_TD.index_select(0, slot_N // K)

    @staticmethod
    def backward(ctx: Any, g_ND: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        (slot_N,) = ctx.saved_tensors
        return combine(g_ND, slot_N, ctx.T, ctx.K, dropless=ctx.dropless), None, None, None


def dispatch(x_TD: torch.Tensor, slot_N: torch.Tensor, K: int, *, dropless: bool) -> torch.Tensor:
    """[N, D] token rows for the N kept assignments listed by ``slot_N`` (slot = t·K + k);
    atomic-free backward (``_Dispatch``)."""
    return _Dispatch.apply(x_TD, slot_N, K, dropless)


ATOMIC_FREE: bool | None = None
"""Use :func:`dispatch`/:func:`combine` (True) or indexing and ``index_add_`` (False); None = on
CUDA only. On an H100 the bf16 ``index_add_`` combine was 23 % of the fine shape's time; on CPU
``index_add_`` accumulates without atomics and avoids the [T·K, D] buffer, and the atomic-free
pair measured 1.17× slower at E64 K8 (1.02× at E8 K2), so CPU keeps it. Tests set it."""


def _atomic_free(x: torch.Tensor) -> bool:
    return ATOMIC_FREE if ATOMIC_FREE is not None else x.is_cuda


GROUPED_MM: bool | None = None
"""Run the experts with :func:`swiglu_experts_grouped` (True) or :func:`swiglu_experts_loop`
(False); None = the rule of :func:`_use_grouped_mm`. Tests and benches set it."""


def _use_grouped_mm(x: torch.Tensor) -> bool:
    """The rule, by device: grouped experts on CUDA, whatever the dtype and shape (no host
    sync in bf16, no per-expert Python launches, one graph under compile); the per-expert loop
    on CPU, where it measured faster at every shape and dtype of ``bench/moe_layer.py``
    (grouped/loop 1.23-1.44 on one thread; docs/gpu-performance.md)."""
    if GROUPED_MM is not None:
        return GROUPED_MM
    return x.is_cuda and hasattr(torch, "_grouped_mm")


def _autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The autocast dtype of ``x``'s device where autocast is on, else None."""
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None


def expert_counts(sorted_e_N: torch.Tensor, num_experts: int) -> torch.Tensor:
    """[E] assignments per expert from the sorted expert ids: the boundaries of each id's run
    (``searchsorted``), differenced. Exact, a static shape and no host sync (``bincount``
    reads min/max back to the host on CUDA and breaks a compiled graph)."""
    bounds = torch.arange(num_experts + 1, device=sorted_e_N.device, dtype=sorted_e_N.dtype)
    return torch.diff(torch.searchsorted(sorted_e_N, bounds))


class _RouterGating(torch.autograd.Function):
    """logits = x·Wᵀ computed in ``dtype`` from a lower-precision input and weight, which are
    saved as they are and cast again in backward (Megatron-Core's RouterGatingLinearFunction,
    ``moe_utils.py``): the fp32 copy of the [T, D] input is never kept for backward."""

    @staticmethod
    def forward(ctx: Any, x_TD: torch.Tensor, w_ED: torch.Tensor,
                dtype: torch.dtype) -> torch.Tensor:
        ctx.save_for_backward(x_TD, w_ED)
        ctx.dtype = dtype
        return F.linear(x_TD.to(dtype), w_ED.to(dtype))

    @staticmethod
    def backward(ctx: Any, g_TE: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x_TD, w_ED = ctx.saved_tensors
        g_TE = g_TE.to(ctx.dtype)
        gx = gw = None
        if ctx.needs_input_grad[0]:
            gx = g_TE.mm(w_ED.to(ctx.dtype)).to(x_TD.dtype)
        if ctx.needs_input_grad[1]:
            gw = g_TE.t().mm(x_TD.to(ctx.dtype)).to(w_ED.dtype)
        return gx, gw, None


class MoELayer(FixedDtypeBuffers):
    """Token-choice top-K MoE with SwiGLU experts stored as stacked weights [E, D, F]."""

    def __init__(self, d_model: int, d_ff: int, cfg: MoEConfig, init_std: float):
        # nn.Module.__init__ directly: a subclass may also inherit DeepSpeed's MoE marker class
        # (moe_core.train.parallel), whose __init__ must not run.
        nn.Module.__init__(self)
        self.cfg = cfg
        self.d_model = d_model
        E = cfg.num_experts
        f = cfg.resolved_expert_d_ff(d_ff)
        self.expert_d_ff = f
        r = cfg.router
        self.router = nn.Linear(d_model, E, bias=False)
        self.router_init_std = r.init_std or math.sqrt(2 / (5 * d_model))
        self.w_gate = nn.Parameter(torch.empty(E, d_model, f))
        self.w_up = nn.Parameter(torch.empty(E, d_model, f))
        self.w_down = nn.Parameter(torch.empty(E, f, d_model))
        self.init_std = init_std
        self.shared: nn.Module | None = None
        if cfg.num_shared_experts > 0:
            self.shared = SwiGLU(d_model, f * cfg.num_shared_experts)
        # Loss-free balancing bias (003 §2) and the replica bias noise of expert upcycling
        # (003 Def. 3.1): changes which experts are selected, never the weights.
        self.register_buffer("expert_bias", torch.zeros(E))
        # Per-layer aux coefficient α^(l) (002 §4.2), set from router.aux_coef: training state
        # (in the state dict) only where adaptive updates overwrite it, never configuration
        # carried from a parent (moe_core.moe.named_state).
        self.register_buffer("aux_coef", torch.tensor(float(r.aux_coef)),
                             persistent=r.adaptive_aux)
        # Assignment counts and drop counts accumulated since the last balancing update.
        self.register_buffer("load_accum", torch.zeros(E, dtype=torch.float64), persistent=False)
        self.register_buffer("drop_accum", torch.zeros(2, dtype=torch.float64), persistent=False)
        self.record_stats = False
        self.last_stats: dict[str, Any] | None = None
        # Expert parallelism: this rank holds experts [ep_rank·E/ep_size, (ep_rank+1)·E/ep_size).
        self.ep_size, self.ep_rank, self.ep_group = 1, 0, None
        self.experts_kernel: str = cfg.experts_kernel
        """``liger``: :func:`liger_experts`; anything else (``grouped``, an unresolved
        ``auto``): torch's path (``_use_grouped_mm``). Set at set-up by
        :meth:`select_experts_kernel`."""
        self.reset_parameters()
        if "torch._dynamo" in sys.modules:  # compiling is possible now; the import is paid
            exclude_from_compile()

    @torch.no_grad()
    def shard_experts(self, ep_rank: int, ep_size: int, group: Any = None) -> None:
        """Keep only this rank's slice of the experts (call after loading full weights).

        Tokens then travel to the rank owning their expert and back through all-to-all on
        ``group`` (the expert-parallel process group)."""
        E = self.cfg.num_experts
        if E % ep_size:
            raise ValueError(f"moe.num_experts={E} is not divisible by {ep_size} expert ranks")
        el = E // ep_size
        sl = slice(ep_rank * el, (ep_rank + 1) * el)
        for name in ("w_gate", "w_up", "w_down"):
            old = getattr(self, name)
            setattr(self, name, nn.Parameter(old.data[sl].clone(), requires_grad=old.requires_grad))
        self.ep_size, self.ep_rank, self.ep_group = ep_size, ep_rank, group

    @torch.no_grad()
    def reset_parameters(self) -> None:
        nn.init.normal_(self.router.weight, std=self.router_init_std)  # 000 App. A.6
        for w in (self.w_gate, self.w_up, self.w_down):
            nn.init.normal_(w, std=self.init_std)
        if self.shared is not None:
            self.shared.reset_parameters(self.init_std)

    def select_experts_kernel(self, device: torch.device, dtype: torch.dtype) -> str:
        """Resolve ``moe.experts_kernel`` for this device and compute dtype
        (``kernel_choice.pick``; a ConfigError where ``liger`` cannot run): call at set-up,
        after the model is on its device and its experts are sharded. Sets and returns
        :attr:`experts_kernel`, ``grouped`` or ``liger``."""
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
        self.experts_kernel = kernel_choice.pick(
            self.cfg.experts_kernel, device_type=device.type, device_name=name,
            dtype=str(dtype).removeprefix("torch."), E=self.num_experts, K=self.cfg.top_k,
            d=self.d_model, f=self.expert_d_ff, ep_size=self.ep_size)
        return self.experts_kernel

    @property
    def num_experts(self) -> int:
        """Total routed experts (over all expert-parallel ranks)."""
        return self.cfg.num_experts

    @property
    def num_local_experts(self) -> int:
        return self.w_gate.shape[0]

    # ``.to()``, ``.cuda()``, ``.bfloat16()`` … move the balancing buffers but never change their
    # dtype: ``expert_bias`` and ``aux_coef`` stay fp32 and the load / drop counters fp64
    # whatever the model is cast to (in bf16 a loss-free step of 1e-3 is lost at |b| >= 0.5,
    # and counts above 256 are no longer exact)
    FIXED_DTYPE_BUFFERS = ("expert_bias", "aux_coef", "load_accum", "drop_accum")

    def router_logits(self, x_TD: torch.Tensor) -> torch.Tensor:
        """[T, E] router logits computed in fp32 from the (possibly bf16) input and weight, as
        Megatron-Core does: bf16 logits (8 mantissa bits) tie or swap near-equal experts and
        flip the top-K choice. The fp32 cast happens inside :class:`_RouterGating`, so backward
        keeps the bf16 input, not an fp32 copy. On an fp32 model this is ``self.router(x_TD)``.
        Autocast is off here: under ``optim.bf16_mode: torch_autocast`` it would run this
        ``F.linear`` in bf16."""
        w = self.router.weight
        with torch.autocast(device_type=x_TD.device.type, enabled=False):
            if x_TD.dtype == torch.float32 and w.dtype == torch.float32:
                return F.linear(x_TD, w)
            return _RouterGating.apply(x_TD, w, torch.float32)

    def routing(self, x_TD: torch.Tensor) -> Routing:
        """Route [T, D] tokens: fp32 logits, softmax, selection bias and top-K (``route``).
        The bias is always passed: adding a zero bias changes no score (s + 0 == s), and a
        test of ``expert_bias.any()`` would cost a host sync and a graph break per layer."""
        return route(self.router_logits(x_TD), top_k=self.cfg.top_k, cfg=self.cfg.router,
                     selection_bias_E=self.expert_bias)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (output with the shape of ``x``, this layer's weighted router loss).

        Every shape depends on T, K, D and E only, never on the routing, so on the CUDA path
        (grouped experts, atomic-free dispatch/combine) the layer is one compiled graph with no
        host sync, whatever the expert loads (tests/moe_core/test_compile_graphs.py)."""
        shape = x.shape
        x_TD = x.reshape(-1, shape[-1])
        T = x_TD.shape[0]
        cfg = self.cfg
        E = self.num_experts
        routing = self.routing(x_TD)

        # Sort-based dispatch: a stable sort keeps token order within each expert, so with a
        # capacity the earliest tokens win (Switch Transformer's priority). Slot i = t·K + k
        # is token t's k-th choice; ``slot_N`` lists the slots in expert order.
        flat_e = routing.topk_idx_TK.reshape(-1)
        sorted_e, slot_N = torch.sort(flat_e, stable=True)
        counts_E = expert_counts(sorted_e, E)
        w_N = routing.topk_weight_TK.reshape(-1)[slot_N]
        dropped = None
        if cfg.capacity_factor is not None:
            w_N, dropped = self._capacity_weights(sorted_e, counts_E, w_N, T)

        if self.experts_kernel == "liger":
            out_TD = self._liger_experts(x_TD, routing, slot_N, w_N, dropped is not None)
        else:
            out_TD = self._sorted_experts(x_TD, slot_N, counts_E, w_N)
        if self.shared is not None:
            out_TD = out_TD + self.shared(x_TD)

        loss = self._router_loss(routing, counts_E)
        # Counted once per forward: not again while activation checkpointing recomputes it.
        if not in_recompute():
            if self.training:
                self._count(counts_E, dropped, T)
            if self.record_stats:
                self._record_stats(routing, counts_E, dropped, T)
        return out_TD.reshape(shape), loss

    def _sorted_experts(self, x_TD: torch.Tensor, slot_N: torch.Tensor, counts_E: torch.Tensor,
                        w_N: torch.Tensor) -> torch.Tensor:
        """[T, D] weighted expert outputs: the rows dispatched in expert order, the experts
        (:meth:`_experts`), the rows combined back per token. Every slot keeps its row (a
        dropped one with weight 0), so dispatch/combine are dropless."""
        T, K = x_TD.shape[0], self.cfg.top_k
        atomic_free = _atomic_free(x_TD)
        if atomic_free:
            x_ND = dispatch(x_TD, slot_N, K, dropless=True)
        else:
            x_ND = x_TD[slot_N // K]
        y_ND = self._experts(x_ND, counts_E, w_N).to(x_TD.dtype)
        if atomic_free:
            return combine(y_ND, slot_N, T, K, dropless=True)
        return torch.zeros_like(x_TD).index_add_(0, slot_N // K, y_ND)

    def _liger_experts(self, x_TD: torch.Tensor, routing: Routing, slot_N: torch.Tensor,
                       w_N: torch.Tensor, capped: bool) -> torch.Tensor:
        """[T, D] by :func:`liger_experts` from the token-order top-K ids and weights (with a
        capacity, the expert-order weights, dropped ones 0, put back in slot order)."""
        if self.ep_size > 1:
            raise ValueError("moe.experts_kernel=liger does not run with expert parallelism")
        T, K = x_TD.shape[0], self.cfg.top_k
        w_TK = (w_N.new_empty(T * K).index_copy(0, slot_N, w_N).view(T, K) if capped
                else routing.topk_weight_TK)
        out = liger_experts(x_TD, routing.topk_idx_TK, w_TK, self.w_gate, self.w_up,
                            self.w_down)
        return out.to(x_TD.dtype)

    def _capacity_weights(self, sorted_e_N: torch.Tensor, counts_E: torch.Tensor,
                          w_N: torch.Tensor, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Routing weights with those of the assignments past their expert's capacity set to 0
        (a static shape: no boolean mask), and the number dropped. An assignment's position in
        its expert is its sorted index minus the expert's first index."""
        E, K = self.num_experts, self.cfg.top_k
        cap = capacity(T, K, E, self.cfg.capacity_factor)
        starts_E = torch.cumsum(counts_E, 0) - counts_E
        pos_N = torch.arange(sorted_e_N.numel(), device=sorted_e_N.device) - starts_E[sorted_e_N]
        return w_N.masked_fill(pos_N >= cap, 0.0), overflow_count(counts_E, cap)

    def _experts(self, x_ND: torch.Tensor, counts_E: torch.Tensor,
                 w_N: torch.Tensor) -> torch.Tensor:
        """Weighted SwiGLU of the expert-sorted rows: expert-parallel, grouped or the loop.
        Under autocast (``optim.bf16_mode: torch_autocast``) the rows and the fp32 expert
        weights are cast to the autocast dtype here, as torchtitan's ``_run_experts_grouped_mm``
        does: the experts take the bf16 grouped GEMM (no host sync), not fp32."""
        dt = _autocast_dtype(x_ND)
        x_ND = x_ND if dt is None else x_ND.to(dt)
        if self.ep_size > 1:
            return self._experts_parallel(x_ND, counts_E) * w_N.unsqueeze(-1).to(x_ND.dtype)
        return self._local_experts(x_ND, counts_E, w_N)

    def _local_experts(self, x_ND: torch.Tensor, counts_E: torch.Tensor,
                       w_N: torch.Tensor) -> torch.Tensor:
        ws = (self.w_gate, self.w_up, self.w_down)
        if _autocast_dtype(x_ND) is not None:
            ws = tuple(w.to(x_ND.dtype) for w in ws)
        if not _use_grouped_mm(x_ND):
            return swiglu_experts_loop(x_ND, counts_E.tolist(), *ws, w_N)
        if x_ND.dtype == torch.bfloat16:
            return swiglu_experts_grouped(x_ND, counts_E, *ws, w_N)
        return _swiglu_experts_grouped_eager(x_ND, counts_E, *ws, w_N)

    @torch.no_grad()
    def _count(self, counts_E: torch.Tensor, dropped: torch.Tensor | None, T: int) -> None:
        """Add one training forward to the balancing counters, on the device and inside the
        compiled graph (a buffer mutation; no host read)."""
        E, K = self.num_experts, self.cfg.top_k
        self.load_accum.add_(counts_E.to(self.load_accum.dtype))
        # The drop signal of 002 §4.2: real drops with a capacity; for a dropless layer,
        # the assignments a capacity factor of 1 would have dropped.
        if dropped is not None:
            self.drop_accum[0] += dropped.to(self.drop_accum.dtype)
        elif self.cfg.router.adaptive_aux:
            self.drop_accum[0] += overflow_count(counts_E, capacity(T, K, E, 1.0))
        self.drop_accum[1] += T * K

    def _record_stats(self, routing: Routing, counts_E: torch.Tensor,
                      dropped: torch.Tensor | None, T: int) -> None:
        """Router statistics of one forward as Python numbers (evaluation only, when
        ``record_stats`` is on: host reads, so kept out of compiled graphs by
        :func:`exclude_from_compile`)."""
        with torch.no_grad():
            n = 0 if dropped is None else int(dropped)
            self.last_stats = self._stats(routing, counts_E, n, T)

    def _experts_parallel(self, x_ND: torch.Tensor, counts_E: torch.Tensor) -> torch.Tensor:
        """Expert-parallel expert compute: rows (sorted by global expert) go to the rank that
        owns their expert through an all-to-all, are computed there, and come back in order."""
        import torch.distributed as dist
        from torch.distributed.nn.functional import all_to_all_single

        P, El = self.ep_size, self.num_local_experts
        send_PE = counts_E.view(P, El)
        recv_PE = torch.empty_like(send_PE)  # [source rank, local expert]
        dist.all_to_all_single(recv_PE, send_PE.contiguous(), group=self.ep_group)
        # all_to_all_single takes its splits as Python ints: one host read for both
        send_splits, recv_splits = torch.stack([send_PE.sum(1), recv_PE.sum(1)]).tolist()
        n_recv = sum(recv_splits)
        x_recv = all_to_all_single(
            x_ND.new_empty((n_recv, x_ND.shape[1])), x_ND.contiguous(),
            recv_splits, send_splits, group=self.ep_group,
        )
        # Received rows are grouped by source rank, then local expert: regroup by expert.
        local_e = torch.repeat_interleave(
            torch.arange(El, device=x_ND.device).repeat(P), recv_PE.reshape(-1),
            output_size=n_recv,
        )
        perm = torch.sort(local_e, stable=True).indices
        y = self._local_experts(x_recv[perm], recv_PE.sum(0), x_recv.new_ones(n_recv))
        y_recv = torch.empty_like(y).index_copy(0, perm, y)
        return all_to_all_single(
            x_ND.new_empty((sum(send_splits), y.shape[1])), y_recv, send_splits, recv_splits,
            group=self.ep_group,
        )

    def _router_loss(self, routing: Routing, counts_E: torch.Tensor) -> torch.Tensor:
        rcfg = self.cfg.router
        loss = routing.probs_TE.new_zeros(())
        if rcfg.aux_loss == "switch":
            loss = loss + self.aux_coef * balancing.switch_aux_loss(
                routing.probs_TE, routing.topk_idx_TK, counts_E=counts_E
            )
        elif rcfg.aux_loss == "squared":
            loss = loss + self.aux_coef * balancing.squared_aux_loss(routing.probs_TE)
        if rcfg.z_loss_coef > 0:
            loss = loss + rcfg.z_loss_coef * balancing.z_loss(routing.logits_TE)
        return loss

    @torch.no_grad()
    def _stats(
        self, routing: Routing, counts_E: torch.Tensor, dropped: int, T: int
    ) -> dict[str, Any]:
        K, E = self.cfg.top_k, self.num_experts
        probs = routing.probs_TE
        r12, r23 = stats.max_ratios(probs)
        # Drop rate at capacity factor 1 is reported even for dropless layers: it is the
        # imbalance signal 002 §4.2 feeds to adaptive aux coefficients.
        cap1 = capacity(T, K, E, 1.0)
        return {
            "load": stats.load_fractions(counts_E).tolist(),
            "drop_rate": dropped / (T * K),
            "overflow_rate_cf1": float(overflow_count(counts_E, cap1)) / (T * K),
            "entropy": stats.routing_entropy(probs),
            "max1_max2": r12,
            "max2_max3": r23,
            "aux_switch": float(balancing.switch_aux_loss(probs, routing.topk_idx_TK,
                                                          counts_E=counts_E)),
            "aux_coef": float(self.aux_coef),
        }

    @torch.no_grad()
    def expert_vectors(self) -> torch.Tensor:
        """Each (local) expert's parameters flattened to one row, [E_local, 3·D·F]."""
        E = self.num_local_experts
        return torch.cat(
            [self.w_gate.reshape(E, -1), self.w_up.reshape(E, -1), self.w_down.reshape(E, -1)],
            dim=1,
        )

    def balancing_state(self) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any] | None]:
        """Copy of what a forward changes (the load/drop counters, the last statistics)."""
        return self.load_accum.clone(), self.drop_accum.clone(), self.last_stats

    @torch.no_grad()
    def restore_balancing_state(
        self, state: tuple[torch.Tensor, torch.Tensor, dict[str, Any] | None]
    ) -> None:
        self.load_accum.copy_(state[0])
        self.drop_accum.copy_(state[1])
        self.last_stats = state[2]

    @torch.no_grad()
    def update_balancing(self) -> dict[str, float]:
        """Apply loss-free bias and adaptive aux-coefficient updates from the loads seen since
        the last call, then reset the accumulators. Call once per optimizer step. No host sync
        unless ``router.adaptive_aux`` (its rule runs on the host and returns the drop rate and
        coefficient): the loss-free bias moves only where tokens were counted, a device-side
        select."""
        rcfg = self.cfg.router
        out: dict[str, float] = {}
        if rcfg.loss_free_rate > 0:
            new = balancing.loss_free_bias_update(self.expert_bias, self.load_accum,
                                                  rcfg.loss_free_rate)
            self.expert_bias.copy_(torch.where(self.drop_accum[1] > 0, new, self.expert_bias))
        if rcfg.adaptive_aux:
            total = float(self.drop_accum[1])
            if total > 0:
                d = float(self.drop_accum[0]) / total
                self.aux_coef.fill_(
                    balancing.adaptive_aux_coef(
                        float(self.aux_coef),
                        d,
                        xi=rcfg.adaptive_xi,
                        alpha_max=rcfg.adaptive_alpha_max,
                        beta=rcfg.adaptive_beta,
                    )
                )
                out["drop_rate"] = d
                out["aux_coef"] = float(self.aux_coef)
        self.load_accum.zero_()
        self.drop_accum.zero_()
        return out


_excluded = False


def exclude_from_compile() -> None:
    """Keep the functions that must run eager out of every ``torch.compile`` graph, as
    ``@torch.compiler.disable`` on them would: :func:`swiglu_experts_loop`,
    :func:`liger_experts`, :data:`_swiglu_experts_grouped_eager` and
    ``MoELayer._record_stats``. Not done at import, where ``torch.compiler.disable`` would
    import dynamo (over a second of CPU) in every process, compiling or not: called before
    anything compiles (``Transformer.enable_speedups``), and by every ``MoELayer`` built once
    dynamo is loaded; call it before compiling a block by hand. Idempotent; eager calls are
    unchanged either way."""
    global _excluded
    if _excluded:
        return
    g = globals()
    for name in ("swiglu_experts_loop", "liger_experts"):
        g[name] = torch.compiler.disable(g[name])
    g["_swiglu_experts_grouped_eager"] = torch.compiler.disable(swiglu_experts_grouped)
    MoELayer._record_stats = torch.compiler.disable(MoELayer._record_stats)
    _excluded = True


# At import after all, as the decorators were: with dynamo loaded only on demand, 2-rank gloo
# expert-parallel processes aborted at exit ("terminate called without an active exception",
# 3 of 12 runs of tests/moe_core/test_expert_parallel_grouped.py; 0 of 12 with dynamo loaded).
# The sweep driver never imports this module, so it still loads no torch.
exclude_from_compile()

"""Building blocks shared by the dense decoder and the MoE layer: RMSNorm, SwiGLU, RoPE.

Shape legend: B batch, S sequence, D model dim, H heads, Dh head dim.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

_recompute = threading.local()


def in_recompute() -> bool:
    """True while activation checkpointing recomputes a forward inside the backward pass:
    stateful side effects of a forward (the MoE layer's balancing counters and statistics)
    must not happen a second time then."""
    return getattr(_recompute, "depth", 0) > 0


@contextlib.contextmanager
def _recomputing() -> Iterator[None]:
    _recompute.depth = getattr(_recompute, "depth", 0) + 1
    try:
        yield
    finally:
        _recompute.depth -= 1


def checkpointed(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` under non-reentrant activation checkpointing: its activations are freed
    after the forward and recomputed in the backward, with ``in_recompute()`` True during the
    recomputation (and the RNG state replayed)."""
    return torch.utils.checkpoint.checkpoint(
        fn, *args, use_reentrant=False,
        context_fn=lambda: (contextlib.nullcontext(), _recomputing()),
    )


class FixedDtypeBuffers(nn.Module):
    """A module whose buffers named in ``FIXED_DTYPE_BUFFERS`` follow ``.to()``, ``.cuda()``,
    ``.bfloat16()`` … to the new device but keep their dtype whatever the module is cast to
    (DeepSpeed's bf16 engine casts the whole model)."""

    FIXED_DTYPE_BUFFERS: tuple[str, ...] = ()

    def _apply(self, fn, recurse: bool = True):
        kept = {n: self._buffers.pop(n) for n in self.FIXED_DTYPE_BUFFERS if n in self._buffers}
        try:
            super()._apply(fn, recurse)
        finally:
            for n, b in kept.items():
                moved = fn(b)
                self._buffers[n] = moved if moved.dtype == b.dtype else b.to(moved.device)
        return self


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.to(x.dtype) * self.weight


class SwiGLU(nn.Module):
    """down(silu(gate(x)) · up(x)), weights stored [in, out] like the MoE experts."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w_gate = nn.Parameter(torch.empty(d_model, d_ff))
        self.w_up = nn.Parameter(torch.empty(d_model, d_ff))
        self.w_down = nn.Parameter(torch.empty(d_ff, d_model))

    @torch.no_grad()
    def reset_parameters(self, std: float) -> None:
        for w in (self.w_gate, self.w_up, self.w_down):
            nn.init.normal_(w, std=std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (F.silu(x @ self.w_gate) * (x @ self.w_up)) @ self.w_down


def rope_inv_freq(head_dim: int, theta: float, scaling: Any = None) -> torch.Tensor:
    """The Dh/2 rotation frequencies θ^(−2i/Dh) (fp64), with ``scaling`` (a
    ``moe_core.config.RopeScaling``) applied: ``linear`` divides them all by the factor;
    ``llama3`` (Llama 3.1's published rule) divides those of wavelength above L/low_freq_factor
    by it, keeps those below L/high_freq_factor, and blends linearly in 1/wavelength between
    (L the original context length)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if scaling is None:
        return inv
    if scaling.kind == "linear":
        return inv / scaling.factor
    L, lo, hi = scaling.original_max_position, scaling.low_freq_factor, scaling.high_freq_factor
    wavelen = 2 * torch.pi / inv
    smooth = ((L / wavelen - lo) / (hi - lo)).clamp(0.0, 1.0)  # 0 → divided, 1 → kept
    return (1 - smooth) * inv / scaling.factor + smooth * inv


def rope_cache(seq_len: int, head_dim: int, theta: float,
               scaling: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [S, Dh/2] for rotary embeddings (``rope_inv_freq``'s frequencies)."""
    inv = rope_inv_freq(head_dim, theta, scaling)
    ang = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv)
    return ang.cos().float(), ang.sin().float()


def apply_rope(x_BHSD: torch.Tensor, cos_SD: torch.Tensor, sin_SD: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) by position-dependent angles (RoPE, Llama)."""
    x1, x2 = x_BHSD[..., 0::2].float(), x_BHSD[..., 1::2].float()
    c, s = cos_SD[: x_BHSD.shape[-2]], sin_SD[: x_BHSD.shape[-2]]
    out = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    return out.to(x_BHSD.dtype)

"""Heuristic perturbations of copied experts, as pure functions on stacked expert tensors.

003 App. D (Table 9) evaluates these on the replicas of expert upcycling; 000 App. A.6 mentions
noise and partial re-initialisation for dense → MoE (004 §3.8 tries 50 % re-initialisation).
None beat plain copying in those papers; they exist here so that sweeps can ablate them.

Shape legend: R experts being perturbed, D model dim, F expert hidden dim.
Every function returns new tensors and never writes into its inputs. Random draws come from a
CPU ``torch.Generator`` (then move to the tensors' device), so results depend only on the seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch

from moe_core.errors import ConfigError

DropInit = Literal["normal", "xavier", "kaiming"]


class ExpertWeights(NamedTuple):
    """A stack of SwiGLU experts: out = (silu(x·gate) ⊙ (x·up))·down."""

    gate: torch.Tensor
    """[R, D, F]"""
    up: torch.Tensor
    """[R, D, F]"""
    down: torch.Tensor
    """[R, F, D]"""


def _randn_like(w: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(w.shape, generator=gen, dtype=torch.float32).to(w.device, w.dtype)


def add_noise(w: ExpertWeights, lam: float, *, generator: torch.Generator) -> ExpertWeights:
    """Copy + noise (003 App. D; 000 App. A.6): W + λ·std(W)·N(0, 1), std per expert and matrix
    ("calibrated" noise: λ is relative to each matrix's own scale)."""
    if lam == 0:
        return ExpertWeights(*(t.clone() for t in w))
    out = []
    for t in w:
        std = t.float().std(dim=(1, 2), keepdim=True).to(t.dtype)
        out.append(t + lam * std * _randn_like(t, generator))
    return ExpertWeights(*out)


def scale_copy(w: ExpertWeights, s: float) -> ExpertWeights:
    """Scaled copy (003 App. D): every weight times ``s`` (direction kept, magnitude changed)."""
    return ExpertWeights(*(t * s for t in w))


def interpolate(w: ExpertWeights, neighbour: ExpertWeights, alpha: float) -> ExpertWeights:
    """Interpolation with a neighbour (003 App. D): α·w + (1 − α)·w_neighbour. α = 1 copies."""
    if alpha == 1:
        return ExpertWeights(*(t.clone() for t in w))
    return ExpertWeights(*(alpha * a + (1 - alpha) * b for a, b in zip(w, neighbour)))


def _init_std(t: torch.Tensor, fan_in: int, fan_out: int, init: DropInit) -> torch.Tensor:
    if init == "xavier":
        return torch.full((t.shape[0], 1, 1), math.sqrt(2.0 / (fan_in + fan_out)))
    if init == "kaiming":
        return torch.full((t.shape[0], 1, 1), math.sqrt(2.0 / fan_in))
    return t.float().std(dim=(1, 2), keepdim=True)


def drop_reinit(
    w: ExpertWeights, fraction: float, *, init: DropInit = "normal", generator: torch.Generator
) -> ExpertWeights:
    """Drop-Upcycling partial re-initialisation (003 App. D, [39]; 000 App. A.6 "partially
    randomizing"; 004 §3.8 with fraction 0.5).

    Per expert, ``round(fraction·F)`` hidden units are drawn at random and re-initialised in all
    three projections (gate and up columns, down rows: one hidden unit is one column of gate/up
    and one row of down). ``init``: ``normal`` draws from N(mean, std) of the original matrix
    (Drop-Upcycling's choice), ``xavier`` from N(0, 2/(fan_in + fan_out)), ``kaiming`` from
    N(0, 2/fan_in).
    """
    R, D, F = w.gate.shape
    n = round(fraction * F)
    gate, up, down = (t.clone() for t in w)
    if n == 0:
        return ExpertWeights(gate, up, down)
    stats = []
    for t, fi, fo in ((w.gate, D, F), (w.up, D, F), (w.down, F, D)):
        mean = t.float().mean(dim=(1, 2), keepdim=True) if init == "normal" else None
        stats.append((mean, _init_std(t, fi, fo, init)))
    for r in range(R):
        idx = torch.randperm(F, generator=generator)[:n].to(w.gate.device)
        for t, (mean, std), hidden_dim in ((gate, stats[0], 1), (up, stats[1], 1),
                                           (down, stats[2], 0)):
            shape = (D, n) if hidden_dim == 1 else (n, D)
            new = torch.randn(shape, generator=generator) * std[r]
            if mean is not None:
                new = new + mean[r]
            t[r].index_copy_(hidden_dim, idx, new.to(t.device, t.dtype))
    return ExpertWeights(gate, up, down)


@dataclass(frozen=True, kw_only=True, slots=True)
class Perturbation:
    """Perturbations applied to copied experts, in the order interpolate → drop → scale → noise.
    The defaults are the identity (plain copy, 003 §4.1)."""

    noise: float = 0.0
    """λ of copy + noise: W + λ·std(W)·N(0, 1) (003 App. D uses 0.01–0.05)."""
    scale: float = 1.0
    """s of scaled copy (003 App. D uses 0.90–1.05)."""
    drop_fraction: float = 0.0
    """Fraction of hidden units re-initialised (Drop-Upcycling; 003 App. D uses 0.3–0.7)."""
    drop_init: DropInit = "normal"
    """Distribution of re-initialised weights: normal (original mean/std), xavier, kaiming."""
    interpolate: float = 1.0
    """α of α·w + (1−α)·w_neighbour, the neighbour being the next source expert (003 App. D uses
    0.2–0.7). Only for expand_experts (dense → MoE has no distinct neighbours)."""

    def __post_init__(self) -> None:
        if not (self.noise >= 0 and math.isfinite(self.noise)):
            raise ConfigError(f"perturb.noise={self.noise} must be a finite value >= 0")
        if not (self.scale > 0 and math.isfinite(self.scale)):
            raise ConfigError(f"perturb.scale={self.scale} must be a finite value > 0")
        if not 0.0 <= self.drop_fraction <= 1.0:
            raise ConfigError(f"perturb.drop_fraction={self.drop_fraction} must lie in [0, 1]")
        if self.drop_init not in ("normal", "xavier", "kaiming"):
            raise ConfigError(
                f"perturb.drop_init={self.drop_init!r} is not known; use 'normal', 'xavier' "
                "or 'kaiming'"
            )
        if not 0.0 <= self.interpolate <= 1.0:
            raise ConfigError(
                f"perturb.interpolate={self.interpolate} must lie in [0, 1] (1 = plain copy)"
            )

    @property
    def is_identity(self) -> bool:
        return (self.noise == 0 and self.scale == 1 and self.drop_fraction == 0
                and self.interpolate == 1)


def apply_perturbation(
    w: ExpertWeights,
    p: Perturbation,
    *,
    generator: torch.Generator,
    neighbour: ExpertWeights | None = None,
) -> ExpertWeights:
    """All of ``p``'s perturbations on the stack ``w`` (``neighbour``: the stack to interpolate
    with, same shapes; needed only when ``p.interpolate < 1``)."""
    if p.interpolate != 1:
        if neighbour is None:
            raise ConfigError(
                f"perturb.interpolate={p.interpolate} needs neighbouring experts; it applies to "
                "expand_experts only (set interpolate=1 for dense_to_moe)"
            )
        w = interpolate(w, neighbour, p.interpolate)
    if p.drop_fraction > 0:
        w = drop_reinit(w, p.drop_fraction, init=p.drop_init, generator=generator)
    if p.scale != 1:
        w = scale_copy(w, p.scale)
    if p.noise > 0:
        w = add_noise(w, p.noise, generator=generator)
    if p.is_identity:
        w = ExpertWeights(*(t.clone() for t in w))
    return w

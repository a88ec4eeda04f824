"""MoE → MoE expert upcycling U_m (003 Def. 3.1, §4, App. B, App. D).

Shape legend: E source experts, M = m·E experts after expansion, D model dim, f expert d_ff.

Layout of an expanded layer: new experts 0..E−1 are the source experts themselves (weights, router
rows and router biases untouched); experts E..M−1 are the replicas, grouped by source in source
order (the r_e − 1 extra copies of expert 0, then of expert 1, ...). ``ExpansionMap.sources[i][j]``
is the source of new expert j in block i; the same map expands optimizer moments
(:func:`moe_core.upcycle.optim.expand_optimizer_state`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from moe_core.config import ModelConfig
from moe_core.errors import ConfigError
from moe_core.model import Transformer
from moe_core.moe.named_state import is_adapted_key, load_model_state
from moe_core.upcycle._state import (
    State,
    generator,
    mlp_key,
    moe_layer_ids,
    rebuild,
    take,
    to_torch_state,
)
from moe_core.upcycle.perturb import ExpertWeights, Perturbation, apply_perturbation
from moe_core.upcycle.utility import (
    GRADIENT_STRATEGIES,
    check_strategy,
    expert_scores,
    replication_counts,
)

EXPERT_PARAMS = ("w_gate", "w_up", "w_down", "router.weight")
"""Per-expert tensors (leading dim E) that expansion indexes, weights and router rows."""


@dataclass(frozen=True, slots=True)
class ExpansionMap:
    """Which source expert each new expert copies, per MoE layer (picklable, for Ray)."""

    factor: int
    num_source_experts: int
    sources: dict[int, tuple[int, ...]]
    """Block index → source expert of each of the factor·E new experts."""

    def index(self, layer: int) -> torch.Tensor:
        """[M] int64 source indices of block ``layer`` (for ``index_select`` along dim 0)."""
        return torch.tensor(self.sources[layer], dtype=torch.long)

    def counts(self, layer: int) -> list[int]:
        """r_e: copies of each source expert (itself included) in block ``layer``."""
        r = [0] * self.num_source_experts
        for e in self.sources[layer]:
            r[e] += 1
        return r

    def is_replica(self, layer: int) -> torch.Tensor:
        """[M] bool, True for the added copies (all but the first E experts)."""
        m = torch.zeros(len(self.sources[layer]), dtype=torch.bool)
        m[self.num_source_experts:] = True
        return m


def _sources(counts: list[int]) -> tuple[int, ...]:
    E = len(counts)
    return tuple(range(E)) + tuple(e for e in range(E) for _ in range(counts[e] - 1))


def _check_args(cfg: ModelConfig, factor: int, strategy: str, router_noise: float) -> None:
    if cfg.moe is None:
        raise ConfigError(
            "expand_experts needs an MoE parent (model.moe is null); use dense_to_moe for a "
            "dense model"
        )
    if not isinstance(factor, int) or isinstance(factor, bool) or factor < 2:
        raise ConfigError(f"upcycle.factor={factor!r} must be an integer >= 2 (003 Def. 3.1)")
    check_strategy(strategy)
    if not (router_noise >= 0 and math.isfinite(router_noise)):
        raise ConfigError(
            f"upcycle.router_noise={router_noise} must be a finite value >= 0 (δ of U(−δ, δ))"
        )


def expand_experts_state(
    state: Mapping[str, Any],
    cfg: ModelConfig,
    factor: int,
    *,
    strategy: str = "uniform",
    batch: Any = None,
    scores: Mapping[int, Any] | None = None,
    router_noise: float = 0.0,
    seed: int = 0,
    perturb: Perturbation | None = None,
) -> tuple[State, ModelConfig, ExpansionMap]:
    """E-expert state dict → (factor·E-expert state dict, its ModelConfig, the ExpansionMap).

    ``state`` values may be torch tensors or numpy arrays; it is never modified, and the result
    holds fresh torch tensors. Top-K is unchanged. Per MoE layer (003 Def. 3.1): replication
    counts r_e (``uniform``: r_e = factor; utility strategies: greedy on per-layer scores, see
    :mod:`moe_core.upcycle.utility`); every replica copies its source's weights and router row;
    replica router biases (the selection bias ``expert_bias``, 003 §2) get the source's bias plus
    independent U(−δ, δ) noise with δ = ``router_noise``; ``perturb`` (003 App. D) applies to the
    replicas only, interpolating with the next source expert (e+1 mod E).

    Utility strategies take ``scores`` (block index → [E]) when given; otherwise the parent model
    is built from ``state`` here (on CPU) and scored on ``batch`` (calibration tokens [B, S]); on
    a GPU, score a built model with :func:`~moe_core.upcycle.utility.expert_scores` and pass
    ``scores``.

    After expansion the top-K over m identical copies takes whole copy sets: doubling a top-2
    model computes exactly the source at top-1 until the copies diverge (003's "gap < 1e-2" is
    empirical). For ``softmax_topk`` the selection bias is in probability units while the
    probabilities shrink by ~1/m; the bias is copied unchanged (003 Def. 3.1), so a large
    loss-free bias weighs relatively more right after expansion.
    """
    _check_args(cfg, factor, strategy, router_noise)
    assert cfg.moe is not None
    if strategy == "uniform" and scores is not None:
        raise ConfigError("scores were given but strategy='uniform' ignores them; pass a "
                          "utility strategy (grad_norm, saliency, weight_norm, curvature)")
    E = cfg.moe.num_experts
    layers = moe_layer_ids(cfg)
    tstate, borrowed = to_torch_state(state)
    for i in layers:
        w = take(tstate, mlp_key(i, "w_gate"), f"expand_experts (layer {i})")
        if w.shape[0] != E:
            raise ConfigError(
                f"expand_experts: {mlp_key(i, 'w_gate')} holds {w.shape[0]} experts but "
                f"moe.num_experts={E}; gather expert-parallel shards into a full state first"
            )
    if strategy != "uniform" and scores is None:
        if strategy in GRADIENT_STRATEGIES and batch is None:
            raise ConfigError(
                f"expand_experts(strategy={strategy!r}) needs batch= (calibration tokens "
                "[B, S]) for one forward/backward pass; pass a batch or use strategy='uniform'"
            )
        parent = Transformer(cfg)
        load_model_state(parent, tstate, resume=True)  # the parent as it was
        scores = expert_scores(parent, strategy, batch)
    sources = {}
    for i in layers:
        sc = None if scores is None else torch.as_tensor(scores[i], dtype=torch.float64)
        sources[i] = _sources(replication_counts(strategy, E, factor, sc))
    emap = ExpansionMap(factor=factor, num_source_experts=E, sources=sources)
    new_cfg = dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, num_experts=factor * E))
    return _apply_map(tstate, borrowed, emap, router_noise, seed, perturb), new_cfg, emap


def _apply_map(
    state: State,
    borrowed: set[str],
    emap: ExpansionMap,
    router_noise: float,
    seed: int,
    perturb: Perturbation | None,
) -> State:
    E = emap.num_source_experts
    gen = generator(seed)
    out: State = {}
    expanded = {mlp_key(i, n) for i in emap.sources for n in (*EXPERT_PARAMS, "expert_bias")}
    for k, v in state.items():  # the parent's α^(l) stays behind (named_state.RULES)
        if k not in expanded and not is_adapted_key(k):
            out[k] = v.clone() if k in borrowed else v
    for i in sorted(emap.sources):
        idx = emap.index(i)
        what = f"expand_experts (layer {i})"
        for n in EXPERT_PARAMS:
            w = take(state, mlp_key(i, n), what)
            out[mlp_key(i, n)] = w.index_select(0, idx.to(w.device))
        router = out[mlp_key(i, "router.weight")]
        bias = state.get(mlp_key(i, "expert_bias"))
        if bias is None:  # 003 Def. 3.1: add a router bias if there is none
            bias = torch.zeros(E, dtype=router.dtype, device=router.device)
        bias = bias.index_select(0, idx.to(bias.device))
        R = idx.numel() - E
        if router_noise > 0 and R > 0:
            # 003 Def. 3.1: independent U(−δ, δ) on the replicas' biases only.
            u = (torch.rand(R, generator=gen, dtype=torch.float64) * 2 - 1) * router_noise
            bias[E:] += u.to(bias.device, bias.dtype)
        out[mlp_key(i, "expert_bias")] = bias
        if perturb is not None and not perturb.is_identity and R > 0:
            nb = (idx[E:] + 1) % E  # 003 App. D: interpolate with the next source expert
            w_new = ExpertWeights(*(out[mlp_key(i, n)] for n in ("w_gate", "w_up", "w_down")))
            src = ExpertWeights(*(take(state, mlp_key(i, n), what)
                                  for n in ("w_gate", "w_up", "w_down")))
            pert = apply_perturbation(
                ExpertWeights(*(t[E:] for t in w_new)), perturb, generator=gen,
                neighbour=ExpertWeights(*(t.index_select(0, nb.to(t.device)) for t in src)),
            )
            for n, t_new, t_rep in zip(("w_gate", "w_up", "w_down"), w_new, pert):
                out[mlp_key(i, n)] = torch.cat([t_new[:E], t_rep], 0)
    return out


def expand_experts(
    model: torch.nn.Module,
    factor: int,
    *,
    strategy: str = "uniform",
    batch: Any = None,
    router_noise: float = 0.0,
    seed: int = 0,
    perturb: Perturbation | None = None,
    fisher_chunks: int = 8,
    return_map: bool = False,
) -> Any:
    """E-expert ``Transformer`` → a new factor·E-expert ``Transformer`` (003 Def. 3.1).

    Same operator as :func:`expand_experts_state`; utility strategies (``grad_norm``,
    ``saliency``, ``curvature``) score the experts with one forward/backward pass on ``batch``
    (``curvature``: ``fisher_chunks`` micro-batch passes) without changing the model.
    Returns the new model, or ``(model, ExpansionMap)`` with ``return_map=True`` (the map feeds
    :func:`moe_core.upcycle.optim.expand_optimizer_state`). The source model is not modified.
    """
    _check_args(model.config, factor, strategy, router_noise)
    layers = model.moe_layers()
    if any(getattr(m, "ep_size", 1) > 1 for m in layers):
        raise ConfigError("expand_experts needs the full (unsharded) experts; build the model "
                          "without expert parallelism or gather the state first")
    scores = None
    if strategy != "uniform":
        scores = expert_scores(model, strategy, batch, fisher_chunks=fisher_chunks)
    state, cfg, emap = expand_experts_state(
        model.state_dict(), model.config, factor, strategy=strategy, scores=scores,
        router_noise=router_noise, seed=seed, perturb=perturb,
    )
    new = rebuild(model, cfg, state, type(layers[0]))
    return (new, emap) if return_map else new

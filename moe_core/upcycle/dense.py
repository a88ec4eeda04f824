"""Dense → MoE upcycling (000 §2.1, App. A.6; 004 §2.1–2.3, §3.5, §3.9, App. A).

Shape legend: D model dim, F dense d_ff, f expert d_ff = F/G, G granularity (shards), N routed
experts (= copies·G), S shared experts.

Layout: routed expert j holds dense shard ``j mod G`` and belongs to virtual group ``j // G``
(004 App. A: experts = [FFN_0, FFN_1, FFN_0, FFN_1] for N=4, G=2).

Weight scaling for SwiGLU (004 §2.3.1, Eq. 2, re-derived). A routed expert computes
``down(silu(x·gate) ⊙ (x·up))``: it is homogeneous of degree 1 in ``up`` and of degree 1 in
``down`` (degree 2 in the pair), while ``gate`` passes through SiLU, which is not homogeneous. To
multiply an expert's output by exactly ``t`` we therefore scale ``up`` and ``down`` by √t each and
leave ``gate`` alone. (004's ∛(E·G²/T) scales W1 and W2 of a squared-ReLU MLP, whose output is of
degree 3 in them; the SwiGLU equivalent is √ on two projections, never a ∛.)

The factor t compensates the routing weights (see :func:`routed_output_scale`):
  * ``topk_softmax`` (and renormalized ``softmax_topk``): the K selected weights sum to 1. With
    virtual groups and K = m·G the top-K takes m whole groups; members of a group share a logit,
    so group g's G members get weight w_g/G each with Σ_g w_g = 1, and each group sums its G
    shards to the dense MLP: output = dense/G for any m. t = G, exact (coarse: t = 1).
  * ``softmax_topk`` without renormalization, under 004's uniform-probability assumption (each
    probability 1/N): the K = m·G selected experts are m whole groups, output = (m/N)·dense =
    K/(G·N)·dense, so t = N·G/K (= 004's E·G²/T, whose E is the expansion rate N/G). Exact when
    the router logits are equal (uniform probabilities) and whole groups are selected.
With shared experts (004 §3.9; width S·f, hidden slice s holds shard ``s mod G``) every shard i
has c_i shared copies; each shared copy and the routed part are each given 1/(c_i + 1) of the
shard's output, so routed + shared = dense exactly under the same conditions.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch

from moe_core.config import ModelConfig, MoEConfig
from moe_core.errors import ConfigError
from moe_core.upcycle._state import (
    State,
    generator,
    mlp_key,
    rebuild,
    take,
    to_torch_state,
)
from moe_core.upcycle.perturb import ExpertWeights, Perturbation, apply_perturbation


def granularity_of(moe: MoEConfig, d_ff: int) -> int:
    """G = dense d_ff / expert d_ff, from ``moe.expert_d_ff`` when given, else moe.granularity."""
    f = moe.resolved_expert_d_ff(d_ff)
    if d_ff % f:
        raise ConfigError(
            f"moe.expert_d_ff={f} does not divide model.d_ff={d_ff}; dense → MoE upcycling "
            "shards d_ff into whole experts: pick an expert_d_ff dividing d_ff"
        )
    return d_ff // f


def routed_output_scale(moe: MoEConfig, granularity: int) -> float:
    """Factor t by which the routed experts' outputs are multiplied so that, at initialisation,
    the MoE output equals the dense output (derivation in the module docstring):
    t = G for ``topk_softmax`` or renormalized ``softmax_topk``; t = N·G/K for ``softmax_topk``
    under uniform probabilities 1/N (004 Eq. 2 before its root)."""
    r = moe.router
    if r.order == "topk_softmax" or r.renormalize:
        return float(granularity)
    return moe.num_experts * granularity / moe.top_k


def router_init(
    num_experts: int,
    granularity: int,
    d_model: int,
    std: float,
    gen: torch.Generator,
    *,
    virtual_groups: bool,
) -> torch.Tensor:
    """Router weight [N, D] ~ N(0, std²) (000 App. A.6: variance 2/(5·d_model)). With virtual
    groups the G experts of one group share one row (004 App. A), so top-K with K a multiple of G
    selects whole groups, i.e. every shard equally often."""
    if virtual_groups and granularity > 1:
        rows = torch.randn(num_experts // granularity, d_model, generator=gen) * std
        return rows.repeat_interleave(granularity, dim=0)
    return torch.randn(num_experts, d_model, generator=gen) * std


def _shard_copies(num_shared: int, G: int) -> list[int]:
    """c_i: how many of the S shared hidden slices hold shard i (slice s holds shard s mod G)."""
    return [sum(1 for s in range(num_shared) if s % G == i) for i in range(G)]


def _check_dense_to_moe(dense_cfg: ModelConfig, moe_cfg: MoEConfig,
                        perturb: Perturbation | None) -> tuple[ModelConfig, int]:
    """The MoE ``ModelConfig`` and the granularity G, or a one-line refusal."""
    if dense_cfg.moe is not None:
        raise ConfigError(
            "dense_to_moe needs a dense parent, but its config has model.moe set; use "
            "expand_experts to grow an MoE"
        )
    if not isinstance(moe_cfg, MoEConfig):
        raise ConfigError("dense_to_moe: moe_config must be a MoEConfig")
    cfg = dataclasses.replace(dense_cfg, moe=moe_cfg)  # validates G | d_ff, interleave
    N = moe_cfg.num_experts
    G = granularity_of(moe_cfg, dense_cfg.ffn_dim)
    if N % G:
        raise ConfigError(
            f"moe.num_experts={N} is not a multiple of the granularity G={G}: dense → MoE "
            "replicates all G shards of d_ff; choose num_experts as a multiple of G"
        )
    if perturb is not None and perturb.interpolate != 1:
        raise ConfigError(
            f"perturb.interpolate={perturb.interpolate}: dense → MoE copies have no distinct "
            "neighbours to interpolate with; set interpolate=1 (it is an expand_experts option)"
        )
    return cfg, G


@dataclasses.dataclass(frozen=True)
class _Upcycling:
    """What every MoE layer of one ``dense_to_moe_state`` call shares."""

    moe: MoEConfig
    D: int
    F: int
    G: int
    std: float
    weight_scaling: bool
    virtual_groups: bool
    perturb: Perturbation | None


def _moe_layer_state(i: int, state: State, up: _Upcycling, gen: torch.Generator) -> State:
    """Layer ``i``'s MoE tensors from its dense SwiGLU (see :func:`dense_to_moe_state`)."""
    moe, D, F, G = up.moe, up.D, up.F, up.G
    N, S, f = moe.num_experts, moe.num_shared_experts, F // G
    c_G = _shard_copies(S, G)
    t = routed_output_scale(moe, G) if up.weight_scaling else 1.0
    what = f"dense_to_moe (layer {i})"
    wg_DF, wu_DF, wd_FD = (take(state, mlp_key(i, n), what) for n in ("w_gate", "w_up",
                                                                       "w_down"))
    if wg_DF.shape != (D, F) or wd_FD.shape != (F, D):
        raise ConfigError(
            f"{what}: {mlp_key(i, 'w_gate')} has shape {tuple(wg_DF.shape)}, expected "
            f"{(D, F)} from model.d_model and model.d_ff; pass the parent's own config"
        )
    dtype = wg_DF.dtype
    # 004 §2.3: shard hidden units [g·f, (g+1)·f) — columns of gate/up, rows of down.
    gate_GDf = wg_DF.reshape(D, G, f).permute(1, 0, 2)
    up_GDf = wu_DF.reshape(D, G, f).permute(1, 0, 2)
    down_GfD = wd_FD.reshape(G, f, D)
    copies = N // G
    # Per-expert output factor: router compensation t times the routed share of its shard.
    t_G = torch.tensor([t / (c + 1) if up.weight_scaling else 1.0 for c in c_G],
                       dtype=torch.float64)
    sq_N = t_G.sqrt().repeat(copies).to(dtype).view(N, 1, 1)
    w = ExpertWeights(
        gate=gate_GDf.repeat(copies, 1, 1),
        up=up_GDf.repeat(copies, 1, 1) * sq_N,
        down=down_GfD.repeat(copies, 1, 1) * sq_N,
    )
    router_ND = router_init(N, G, D, up.std, gen, virtual_groups=up.virtual_groups)
    if up.perturb is not None and not up.perturb.is_identity:
        w = apply_perturbation(w, up.perturb, generator=gen)
    out = {mlp_key(i, "w_gate"): w.gate.contiguous(), mlp_key(i, "w_up"): w.up.contiguous(),
           mlp_key(i, "w_down"): w.down.contiguous(),
           mlp_key(i, "router.weight"): router_ND.to(dtype),
           mlp_key(i, "expert_bias"): torch.zeros(N, dtype=dtype)}
    if S > 0:
        # 004 §3.9 shared experts: hidden slice s holds shard s mod G, given 1/(c_i+1) of it.
        sl = [s % G for s in range(S)]
        a = [1.0 / (c_G[i_] + 1) if up.weight_scaling else 1.0 for i_ in sl]
        out[mlp_key(i, "shared.w_gate")] = torch.cat([gate_GDf[g] for g in sl], 1)
        out[mlp_key(i, "shared.w_up")] = torch.cat(
            [up_GDf[g] * math.sqrt(ai) for g, ai in zip(sl, a)], 1)
        out[mlp_key(i, "shared.w_down")] = torch.cat(
            [down_GfD[g] * math.sqrt(ai) for g, ai in zip(sl, a)], 0)
    return out


def dense_to_moe_state(
    dense_state: Mapping[str, Any],
    dense_cfg: ModelConfig,
    moe_cfg: MoEConfig,
    *,
    virtual_groups: bool = True,
    weight_scaling: bool = True,
    seed: int = 0,
    perturb: Perturbation | None = None,
) -> tuple[State, ModelConfig]:
    """Dense state dict → MoE state dict (torch tensors) and the MoE ``ModelConfig``.

    ``dense_state`` values may be torch tensors or numpy arrays (a parent from Ray's object
    store); it is never modified. Attention, norms and embeddings are copied; in every MoE layer
    (``moe_cfg.is_moe_layer(i)``; the others stay dense) the dense SwiGLU is sharded into G
    slices of width F/G (gate/up columns and down rows of the same hidden units, 004 §2.3),
    replicated to fill ``moe_cfg.num_experts`` experts, optionally scaled (``weight_scaling``,
    see the module docstring) and perturbed (``perturb``: 000 App. A.6's noise and partial
    re-initialisation, applied to every routed expert with independent draws). The router is
    N(0, std²) with std = ``router.init_std`` or √(2/(5·d_model)), one row per virtual group
    when ``virtual_groups``. Random draws come from ``torch.Generator().manual_seed(seed)``,
    layer by layer (router, then perturbation).
    """
    cfg, G = _check_dense_to_moe(dense_cfg, moe_cfg, perturb)
    D = dense_cfg.d_model
    state, borrowed = to_torch_state(dense_state)
    gen = generator(seed)
    up = _Upcycling(moe_cfg, D, dense_cfg.ffn_dim, G,
                    moe_cfg.router.init_std or math.sqrt(2 / (5 * D)), weight_scaling,
                    virtual_groups, perturb)
    moe_keys = {mlp_key(i, n) for i in range(cfg.n_layer) if moe_cfg.is_moe_layer(i)
                for n in ("w_gate", "w_up", "w_down")}
    out: State = {k: (v.clone() if k in borrowed else v) for k, v in state.items()
                  if k not in moe_keys}
    for i in range(cfg.n_layer):
        if moe_cfg.is_moe_layer(i):
            out.update(_moe_layer_state(i, state, up, gen))
    return out, cfg


def dense_to_moe(
    dense_model: torch.nn.Module,
    moe_config: MoEConfig,
    *,
    virtual_groups: bool = True,
    weight_scaling: bool = True,
    seed: int = 0,
    perturb: Perturbation | None = None,
    moe_layer_cls: type | None = None,
) -> Any:
    """Dense ``Transformer`` → a new MoE ``Transformer`` (the input is not modified).

    Arguments as :func:`dense_to_moe_state`; ``moe_layer_cls`` substitutes a subclass of
    ``MoELayer`` (e.g. DeepSpeed's expert-parallel marker). The result is on the input's device
    and dtype. Function preserving at init (max |Δlogits| ≈ 1e-7 relative in fp32) with
    ``weight_scaling=True`` when: ``topk_softmax`` (or renormalized ``softmax_topk``) and either
    G = 1 or ``virtual_groups=True`` with K a multiple of G; ``softmax_topk`` additionally needs
    uniform router probabilities (004's assumption), which a random router only approximates.
    """
    state, cfg = dense_to_moe_state(
        dense_model.state_dict(), dense_model.config, moe_config,
        virtual_groups=virtual_groups, weight_scaling=weight_scaling, seed=seed,
        perturb=perturb,
    )
    return rebuild(dense_model, cfg, state, moe_layer_cls)

"""MoE → MoE expert upcycling (003 Def. 3.1, §4.2, §5.3.2): parameter bookkeeping, replica
router rows and bias noise, utility allocation, the function after expansion, the loss gap on a
briefly trained debug model, purity and validation."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from moe_core import build_model, count_params
from moe_core.config import ModelConfig, MoEConfig, RouterConfig
from moe_core.errors import ConfigError
from moe_core.presets import model_config
from moe_core.upcycle import (
    ExpertStats,
    Perturbation,
    allocate_replicas,
    expand_experts,
    expand_experts_state,
    expert_scores,
    utility_scores,
)

V = 48


def moe_model(seed=0, E=4, K=2, order="softmax_topk", **moe_kw) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers = moe_kw.pop("n_layer", 2)
    moe = MoEConfig(num_experts=E, top_k=K, router=RouterConfig(order=order), **moe_kw)
    cfg = ModelConfig(vocab_size=V, n_layer=layers, d_model=32, n_head=2, d_ff=64, init_std=0.1,
                      max_seq_len=32, moe=moe)
    m = build_model(cfg)
    with torch.no_grad():  # a non-trivial selection bias, as after loss-free balancing
        for layer in m.moe_layers():
            layer.expert_bias.copy_(torch.linspace(-0.01, 0.01, E))
    return m


def calib(seed=0, B=8, S=17) -> torch.Tensor:
    return torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(seed))


def state_copy(m):
    return {k: v.clone() for k, v in m.state_dict().items()}


@pytest.mark.parametrize("variant", [
    {}, {"order": "topk_softmax"}, {"num_shared_experts": 1}, {"interleave": 2, "n_layer": 4},
    {"granularity": 4, "E": 8, "K": 4},
])
def test_bookkeeping_after_doubling(variant):
    src = moe_model(**dict(variant))
    E, D = src.config.moe.num_experts, src.config.d_model
    delta = 1e-3
    new, emap = expand_experts(src, 2, router_noise=delta, seed=3, return_map=True)
    cfg0, cfg1 = src.config, new.config
    assert cfg1.moe.num_experts == 2 * E and cfg1.moe.top_k == cfg0.moe.top_k
    assert cfg1 == dataclasses.replace(cfg0, moe=dataclasses.replace(cfg0.moe, num_experts=2 * E))
    n0, n1 = count_params(cfg0), count_params(cfg1)
    L = n0.num_moe_layers
    f = cfg0.moe.resolved_expert_d_ff(cfg0.ffn_dim)
    # Active parameters: top-K experts unchanged; count_params counts every router row as
    # active, and the router gains E rows of D per MoE layer.
    assert n1.non_embedding_active - n0.non_embedding_active == L * E * D
    assert n1.non_embedding_total - n0.non_embedding_total == L * E * (3 * D * f + D)
    assert n1.total == sum(p.numel() for p in new.parameters())
    for i, a, b in ((i, src.blocks[i].mlp, new.blocks[i].mlp)
                    for i in range(cfg0.n_layer) if src.blocks[i].is_moe):
        assert emap.counts(i) == [2] * E
        for j, s in enumerate(emap.sources[i]):  # every new expert is one source exactly
            for n in ("w_gate", "w_up", "w_down"):
                assert torch.equal(getattr(b, n)[j], getattr(a, n)[s])
            assert torch.equal(b.router.weight[j], a.router.weight[s])
        assert torch.equal(b.expert_bias[:E], a.expert_bias)  # sources' bias unchanged
        noise = b.expert_bias[E:] - a.expert_bias[list(emap.sources[i][E:])]
        assert noise.abs().max() <= delta and noise.abs().min() > 0
        assert noise.unique().numel() == E  # independent draws
        if a.shared is not None:
            assert torch.equal(a.shared.w_up, b.shared.w_up)
    ks, kn = src.state_dict(), new.state_dict()
    for k in ks:
        if ".mlp." not in k:
            assert torch.equal(ks[k], kn[k])


def test_no_noise_means_replica_bias_equals_source():
    src = moe_model()
    new = expand_experts(src, 3)
    a, b = src.moe_layers()[0], new.moe_layers()[0]
    assert torch.equal(b.expert_bias, a.expert_bias.repeat(3)[[0, 1, 2, 3, 0, 0, 1, 1, 2, 2, 3, 3]])


@pytest.mark.parametrize("order", ["topk_softmax", "softmax_topk"])
@pytest.mark.parametrize("K", [1, 2])
def test_function_after_uniform_doubling(order, K):
    """With top-K unchanged, top-K over m identical copies per source picks ⌈K/m⌉ sources with
    all their copies: doubling with K = 2 computes exactly the source model at top-1 (the second
    expert's contribution is lost); with K = 1, topk_softmax is exact and softmax_topk halves
    the routed output (each copy carries p/2). This is the whole post-expansion gap.

    The selection bias is kept for topk_softmax (it adds to logits, which duplication leaves
    unchanged) and zeroed for softmax_topk: there it adds to probabilities, which expansion
    divides by m while the copied bias stays as it was, so selections can differ."""
    src = moe_model(E=4, K=K, order=order).eval()
    if order == "softmax_topk":
        for layer in src.moe_layers():
            layer.expert_bias.zero_()
    new = expand_experts(src, 2).eval()
    if K == 2:
        ref_cfg = dataclasses.replace(src.config,
                                      moe=dataclasses.replace(src.config.moe, top_k=1))
        ref = build_model(ref_cfg)
        ref.load_state_dict(src.state_dict())
    elif order == "topk_softmax":
        ref = src
    else:
        ref = build_model(src.config)
        sd = src.state_dict()
        ref.load_state_dict({k: v / 2 if k.endswith("mlp.w_down") else v
                             for k, v in sd.items()})
    x = calib(1)
    with torch.no_grad():
        a, b = new(x).logits, ref.eval()(x).logits
    assert (a - b).abs().max() <= 1e-5 * b.abs().max()


# ---- utility-based allocation (003 §4.2, §5.3.2) --------------------------------------------


def test_allocation_properties_on_random_scores():
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        E = int(torch.randint(1, 12, (1,), generator=g))
        factor = int(torch.randint(2, 5, (1,), generator=g))
        s = torch.rand(E, generator=g) ** 3 * (10 ** float(torch.randint(-3, 3, (1,), generator=g)))
        if trial % 7 == 0:
            s[: E // 2] = s[0]  # ties
        r = allocate_replicas(s, factor * E)
        assert sum(r) == factor * E and min(r) >= 1
        for a in range(E):
            for b in range(E):
                if s[a] > s[b]:
                    assert r[a] >= r[b]  # a higher score never gets fewer copies
    assert allocate_replicas([1.0, 1.0, 1.0], 6) == [2, 2, 2]  # equal scores: uniform
    assert allocate_replicas([0.0, 0.0], 5) == [3, 2]
    assert allocate_replicas([3.0, 1.0], 8) == [6, 2]  # 3/6 ≥ 1/2: proportional-ish


def test_utility_scores_pure_functions():
    st = ExpertStats(w_sq=torch.tensor([4.0, 1.0, 9.0], dtype=torch.float64),
                     g_sq=torch.tensor([1.0, 4.0, 0.0], dtype=torch.float64),
                     fisher=torch.tensor([0.5, 8.0, 0.0], dtype=torch.float64))
    assert utility_scores("grad_norm", st).tolist() == [1.0, 4.0, 0.0]
    assert utility_scores("saliency", st).tolist() == [2.0, 2.0, 0.0]
    assert utility_scores("weight_norm", st).tolist() == [4.0, 1.0, 9.0]
    assert utility_scores("curvature", st).tolist() == [2.0, 0.5, 0.0]


def planted(kind: str) -> torch.nn.Module:
    """Expert 2 dominates: the others get tiny up/down projections (so tiny gradients), or for
    weight_norm expert 2's weights are made large."""
    m = moe_model(seed=1, E=4, K=2)
    with torch.no_grad():
        for layer in m.moe_layers():
            if kind == "weight_norm":
                for n in ("w_gate", "w_up", "w_down"):
                    getattr(layer, n)[2] *= 3.0
            else:
                for e in (0, 1, 3):
                    layer.w_up[e] *= 1e-2
                    layer.w_down[e] *= 1e-2
    return m


@pytest.mark.parametrize("strategy", ["grad_norm", "saliency", "weight_norm"])
def test_planted_dominant_expert_gets_the_extra_copies(strategy):
    m = planted(strategy)
    new, emap = expand_experts(m, 2, strategy=strategy, batch=calib(), return_map=True)
    for i in emap.sources:
        r = emap.counts(i)
        assert r[2] == max(r) and r[2] >= 4 and sum(r) == 8 and min(r) >= 1, r
        for j, s in enumerate(emap.sources[i]):
            assert torch.equal(new.blocks[i].mlp.w_up[j], m.blocks[i].mlp.w_up[s])


@pytest.mark.parametrize("strategy", ["grad_norm", "saliency", "curvature"])
def test_utility_scores_leave_the_model_untouched(strategy):
    m = moe_model(seed=2)
    m.train()
    m.record_router_stats(True)
    m(calib(5))  # router statistics present before
    last = [layer.last_stats for layer in m.moe_layers()]
    before = state_copy(m)
    accum = [layer.load_accum.clone() for layer in m.moe_layers()]
    scores = expert_scores(m, strategy, calib())
    assert set(scores) == {0, 1} and all(s.shape == (4,) and (s >= 0).all()
                                         for s in scores.values())
    assert all(p.grad is None for p in m.parameters())
    assert m.training and all(p.requires_grad for p in m.parameters())
    assert all(torch.equal(v, before[k]) for k, v in m.state_dict().items())
    assert all(torch.equal(layer.load_accum, a) for layer, a in zip(m.moe_layers(), accum))
    assert [layer.last_stats for layer in m.moe_layers()] == last
    expanded = expand_experts(m, 2, strategy=strategy, batch=calib())
    assert expanded.config.moe.num_experts == 8


def test_state_variant_numpy_matches_model_variant_for_a_utility_strategy():
    m = moe_model(seed=3)
    arrays = {k: v.numpy().copy() for k, v in m.state_dict().items()}
    for a in arrays.values():
        a.flags.writeable = False
    st, cfg, emap = expand_experts_state(arrays, m.config, 2, strategy="grad_norm",
                                         batch=calib(), router_noise=1e-3, seed=4)
    new, emap2 = expand_experts(m, 2, strategy="grad_norm", batch=calib(), router_noise=1e-3,
                                seed=4, return_map=True)
    assert emap == emap2 and cfg == new.config
    ref = new.state_dict()
    assert all(isinstance(v, torch.Tensor) for v in st.values())
    for k in ref:
        assert torch.allclose(st[k], ref[k], rtol=0, atol=0), k


def test_perturbations_apply_to_replicas_only():
    src = moe_model()
    p = Perturbation(noise=0.02, interpolate=0.8)
    a, emap = expand_experts(src, 2, perturb=p, seed=1, return_map=True)
    b = expand_experts(src, 2, perturb=p, seed=1)
    la, l0 = a.moe_layers()[0], src.moe_layers()[0]
    assert torch.equal(la.w_gate, b.moe_layers()[0].w_gate)
    assert torch.equal(la.w_gate[:4], l0.w_gate)  # sources exact
    for j in range(4, 8):
        s = emap.sources[0][j]
        assert not torch.equal(la.w_gate[j], l0.w_gate[s])
        # α = 0.8 towards the source, small noise: closer to its source than to the neighbour
        d_src = (la.w_gate[j] - l0.w_gate[s]).norm()
        d_nb = (la.w_gate[j] - l0.w_gate[(s + 1) % 4]).norm()
        assert d_src < d_nb
        assert torch.equal(la.router.weight[j], l0.router.weight[s])


def test_source_model_untouched():
    src = moe_model()
    before = state_copy(src)
    new = expand_experts(src, 2, router_noise=0.1, perturb=Perturbation(noise=0.1))
    with torch.no_grad():
        for p in new.parameters():
            p.add_(1.0)
    assert all(torch.equal(v, before[k]) for k, v in src.state_dict().items())


# ---- loss after expansion on a briefly trained debug model (003 §3.2) ------------------------

NXT = torch.stack([torch.randperm(64, generator=torch.Generator().manual_seed(7 + c))
                   for c in range(2)], 1)  # every token has two successors: entropy floor ln 2


def markov(gen: torch.Generator, B: int, S: int) -> torch.Tensor:
    x = torch.zeros(B, S, dtype=torch.long)
    x[:, 0] = torch.randint(0, 64, (B,), generator=gen)
    pick = torch.randint(0, 2, (B, S), generator=gen)
    for s in range(1, S):
        x[:, s] = NXT[x[:, s - 1], pick[:, s]]
    return x


def trained_debug(order: str, K: int, steps: int = 40) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = model_config("debug", vocab_size=64, max_seq_len=64,
                       moe=MoEConfig(num_experts=4, top_k=K, router=RouterConfig(order=order)))
    m = build_model(cfg)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        b = markov(gen, 8, 33)
        out = m(b[:, :-1], b[:, 1:])
        (out.loss + out.aux_loss).backward()
        opt.step()
        opt.zero_grad()
    return m.eval()


@pytest.mark.slow
@pytest.mark.parametrize("order", ["topk_softmax", "softmax_topk"])
@pytest.mark.parametrize("K", [1, 2])
def test_loss_gap_after_uniform_expansion(order, K, record_property):
    """003 Def. 3.1 reports a post-expansion gap < 1e-2. Measured here (40 steps, loss ≈ 1.1 vs
    ln 64 = 4.16 at init): the gap is exactly the loss of the source at the reduced top-K (see
    test_function_after_uniform_doubling); it is below 1e-2 where that reduction is harmless
    (topk_softmax, K = 1: exact) and not in general (K = 2 on this 4-expert model: a few 1e-2)."""
    m = trained_debug(order, K)
    ev = markov(torch.Generator().manual_seed(123), 32, 33)
    with torch.no_grad():
        L0 = float(m(ev[:, :-1], ev[:, 1:]).loss)
        L1 = float(expand_experts(m, 2, router_noise=1e-3, seed=0)(ev[:, :-1], ev[:, 1:]).loss)
        if K == 2:
            top1 = dataclasses.replace(m.config, moe=dataclasses.replace(m.config.moe, top_k=1))
            ref = build_model(top1).eval()
            ref.load_state_dict(m.state_dict())
            L_ref = float(ref(ev[:, :-1], ev[:, 1:]).loss)
    record_property("loss_gap", L1 - L0)
    print(f"\n{order} K={K}: source loss {L0:.4f}, expanded {L1:.4f}, gap {L1 - L0:+.5f}")
    assert L0 < 0.5 * math.log(64)  # the model did learn something
    if order == "topk_softmax" and K == 1:
        assert abs(L1 - L0) < 1e-2
    elif K == 2:
        # δ = 1e-3 only breaks ties between copies (and, rarely, near-tied sources)
        assert abs(L1 - L_ref) < 2e-3


# ---- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize("kw,match", [
    ({"factor": 1}, "upcycle.factor=1"),
    ({"factor": 2.5}, "upcycle.factor=2.5"),
    ({"factor": 2, "strategy": "random"}, "upcycle.strategy='random'"),
    ({"factor": 2, "strategy": "grad_norm"}, "needs batch="),
    ({"factor": 2, "strategy": "curvature"}, "needs batch="),
    ({"factor": 2, "router_noise": -1e-3}, "upcycle.router_noise"),
    ({"factor": 2, "router_noise": math.inf}, "upcycle.router_noise"),
])
def test_validation(kw, match):
    with pytest.raises(ConfigError, match=match):
        expand_experts(moe_model(), **kw)


def test_validation_state_level():
    m = moe_model()
    sd = m.state_dict()
    with pytest.raises(ConfigError, match="strategy='uniform' ignores them"):
        expand_experts_state(sd, m.config, 2, scores={0: np.ones(4), 1: np.ones(4)})
    with pytest.raises(ConfigError, match="holds 2 experts but moe.num_experts=4"):
        expand_experts_state({k: (v[:2] if "mlp.w_" in k else v) for k, v in sd.items()},
                             m.config, 2)
    dense = build_model(dataclasses.replace(m.config, moe=None))
    with pytest.raises(ConfigError, match="needs an MoE parent"):
        expand_experts(dense, 2)
    with pytest.raises(ConfigError, match="finite and >= 0"):
        allocate_replicas([1.0, math.nan], 4)

"""Dense → MoE upcycling (000 §2.1, App. A.6; 004 §2.3, App. A): function preservation at init
in fp32, the negative cases, router init, shared experts, interleaving, purity, state variant."""

import math

import numpy as np
import pytest
import torch

from moe_core import build_model
from moe_core.config import ModelConfig, MoEConfig, RouterConfig
from moe_core.errors import ConfigError
from moe_core.upcycle import Perturbation, dense_to_moe, dense_to_moe_state, routed_output_scale

TOL = 1e-5  # max |Δlogits| ≤ TOL · max |logits|
# (d_model, n_head, n_layer, d_ff): d_ff divisible by 8 for the G = 8 cases
SHAPES = [(32, 2, 2, 64), (48, 4, 3, 96), (32, 4, 2, 128)]


def dense_model(seed: int, shape=SHAPES[0], **kw) -> torch.nn.Module:
    d, h, L, f = shape
    torch.manual_seed(seed)
    # init_std 0.1 makes every MLP matter in the logits (the default 0.02 would hide errors)
    cfg = ModelConfig(vocab_size=40, n_layer=L, d_model=d, n_head=h, d_ff=f, init_std=0.1,
                      max_seq_len=32, **kw)
    return build_model(cfg).eval()


def tokens(seed: int) -> torch.Tensor:
    return torch.randint(0, 40, (3, 16), generator=torch.Generator().manual_seed(seed + 100))


def rel_err(moe: torch.nn.Module, dense: torch.nn.Module, seed: int) -> float:
    x = tokens(seed)
    with torch.no_grad():
        ref, out = dense(x).logits, moe.eval()(x).logits
    return float((out - ref).abs().max() / ref.abs().max())


def moe_cfg(E, G, K, order="topk_softmax", **kw) -> MoEConfig:
    return MoEConfig(num_experts=E, granularity=G, top_k=K,
                     router=RouterConfig(order=order, **kw.pop("router", {})), **kw)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("E,K", [(2, 1), (2, 2), (4, 1), (4, 2), (8, 1), (8, 2)])
def test_coarse_topk_softmax_preserves_function(E, K, seed):
    dense = dense_model(seed, SHAPES[seed])
    moe = dense_to_moe(dense, moe_cfg(E, 1, K), seed=seed)
    assert rel_err(moe, dense, seed) <= TOL


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("E,G,K", [(8, 2, 2), (16, 4, 4), (64, 8, 8), (8, 2, 4)])
def test_granular_virtual_groups_topk_softmax_preserves_function(E, G, K, seed):
    """K = m·G selects m whole groups: each group sums to dense/G whatever its weight (t = G)."""
    dense = dense_model(seed, SHAPES[seed])
    moe = dense_to_moe(dense, moe_cfg(E, G, K), virtual_groups=True, seed=seed)
    assert rel_err(moe, dense, seed) <= TOL


def _uniform_router_select_group_0(moe: torch.nn.Module, G: int) -> None:
    """Equal router rows (equal logits within and across groups → probabilities 1/N, 004's
    assumption); a selection-only bias that is constant within a group breaks the ties between
    groups, so top-K takes whole groups without touching the weights."""
    with torch.no_grad():
        for layer in moe.moe_layers():
            row = layer.router.weight[0].clone()
            layer.router.weight.copy_(row.expand_as(layer.router.weight))
            N = layer.num_experts
            layer.expert_bias.copy_(-1e-3 * (torch.arange(N) // G).float())


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("E,G,K", [(4, 1, 2), (8, 1, 1), (8, 2, 2), (16, 4, 4), (8, 2, 4)])
def test_softmax_topk_weight_scaling_exact_under_uniform_probabilities(E, G, K, seed):
    dense = dense_model(seed, SHAPES[seed])
    cfg = moe_cfg(E, G, K, order="softmax_topk")
    assert routed_output_scale(cfg, G) == E * G / K  # 004 Eq. 2's E·G²/T (its E = N/G)
    moe = dense_to_moe(dense, cfg, seed=seed)
    _uniform_router_select_group_0(moe, G)
    assert rel_err(moe, dense, seed) <= TOL
    unscaled = dense_to_moe(dense, cfg, seed=seed, weight_scaling=False)
    _uniform_router_select_group_0(unscaled, G)
    assert rel_err(unscaled, dense, seed) > 1e-2  # the scaling is what makes it exact


@pytest.mark.parametrize("E,G,K", [(8, 2, 2), (16, 4, 4)])
def test_renormalized_softmax_topk_preserves_function_with_random_router(E, G, K):
    dense = dense_model(0)
    moe = dense_to_moe(dense, moe_cfg(E, G, K, order="softmax_topk",
                                      router={"renormalize": True}))
    assert rel_err(moe, dense, 0) <= TOL


@pytest.mark.parametrize("seed", [0, 1])
def test_granular_without_virtual_groups_is_not_preserving(seed):
    """Independent router rows let top-K pick two copies of one shard (004 App. A)."""
    dense = dense_model(seed)
    moe = dense_to_moe(dense, moe_cfg(8, 2, 2), virtual_groups=False, seed=seed)
    assert rel_err(moe, dense, seed) > 1e-2


def test_granular_without_weight_scaling_is_not_preserving():
    dense = dense_model(0)
    moe = dense_to_moe(dense, moe_cfg(8, 2, 2), weight_scaling=False)
    assert rel_err(moe, dense, 0) > 1e-2


@pytest.mark.parametrize("E,G,K,S", [(4, 1, 1, 1), (4, 1, 2, 2), (8, 2, 2, 2), (8, 2, 2, 1),
                                     (16, 4, 4, 2)])
def test_shared_experts_preserve_function(E, G, K, S):
    dense = dense_model(1)
    moe = dense_to_moe(dense, moe_cfg(E, G, K, num_shared_experts=S), seed=1)
    assert all(layer.shared is not None for layer in moe.moe_layers())
    assert rel_err(moe, dense, 1) <= TOL


def test_interleaved_layers_stay_dense_and_preserve_function():
    dense = dense_model(0, (32, 2, 4, 64))
    moe = dense_to_moe(dense, moe_cfg(8, 2, 2, interleave=2))
    assert [b.is_moe for b in moe.blocks] == [False, True, False, True]
    for i in (0, 2):
        for n in ("w_gate", "w_up", "w_down"):
            assert torch.equal(getattr(moe.blocks[i].mlp, n), getattr(dense.blocks[i].mlp, n))
    assert rel_err(moe, dense, 0) <= TOL


def test_copies_everything_but_the_mlps():
    dense = dense_model(0)
    moe = dense_to_moe(dense, moe_cfg(4, 1, 2))
    ds, ms = dense.state_dict(), moe.state_dict()
    for k, v in ds.items():
        if ".mlp." not in k:
            assert torch.equal(ms[k], v), k
    layer = moe.blocks[0].mlp
    for e in range(4):  # coarse: every expert is the dense MLP
        assert torch.equal(layer.w_gate[e], dense.blocks[0].mlp.w_gate)
        assert torch.equal(layer.w_down[e], dense.blocks[0].mlp.w_down)


def test_router_init_std_and_virtual_groups():
    dense = dense_model(0, (64, 4, 1, 256))
    moe = dense_to_moe(dense, moe_cfg(64, 1, 2), seed=3)
    w = moe.blocks[0].mlp.router.weight  # 64 × 64 draws
    assert w.mean().abs() < 0.01
    assert w.std().item() == pytest.approx(math.sqrt(2 / (5 * 64)), rel=0.05)  # 000 App. A.6
    moe = dense_to_moe(dense, moe_cfg(16, 4, 4), seed=3)
    w = moe.blocks[0].mlp.router.weight.view(4, 4, 64)  # [group, member, D]
    assert torch.equal(w, w[:, :1].expand_as(w))  # identical rows within a group
    assert not torch.equal(w[0, 0], w[1, 0])
    assert [int(i) for i in moe.blocks[0].mlp.w_gate.new_tensor(range(16)) % 4] == \
        [e % 4 for e in range(16)]


def test_deterministic_under_seed():
    dense = dense_model(0)
    a, b = (dense_to_moe_state(dense.state_dict(), dense.config, moe_cfg(8, 2, 2), seed=5)[0]
            for _ in range(2))
    c = dense_to_moe_state(dense.state_dict(), dense.config, moe_cfg(8, 2, 2), seed=6)[0]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["blocks.0.mlp.router.weight"], c["blocks.0.mlp.router.weight"])


def test_source_untouched_and_result_not_aliased():
    dense = dense_model(0)
    before = {k: v.clone() for k, v in dense.state_dict().items()}
    state, _ = dense_to_moe_state(dense.state_dict(), dense.config, moe_cfg(4, 1, 1))
    for v in state.values():
        v.add_(1.0)
    moe = dense_to_moe(dense, moe_cfg(8, 2, 2))
    with torch.no_grad():
        for p in moe.parameters():
            p.add_(1.0)
    assert all(torch.equal(v, before[k]) for k, v in dense.state_dict().items())


def test_state_variant_accepts_read_only_numpy():
    dense = dense_model(0)
    arrays = {k: v.numpy().copy() for k, v in dense.state_dict().items()}
    for a in arrays.values():
        a.flags.writeable = False  # as an array from Ray's object store
    cfg = moe_cfg(8, 2, 2, num_shared_experts=1)
    state, new_cfg = dense_to_moe_state(arrays, dense.config, cfg, seed=2)
    assert new_cfg.moe == cfg and all(isinstance(v, torch.Tensor) for v in state.values())
    ref = dense_to_moe(dense, cfg, seed=2).state_dict()
    assert state.keys() == ref.keys() and all(torch.equal(state[k], ref[k]) for k in ref)


def test_perturbations_000_a6_break_copies_deterministically():
    dense = dense_model(0)
    for p in (Perturbation(noise=0.01), Perturbation(drop_fraction=0.5)):
        a = dense_to_moe(dense, moe_cfg(4, 1, 2), perturb=p, seed=1).blocks[0].mlp
        b = dense_to_moe(dense, moe_cfg(4, 1, 2), perturb=p, seed=1).blocks[0].mlp
        assert torch.equal(a.w_up, b.w_up)
        assert not torch.equal(a.w_up[0], a.w_up[1])  # independent draws per expert
        assert not torch.equal(a.w_up[0], dense.blocks[0].mlp.w_up)


def test_result_keeps_dtype():
    dense = dense_model(0).to(torch.float64)
    moe = dense_to_moe(dense, moe_cfg(8, 2, 2))
    assert next(moe.parameters()).dtype == torch.float64
    assert rel_err(moe, dense, 0) <= TOL  # RMSNorm computes in fp32 whatever the dtype


@pytest.mark.parametrize("make,match", [
    (lambda d: dense_to_moe(dense_model(0, moe=moe_cfg(4, 1, 1)), moe_cfg(8, 1, 1)),
     "needs a dense parent"),
    (lambda d: dense_to_moe(d, moe_cfg(6, 4, 4)), "num_experts=6 is not a multiple"),
    (lambda d: dense_to_moe(d, MoEConfig(num_experts=4, top_k=1, expert_d_ff=48)),
     "expert_d_ff=48 does not divide"),
    (lambda d: dense_to_moe(d, moe_cfg(4, 1, 1), perturb=Perturbation(interpolate=0.5)),
     "perturb.interpolate"),
    (lambda d: dense_to_moe_state({k: v for k, v in d.state_dict().items()
                                   if "blocks.1.mlp.w_up" not in k}, d.config, moe_cfg(4, 1, 1)),
     "blocks.1.mlp.w_up"),
    (lambda d: dense_to_moe_state({"x": [1, 2]}, d.config, moe_cfg(4, 1, 1)), "torch tensors"),
])
def test_validation(make, match):
    with pytest.raises(ConfigError, match=match):
        make(dense_model(0))


def test_numpy_generic_values_are_accepted():
    dense = dense_model(0)
    arrays = {k: np.asarray(v.numpy()) for k, v in dense.state_dict().items()}
    state, _ = dense_to_moe_state(arrays, dense.config, moe_cfg(2, 1, 1))
    assert state["blocks.0.mlp.w_gate"].shape == (2, 32, 64)

"""MoE layer equivalences: identical experts == dense MLP; capacity drops; statistics."""

import pytest
import torch

from moe_core import build_model
from moe_core.config import MoEConfig, RouterConfig
from moe_core.moe import stats
from moe_core.moe.layer import MoELayer, swiglu_experts_loop
from moe_core.nn import SwiGLU
from moe_core.presets import model_config


@pytest.mark.parametrize("E,K", [(2, 1), (4, 2), (8, 2), (8, 8)])
def test_identical_experts_topk_softmax_equals_dense(E, K):
    torch.manual_seed(0)
    d, f = 16, 32
    dense = SwiGLU(d, f)
    dense.reset_parameters(0.2)
    cfg = MoEConfig(num_experts=E, top_k=K, expert_d_ff=f,
                    router=RouterConfig(order="topk_softmax"))
    moe = MoELayer(d, f, cfg, init_std=0.2)
    with torch.no_grad():
        moe.w_gate.copy_(dense.w_gate.expand(E, d, f))
        moe.w_up.copy_(dense.w_up.expand(E, d, f))
        moe.w_down.copy_(dense.w_down.expand(E, f, d))
    x = torch.randn(3, 10, d)
    y, _ = moe(x)
    ref = dense(x)
    assert (y - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_capacity_drops_and_counts():
    torch.manual_seed(0)
    cfg = MoEConfig(num_experts=4, top_k=1, expert_d_ff=8, capacity_factor=1.0)
    layer = MoELayer(8, 8, cfg, init_std=0.1)
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[0, 0] = 10.0
    x = torch.randn(40, 8)
    x[:, 0] = x[:, 0].abs() + 0.1  # every token prefers expert 0
    layer.record_stats = True
    y, _ = layer(x)
    # capacity = ceil(1.0·40·1/4) = 10: tokens 0..9 kept, 30 dropped (output exactly zero)
    assert layer.last_stats["drop_rate"] == pytest.approx(30 / 40)
    assert torch.count_nonzero(y.abs().sum(-1)) == 10
    assert y[10:].abs().max() == 0
    layer_dropless = MoELayer(8, 8, MoEConfig(num_experts=4, top_k=1, expert_d_ff=8), 0.1)
    layer_dropless.load_state_dict(layer.state_dict())
    y2, _ = layer_dropless(x)
    assert torch.allclose(y2[:10], y[:10], atol=1e-6)
    assert y2[10:].abs().min() > 0


def test_stats_pure_functions():
    assert stats.load_fractions(torch.tensor([1, 3])).tolist() == [0.25, 0.75]
    p = torch.tensor([[0.5, 0.25, 0.125, 0.125]])
    assert stats.max_ratios(p) == pytest.approx((2.0, 2.0))
    assert stats.routing_entropy(torch.full((2, 4), 0.25)) == pytest.approx(1.3862943611)
    v = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    # pairs: (0,1)=0, (0,2)=(1,2)=1/√2 -> mean 2/(3√2)
    assert stats.mean_pairwise_cosine(v) == pytest.approx(2 / (3 * 2**0.5))
    assert stats.cosine_to_reference(v[:2], torch.tensor([1.0, 0.0])) == pytest.approx(0.5)


def test_model_router_stats_and_expert_similarity():
    cfg = model_config("debug", vocab_size=50, moe=MoEConfig(num_experts=4, top_k=2))
    model = build_model(cfg)
    model.record_router_stats(True)
    out = model(torch.randint(0, 50, (2, 12)))
    assert len(out.router_stats) == 2
    s = out.router_stats[0]
    assert sum(s["load"]) == pytest.approx(1.0)
    for key in ("entropy", "max1_max2", "max2_max3", "drop_rate", "overflow_rate_cf1"):
        assert key in s
    layer = model.moe_layers()[0]
    assert stats.mean_pairwise_cosine(layer.expert_vectors()) < 0.2  # random init
    with torch.no_grad():
        layer.w_gate[1] = layer.w_gate[0]
        layer.w_up[1] = layer.w_up[0]
        layer.w_down[1] = layer.w_down[0]
    v = layer.expert_vectors()
    assert stats.mean_pairwise_cosine(v[:2]) == pytest.approx(1.0)


def test_model_forward_shapes_and_loss():
    cfg = model_config("debug", vocab_size=50,
                       moe=MoEConfig(num_experts=4, top_k=2, num_shared_experts=1, interleave=2))
    model = build_model(cfg)
    assert model.config is cfg
    tok = torch.randint(0, 50, (3, 7))
    out = model(tok, tok)
    assert out.logits.shape == (3, 7, 50)
    assert out.aux_loss.ndim == 0 and out.aux_loss.item() > 0
    assert out.loss.item() == pytest.approx(float(torch.log(torch.tensor(50.0))), abs=0.3)
    out.loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_dense_model_has_zero_aux():
    model = build_model(model_config("debug", vocab_size=20))
    out = model(torch.randint(0, 20, (1, 5)))
    assert out.aux_loss.item() == 0.0 and out.router_stats == []


def test_causality():
    torch.manual_seed(0)
    model = build_model(model_config("debug", vocab_size=20, moe=MoEConfig(num_experts=2,
                                                                             top_k=1)))
    a = torch.randint(0, 20, (1, 10))
    b = a.clone()
    b[0, 7:] = (b[0, 7:] + 1) % 20
    la, lb = model(a).logits, model(b).logits
    assert torch.allclose(la[0, :7], lb[0, :7], atol=1e-6)
    assert not torch.allclose(la[0, 7:], lb[0, 7:])


def test_expert_loop_handles_empty_experts():
    x = torch.randn(5, 4)
    w = torch.randn(3, 4, 6)
    out = swiglu_experts_loop(x, [5, 0, 0], w, w, torch.randn(3, 6, 4), torch.ones(5))
    assert out.shape == (5, 4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_grouped_mm_matches_loop_on_gpu():
    from moe_core.moe.layer import swiglu_experts_grouped

    torch.manual_seed(0)
    E, d, f, N = 8, 64, 128, 512
    x = torch.randn(N, d, device="cuda", dtype=torch.bfloat16)
    ws = [torch.randn(E, d, f, device="cuda", dtype=torch.bfloat16) * 0.05 for _ in range(2)]
    wd = torch.randn(E, f, d, device="cuda", dtype=torch.bfloat16) * 0.05
    counts = torch.bincount(torch.randint(0, E, (N,), device="cuda"), minlength=E)
    s = torch.rand(N, device="cuda")
    a = swiglu_experts_grouped(x, counts, ws[0], ws[1], wd, s).float()
    b = swiglu_experts_loop(x, counts.tolist(), ws[0], ws[1], wd, s).float()
    assert torch.allclose(a, b, atol=2e-2, rtol=2e-2)

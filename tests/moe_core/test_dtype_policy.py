"""The mixed-precision policy of the MoE layer: router logits, softmax and top-K in fp32 and the
balancing buffers in their own dtype, whatever dtype the model is cast to (bf16 on CUDA)."""

import copy

import pytest
import torch
import torch.nn.functional as F

from moe_core import build_model
from moe_core.config import MoEConfig, RouterConfig
from moe_core.moe import layer as layer_mod
from moe_core.moe.layer import MoELayer
from moe_core.moe.routing import route
from moe_core.presets import model_config

BUFFERS = {"expert_bias": torch.float32, "aux_coef": torch.float32,
           "load_accum": torch.float64, "drop_accum": torch.float64}


def _layer(E=8, K=2, d=64, order="softmax_topk", loss_free=1e-3, seed=0):
    torch.manual_seed(seed)
    cfg = MoEConfig(num_experts=E, top_k=K, expert_d_ff=32, router=RouterConfig(
        order=order, loss_free_rate=loss_free))
    return MoELayer(d, 128, cfg, init_std=0.02)


@pytest.mark.parametrize("cast", [
    lambda m: m.to(torch.bfloat16), lambda m: m.bfloat16(), lambda m: m.half(),
    lambda m: m.double(), lambda m: m.to("meta"), lambda m: m.to("cpu", torch.bfloat16)])
def test_balancing_buffers_keep_their_dtype_under_any_cast(cast):
    layer = cast(_layer())
    for name, dtype in BUFFERS.items():
        assert getattr(layer, name).dtype == dtype, name
    model = build_model(model_config("debug", vocab_size=32, moe=MoEConfig(
        num_experts=4, top_k=2))).to(torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    for m in model.moe_layers():
        assert {n: getattr(m, n).dtype for n in BUFFERS} == BUFFERS
    # the buffers are still registered, persistent ones in the state dict (aux_coef only as
    # adaptive state: moe_core.moe.named_state)
    assert "expert_bias" in layer.state_dict()
    assert not {"aux_coef", "load_accum"} & set(layer.state_dict())


def test_device_move_still_moves_the_buffers():
    layer = _layer().to("meta")
    assert all(getattr(layer, n).device.type == "meta" for n in BUFFERS)
    assert layer.w_up.device.type == "meta"


@pytest.mark.parametrize("b0", [0.25, 0.5, -0.75, 1.5])
def test_loss_free_update_of_1e3_survives_bf16(b0):
    """In bf16 b = 0.5 + 1e-3 rounds back to 0.5 (spacing 2^-7·0.5): the update is lost. The
    layer's bias stays fp32, so a bf16 model's update equals the fp32 arithmetic exactly."""
    rate = 1e-3
    layer = _layer(E=4, K=1, d=16, loss_free=rate).to(torch.bfloat16)
    with torch.no_grad():
        layer.expert_bias.fill_(b0)
    layer.train()
    x = torch.randn(300, 16, dtype=torch.bfloat16)
    layer(x)
    counts = layer.load_accum.clone()
    assert counts.sum() == 300 and counts.dtype == torch.float64
    assert torch.equal(counts, counts.round())  # exact integer counts
    layer.update_balancing()
    expect = torch.full((4,), b0) + rate * torch.sign(counts.float().mean() - counts.float())
    assert torch.equal(layer.expert_bias, expect)
    moved = layer.expert_bias != b0
    assert moved.any()
    # what bf16 storage would have done: no change at all for |b| >= 0.5
    if abs(b0) >= 0.5:
        assert torch.equal((torch.tensor(b0).bfloat16() + rate).float(), torch.tensor(b0))


def test_load_counts_exact_beyond_bf16_range():
    layer = _layer(E=2, K=1, d=16, loss_free=0.0).to(torch.bfloat16)
    layer.train()
    for _ in range(3):
        layer(torch.randn(1001, 16, dtype=torch.bfloat16))
    assert layer.load_accum.sum().item() == 3003  # bf16 cannot even hold 3003 (→ 3008)
    assert layer.drop_accum[1].item() == 3003


@pytest.mark.parametrize("order", ["softmax_topk", "topk_softmax"])
def test_bf16_routing_equals_fp32_router_on_the_same_weights(order):
    """A bf16 layer routes exactly as an fp32 router with the bf16-rounded weight and input;
    routing on bf16 logits (what nn.Linear in bf16 gives) picks other experts for some tokens."""
    E, K, d, T = 64, 8, 256, 4096
    layer = _layer(E=E, K=K, d=d, order=order, loss_free=1e-3)
    with torch.no_grad():
        layer.expert_bias.uniform_(-1e-3, 1e-3)
    lb = copy.deepcopy(layer).to(torch.bfloat16)
    torch.manual_seed(1)
    x = torch.randn(T, d).bfloat16()
    got = lb.routing(x)
    w32 = lb.router.weight.float()  # the bf16-rounded weight, in fp32
    ref = route(x.float() @ w32.T, top_k=K, cfg=lb.cfg.router, selection_bias_E=lb.expert_bias)
    assert got.logits_TE.dtype == got.topk_weight_TK.dtype == torch.float32
    assert torch.equal(got.topk_idx_TK, ref.topk_idx_TK)
    assert torch.equal(got.topk_weight_TK, ref.topk_weight_TK)
    assert torch.equal(got.probs_TE, ref.probs_TE)
    # the defect this guards against: bf16 logits flip expert choices
    bf16_logits = F.linear(x, lb.router.weight)
    assert bf16_logits.dtype == torch.bfloat16
    flipped = route(bf16_logits, top_k=K, cfg=lb.cfg.router, selection_bias_E=lb.expert_bias)
    assert not torch.equal(flipped.topk_idx_TK.sort(-1).values, ref.topk_idx_TK.sort(-1).values)


def test_forward_routes_on_fp32_logits(monkeypatch):
    seen = []
    orig = layer_mod.route

    def spy(logits, **kw):
        seen.append(logits.dtype)
        return orig(logits, **kw)

    monkeypatch.setattr(layer_mod, "route", spy)
    layer = _layer().to(torch.bfloat16)
    y, aux = layer(torch.randn(2, 5, 64, dtype=torch.bfloat16))
    assert seen == [torch.float32]
    assert y.dtype == torch.bfloat16 and aux.dtype == torch.float32


def test_fp32_router_is_the_linear_layer_bit_for_bit():
    """On an fp32 model the fp32 router is the same op as ``nn.Linear``: CPU numerics are
    unchanged."""
    layer = _layer()
    x = torch.randn(50, 64)
    assert torch.equal(layer.router_logits(x), layer.router(x))


def test_rope_tables_stay_fp32_in_a_bf16_model():
    """A bf16 cast leaves the RoPE cos/sin tables fp32 (bf16 tables rotate every position by a
    slightly wrong angle); a device move still moves them."""
    from moe_core.nn import apply_rope, rope_cache

    cfg = model_config("debug", vocab_size=32)
    model = build_model(cfg).to(torch.bfloat16)
    assert model.rope_cos.dtype == model.rope_sin.dtype == torch.float32
    assert model.to("meta").rope_cos.device.type == "meta"
    # what fp32 tables buy: queries rotated with bf16 tables are further from the fp64 rotation
    cos, sin = rope_cache(1024, 64, 10000.0)
    x = torch.randn(1, 1, 1024, 64, generator=torch.Generator().manual_seed(0))
    ref = apply_rope(x.double(), cos.double(), sin.double())
    err32 = (apply_rope(x, cos, sin).double() - ref).abs().max()
    err16 = (apply_rope(x, cos.bfloat16(), sin.bfloat16()).double() - ref).abs().max()
    assert err16 > 100 * err32

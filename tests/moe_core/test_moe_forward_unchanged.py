"""The one-graph MoE forward (issue #27: bias always passed, searchsorted counts reused by the aux
loss, in-graph counters, static-shape capacity) computes what the forward before it computed,
bit for bit: outputs, aux loss, balancing counters and gradients, on the CPU code path and on
the CUDA code path forced on CPU, with and without a capacity."""

import copy

import pytest
import torch
import torch.nn.functional as F

import moe_core.moe.layer as layer_mod
from moe_core.config import MoEConfig, RouterConfig
from moe_core.moe import balancing
from moe_core.moe.layer import MoELayer
from moe_core.moe.routing import capacity, overflow_count, route


def old_forward(layer: MoELayer, x: torch.Tensor, grouped: bool, atomic_free: bool):
    """``MoELayer.forward`` as it was at 1b6eefd (bias only when ``expert_bias.any()``,
    ``torch.bincount`` counts, boolean-mask capacity, aux loss recounting, counters updated
    outside the graph), written out with the same building blocks."""
    shape, cfg, rcfg = x.shape, layer.cfg, layer.cfg.router
    x_TD = x.reshape(-1, shape[-1])
    T, E, K = x_TD.shape[0], layer.num_experts, cfg.top_k
    bias = layer.expert_bias if rcfg.loss_free_rate > 0 or layer.expert_bias.any() else None
    logits = F.linear(x_TD.float(), layer.router.weight.float())
    r = route(logits, top_k=K, cfg=rcfg, selection_bias_E=bias)
    flat_e = r.topk_idx_TK.reshape(-1)
    slot_N = torch.sort(flat_e, stable=True).indices
    counts_E = torch.bincount(flat_e, minlength=E)
    w_N = r.topk_weight_TK.reshape(-1)[slot_N]
    dropped_N, kept_E = None, counts_E
    if cfg.capacity_factor is not None:
        cap = capacity(T, K, E, cfg.capacity_factor)
        starts = torch.cumsum(counts_E, 0) - counts_E
        pos_N = torch.arange(slot_N.numel()) - starts.repeat_interleave(counts_E)
        keep = pos_N < cap
        dropped_N = ~keep
        slot_N, w_N, kept_E = slot_N[keep], w_N[keep], counts_E.clamp(max=cap)
    dropless = dropped_N is None
    x_ND = (layer_mod.dispatch(x_TD, slot_N, K, dropless=dropless) if atomic_free
            else x_TD[slot_N // K])
    ws = (layer.w_gate, layer.w_up, layer.w_down)
    if grouped:
        y_ND = layer_mod.swiglu_experts_grouped(x_ND, kept_E, *ws, w_N)
    else:
        y_ND = layer_mod.swiglu_experts_loop(x_ND, kept_E.tolist(), *ws, w_N)
    y_ND = y_ND.to(x_TD.dtype)
    if atomic_free:
        out = layer_mod.combine(y_ND, slot_N, T, K, dropless=dropless)
    else:
        out = torch.zeros_like(x_TD).index_add_(0, slot_N // K, y_ND)
    if layer.shared is not None:
        out = out + layer.shared(x_TD)
    loss = r.probs_TE.new_zeros(())
    if rcfg.aux_loss == "switch":
        loss = loss + layer.aux_coef * balancing.switch_aux_loss(r.probs_TE, r.topk_idx_TK)
    elif rcfg.aux_loss == "squared":
        loss = loss + layer.aux_coef * balancing.squared_aux_loss(r.probs_TE)
    if rcfg.z_loss_coef > 0:
        loss = loss + rcfg.z_loss_coef * balancing.z_loss(r.logits_TE)
    with torch.no_grad():
        layer.load_accum += counts_E.to(layer.load_accum.dtype)
        if dropped_N is not None:
            layer.drop_accum[0] += dropped_N.sum().to(layer.drop_accum.dtype)
        elif rcfg.adaptive_aux:
            layer.drop_accum[0] += overflow_count(counts_E, capacity(T, K, E, 1.0))
        layer.drop_accum[1] += T * K
    return out.reshape(shape), loss


ROUTERS = {
    "default": RouterConfig(),
    "loss_free_adaptive": RouterConfig(loss_free_rate=1e-2, adaptive_aux=True),
    "topk_softmax_z": RouterConfig(order="topk_softmax", aux_loss="squared", z_loss_coef=1e-3),
}


def _grads(layer, x, fwd):
    xx = x.clone().requires_grad_()
    y, aux = fwd(layer, xx)
    (y.float().pow(2).mean() + aux).backward()
    return y, aux, xx.grad, {n: p.grad for n, p in layer.named_parameters()}


@pytest.mark.parametrize("path", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("router", list(ROUTERS))
@pytest.mark.parametrize("E,K,cf,shared", [(8, 2, None, 0), (8, 2, 1.0, 1), (16, 4, 0.5, 0)])
def test_forward_is_bit_identical_to_the_old_formula(path, dtype, router, E, K, cf, shared,
                                                     monkeypatch):
    grouped = atomic_free = path == "cuda"
    monkeypatch.setattr(layer_mod, "GROUPED_MM", grouped)
    monkeypatch.setattr(layer_mod, "ATOMIC_FREE", atomic_free)
    torch.manual_seed(E + K)
    cfg = MoEConfig(num_experts=E, top_k=K, capacity_factor=cf, num_shared_experts=shared,
                    router=ROUTERS[router])
    new = MoELayer(32, 64, cfg, init_std=0.05).to(dtype)
    with torch.no_grad():  # a skewed router, so that a capacity really drops
        new.router.weight[0] += 0.3
    old = copy.deepcopy(new)
    x = torch.randn(2, 48, 32, dtype=dtype)
    y1, a1, dx1, g1 = _grads(new, x, lambda m, v: m(v))
    y0, a0, dx0, g0 = _grads(old, x, lambda m, v: old_forward(m, v, grouped, atomic_free))
    assert torch.equal(y1, y0) and torch.equal(a1, a0)
    assert torch.equal(new.load_accum, old.load_accum)
    assert torch.equal(new.drop_accum, old.drop_accum)
    if cf is not None:
        assert new.drop_accum[0] > 0  # the capacity dropped assignments
    assert torch.equal(dx1, dx0)
    for n in g0:
        assert torch.equal(g1[n], g0[n]), n


def test_zero_bias_is_passed_and_changes_no_choice():
    """A zero expert bias is added to the scores (no host test of it), a non-zero one is
    honoured even with loss-free balancing off (the replica noise of expert upcycling)."""
    torch.manual_seed(0)
    layer = MoELayer(16, 32, MoEConfig(num_experts=4, top_k=1), init_std=0.05)
    x = torch.randn(64, 16)
    before = layer.routing(x).topk_idx_TK
    assert torch.equal(before, torch.topk(F.softmax(layer.router(x), -1), 1).indices)
    with torch.no_grad():
        layer.expert_bias[2] = 10.0
    assert (layer.routing(x).topk_idx_TK == 2).all()


def test_router_gating_matches_the_plain_fp32_router_and_saves_no_fp32_input():
    """bf16 input and weight: logits, dx and dW of ``_RouterGating`` equal those of the plain
    fp32 router ``F.linear(x.float(), w.float())``, and backward keeps the bf16 input, not an
    fp32 copy (Megatron-Core's RouterGatingLinearFunction)."""
    torch.manual_seed(0)
    x = torch.randn(96, 32, dtype=torch.bfloat16)
    w = (torch.randn(8, 32) * 0.1).to(torch.bfloat16)
    g = torch.randn(96, 8)
    saved = []

    def run(fn):
        xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
        saved.clear()
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            out = fn(xx, ww)
        out.backward(g)
        return out, xx.grad, ww.grad, [(t.dtype, tuple(t.shape)) for t in saved]

    new = run(lambda a, b: layer_mod._RouterGating.apply(a, b, torch.float32))
    plain = run(lambda a, b: F.linear(a.float(), b.float()))
    assert new[0].dtype == torch.float32
    for a, b in zip(new[:3], plain[:3]):
        assert torch.equal(a, b)
    assert (torch.float32, (96, 32)) in plain[3]  # what the plain router keeps for backward
    assert new[3] == [(torch.bfloat16, (96, 32)), (torch.bfloat16, (8, 32))]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_grouped_experts_equal_the_loop_on_cpu_with_empty_groups(dtype, tol):
    """``torch._grouped_mm`` runs forward and backward on CPU in torch 2.13 (the comment that
    said otherwise was wrong): outputs and all gradients match the per-expert loop, an empty
    expert's weight gradient is exactly 0."""
    torch.manual_seed(0)
    E, D, Fh = 4, 16, 24
    counts = torch.tensor([5, 0, 17, 10])
    x = torch.randn(int(counts.sum()), D, dtype=dtype)
    ws = [(torch.randn(E, *s) * 0.2).to(dtype) for s in ((D, Fh), (D, Fh), (Fh, D))]
    scale = torch.rand(x.shape[0])
    outs = []
    for fn, c in ((layer_mod.swiglu_experts_grouped, counts),
                  (layer_mod.swiglu_experts_loop, counts.tolist())):
        xx = x.clone().requires_grad_()
        ww = [w.clone().requires_grad_() for w in ws]
        y = fn(xx, c, *ww, scale)
        y.float().pow(2).sum().backward()
        outs.append([y, xx.grad] + [w.grad for w in ww])
    for a, b in zip(*outs):
        assert torch.allclose(a.float(), b.float(), atol=tol, rtol=tol)
    assert all((g[1] == 0).all() for g in outs[0][2:])


def test_the_rule_keeps_the_loop_on_cpu_unless_forced(monkeypatch):
    for dtype in (torch.float32, torch.bfloat16):
        assert not layer_mod._use_grouped_mm(torch.zeros(2, dtype=dtype))
    monkeypatch.setattr(layer_mod, "GROUPED_MM", True)
    assert layer_mod._use_grouped_mm(torch.zeros(2))

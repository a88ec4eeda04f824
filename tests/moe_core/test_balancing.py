"""Aux losses, z-loss, adaptive coefficients (002 Eq. 5–9) and loss-free bias (003 §2)."""

import math

import pytest
import torch

from moe_core.config import MoEConfig, RouterConfig
from moe_core.moe import balancing
from moe_core.moe.layer import MoELayer


def test_switch_aux_hand():
    # T=3 tokens, E=2 experts, K=1. P column sums: [1.5, 1.5]; Q = [2, 1].
    probs = torch.tensor([[0.9, 0.1], [0.4, 0.6], [0.2, 0.8]])
    idx = torch.tensor([[0], [0], [1]])
    # E/(K·T²)·Σ P_i Q_i = 2/9 · (1.5·2 + 1.5·1) = 1.0
    assert balancing.switch_aux_loss(probs, idx).item() == pytest.approx(1.0)
    idx = torch.tensor([[0], [0], [0]])
    assert balancing.switch_aux_loss(probs, idx).item() == pytest.approx(2 / 9 * 1.5 * 3)
    # the caller's counts are used as Q as they are (the MoE layer passes its dispatch counts)
    q = torch.tensor([1, 2])
    assert balancing.switch_aux_loss(probs, idx, counts_E=q).item() == pytest.approx(1.0)


def test_expert_counts_from_sorted_ids_hand():
    from moe_core.moe.layer import expert_counts

    ids = torch.tensor([0, 0, 2, 2, 2, 3])  # sorted; expert 1 and 4 empty
    assert expert_counts(ids, 5).tolist() == [2, 0, 3, 1, 0]
    assert expert_counts(torch.zeros(0, dtype=torch.long), 3).tolist() == [0, 0, 0]


def test_switch_aux_is_one_at_perfect_balance_and_000_form():
    # 000 App. A.3 for 8 experts top-2: (4/T²)·Σ_i (Σ_j P_ji)·Q_i
    T, E, K = 16, 8, 2
    probs = torch.full((T, E), 1 / E)
    idx = torch.arange(T * K).reshape(T, K) % E
    assert balancing.switch_aux_loss(probs, idx).item() == pytest.approx(1.0)
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(T, E), -1)
    idx = torch.topk(probs, K).indices
    q = torch.bincount(idx.flatten(), minlength=E).float()
    ref = 4 / T**2 * (probs.sum(0) * q).sum()
    assert balancing.switch_aux_loss(probs, idx).item() == pytest.approx(ref.item(), rel=1e-6)


def test_squared_aux_hand():
    probs = torch.tensor([[0.9, 0.1], [0.4, 0.6], [0.2, 0.8]])
    # means = [0.5, 0.5] -> 0; shift one row
    assert balancing.squared_aux_loss(probs).item() == pytest.approx(0.0, abs=1e-12)
    probs = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    # (1/2 - 1)² + (1/2 - 0)² = 0.5
    assert balancing.squared_aux_loss(probs).item() == pytest.approx(0.5)


def test_z_loss_hand():
    z = torch.tensor([[0.0, 0.0], [1.0, 2.0]])
    a = math.log(2.0)
    b = math.log(math.e + math.e**2)
    assert balancing.z_loss(z).item() == pytest.approx((a * a + b * b) / 2, rel=1e-6)


def test_adaptive_coefficient_scripted_sequence():
    xi, amax, beta = 0.2, 0.01, 0.9
    drops = [0.1, 0.0, 0.5, 0.02, 0.3]
    alpha, got = 1e-3, []
    for d in drops:
        alpha = balancing.adaptive_aux_coef(alpha, d, xi=xi, alpha_max=amax, beta=beta)
        got.append(alpha)
    # by hand: f(d) = min(0.2·d, 0.01): 0.01 (d=0.1 -> 0.02 capped), 0, 0.01, 0.004, 0.01
    exp, a = [], 1e-3
    for f in [0.01, 0.0, 0.01, 0.004, 0.01]:
        a = 0.9 * a + 0.1 * f
        exp.append(a)
    assert got == pytest.approx(exp, rel=1e-12)
    assert balancing.adaptive_aux_target(0.01, xi, amax) == pytest.approx(0.002)


def test_adaptive_coefficient_in_layer_follows_measured_drop_rate():
    torch.manual_seed(0)
    cfg = MoEConfig(num_experts=4, top_k=1, expert_d_ff=8, capacity_factor=1.0,
                    router=RouterConfig(adaptive_aux=True, adaptive_beta=0.5, aux_coef=1e-3))
    layer = MoELayer(8, 8, cfg, init_std=0.1)
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[0, 0] = 5.0  # most tokens prefer expert 0 -> drops at cf=1
    x = torch.randn(64, 8).abs()
    layer.record_stats = True
    layer(x)
    d = layer.last_stats["drop_rate"]
    assert d > 0.3
    out = layer.update_balancing()
    assert out["drop_rate"] == pytest.approx(d)
    assert float(layer.aux_coef) == pytest.approx(0.5 * 1e-3 + 0.5 * min(0.2 * d, 0.01), rel=1e-6)


def test_dropless_layer_uses_cf1_overflow_as_drop_signal():
    torch.manual_seed(0)
    cfg = MoEConfig(num_experts=4, top_k=1, expert_d_ff=8,
                    router=RouterConfig(adaptive_aux=True, adaptive_beta=0.0))
    layer = MoELayer(8, 8, cfg, init_std=0.1)
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[0, 0] = 5.0
    layer.record_stats = True
    layer(torch.randn(64, 8).abs())
    assert layer.last_stats["drop_rate"] == 0.0
    d = layer.last_stats["overflow_rate_cf1"]
    assert d > 0.3
    layer.update_balancing()
    assert float(layer.aux_coef) == pytest.approx(min(0.2 * d, 0.01), rel=1e-6)


def test_loss_free_bias_update_hand():
    b = balancing.loss_free_bias_update(torch.zeros(3), torch.tensor([6.0, 3.0, 0.0]), 0.1)
    assert b.tolist() == pytest.approx([-0.1, 0.0, 0.1])


def test_loss_free_bias_moves_load_toward_uniform():
    torch.manual_seed(0)
    E = 4
    cfg = MoEConfig(num_experts=E, top_k=1, expert_d_ff=8, router=RouterConfig(
        order="topk_softmax", aux_loss="none", loss_free_rate=0.05))
    layer = MoELayer(8, 8, cfg, init_std=0.1)
    with torch.no_grad():
        layer.router.weight.normal_(std=0.1)
        layer.router.weight[0] += 0.5  # skew toward expert 0
    x = torch.randn(256, 8) + 0.5

    def max_load():
        layer.load_accum.zero_()
        layer.drop_accum.zero_()
        layer(x)
        return float(layer.load_accum.max() / layer.load_accum.sum())

    start = max_load()
    for _ in range(60):
        layer(x)
        layer.update_balancing()
    end = max_load()
    assert start > 0.45
    assert end < start - 0.15
    assert abs(end - 1 / E) < 0.15
    # the router weights did not move: balance came from the bias alone
    assert layer.expert_bias.abs().sum() > 0

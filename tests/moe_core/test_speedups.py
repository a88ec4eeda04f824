"""Speed options of the model (issue #10): the atomic-free combine of the MoE layer, activation
checkpointing (balancing state counted once per forward), regional torch.compile and its
fallback, and the ``model.*`` keys that switch them on."""

import logging

import pytest
import torch
import torch.utils.checkpoint

import moe_core.moe.layer as layer_mod
from moe_core import build_model
from moe_core.config import MoEConfig, RouterConfig
from moe_core.errors import ConfigError
from moe_core.moe.layer import MoELayer, combine, dispatch, swiglu_experts_loop
from moe_core.moe.routing import capacity
from moe_core.nn import in_recompute
from moe_core.presets import model_config
from moe_core.train import Trainer, train_config_from_dict
from moe_core.train.config import ModelSpec

ROUTERS = {
    "softmax_topk": RouterConfig(),
    "topk_softmax": RouterConfig(order="topk_softmax"),
    "renorm_lognorm_squared_z": RouterConfig(renormalize=True, logit_norm_lambda=1.0,
                                             aux_loss="squared", z_loss_coef=1e-3),
    "loss_free_adaptive": RouterConfig(loss_free_rate=1e-2, adaptive_aux=True),
}


def index_add_forward(layer: MoELayer, x: torch.Tensor) -> torch.Tensor:
    """The layer's output as computed before the atomic-free combine: experts on the sorted
    assignments, then ``index_add_`` of each weighted output onto its token."""
    cfg, E, K = layer.cfg, layer.num_experts, layer.cfg.top_k
    x_TD = x.reshape(-1, x.shape[-1])
    r = layer.routing(x_TD)
    flat_e = r.topk_idx_TK.reshape(-1)
    order = torch.sort(flat_e, stable=True).indices
    counts = torch.bincount(flat_e, minlength=E)
    w_N, tok_N, kept = r.topk_weight_TK.reshape(-1)[order], order // K, counts
    if cfg.capacity_factor is not None:
        cap = capacity(x_TD.shape[0], K, E, cfg.capacity_factor)
        pos = torch.arange(order.numel()) - (torch.cumsum(counts, 0) - counts).repeat_interleave(
            counts)
        keep = pos < cap
        tok_N, w_N, kept = tok_N[keep], w_N[keep], counts.clamp(max=cap)
    y = swiglu_experts_loop(x_TD[tok_N], kept.tolist(), layer.w_gate, layer.w_up, layer.w_down,
                            w_N)
    out = torch.zeros_like(x_TD).index_add_(0, tok_N, y)
    if layer.shared is not None:
        out = out + layer.shared(x_TD)
    return out.reshape(x.shape)


@pytest.mark.parametrize("router", list(ROUTERS))
@pytest.mark.parametrize("E,K,cf,shared", [(4, 1, None, 0), (8, 2, None, 0), (8, 2, 1.0, 1),
                                           (8, 2, 0.5, 0), (16, 4, None, 1), (16, 8, 1.25, 0)])
def test_combine_equals_index_add(router, E, K, cf, shared, monkeypatch):
    """Output and gradients of the atomic-free dispatch/combine (the CUDA path, forced here)
    equal indexing + index_add_: bit for bit for K <= 2 (a + b == b + a), within float rounding
    for K > 2 (another summation order)."""
    monkeypatch.setattr(layer_mod, "ATOMIC_FREE", True)
    torch.manual_seed(0)
    cfg = MoEConfig(num_experts=E, top_k=K, expert_d_ff=24, capacity_factor=cf,
                    num_shared_experts=shared, router=ROUTERS[router])
    layer = MoELayer(16, 24, cfg, init_std=0.2)
    x = torch.randn(3, 20, 16, requires_grad=True)
    y, _ = layer(x)
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, [x, *layer.parameters()], g, allow_unused=True)
    y_ref = index_add_forward(layer, x)
    grads_ref = torch.autograd.grad(y_ref, [x, *layer.parameters()], g, allow_unused=True)
    if K <= 2:
        assert torch.equal(y, y_ref)
        for a, b in zip(grads, grads_ref):
            assert (a is None and b is None) or torch.equal(a, b)
    else:  # fp32: a reordered sum of K terms of size ~1 differs by a few ulps
        assert (y - y_ref).abs().max() <= 1e-6 * y_ref.abs().max()
        for a, b in zip(grads, grads_ref):
            assert (a is None and b is None) or (a - b).abs().max() <= 1e-5 * b.abs().max()


def test_combine_leaves_dropped_slots_zero_and_gathers_gradient():
    y = torch.arange(6.0).view(3, 2).requires_grad_()
    slot = torch.tensor([5, 0, 2])  # T=3, K=2: slots 1, 3, 4 dropped
    out = combine(y, slot, 3, 2, dropless=False)
    # row 0 -> slot 5 (token 2), row 1 -> slot 0 (token 0), row 2 -> slot 2 (token 1)
    assert out.tolist() == [[2.0, 3.0], [4.0, 5.0], [0.0, 1.0]]
    (gy,) = torch.autograd.grad(out, y, torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]))
    # row n's gradient is the gradient of the token owning slot_N[n] = t·K + k
    assert gy.tolist() == [[5.0, 6.0], [1.0, 2.0], [3.0, 4.0]]


def test_dispatch_gathers_rows_and_its_backward_is_combine():
    x = torch.arange(6.0).view(3, 2).requires_grad_()
    slot = torch.tensor([5, 0, 2])  # K=2: rows for tokens 2, 0, 1; slots 1, 3, 4 dropped
    rows = dispatch(x, slot, 2, dropless=False)
    assert rows.tolist() == [[4.0, 5.0], [0.0, 1.0], [2.0, 3.0]]
    (gx,) = torch.autograd.grad(rows, x, torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]))
    assert gx.tolist() == [[3.0, 4.0], [5.0, 6.0], [1.0, 2.0]]


def test_cpu_keeps_index_add_unless_forced(monkeypatch):
    x = torch.zeros(2, 2)
    assert layer_mod.ATOMIC_FREE is None and not layer_mod._atomic_free(x)  # CUDA only
    for forced in (True, False):
        monkeypatch.setattr(layer_mod, "ATOMIC_FREE", forced)
        assert layer_mod._atomic_free(x) is forced


# ---- activation checkpointing ------------------------------------------------------------------

def _tiny(moe: MoEConfig | None):
    torch.manual_seed(0)
    return build_model(model_config("debug", vocab_size=48, moe=moe, max_seq_len=16))


MOE_STATEFUL = MoEConfig(num_experts=4, top_k=2, capacity_factor=1.0,
                         router=RouterConfig(loss_free_rate=1e-2, adaptive_aux=True))


@pytest.mark.parametrize("moe", [None, MOE_STATEFUL, MoEConfig(num_experts=4, top_k=2,
                                                               num_shared_experts=1)],
                         ids=["dense", "moe-capacity-lossfree-adaptive", "moe-shared"])
@pytest.mark.parametrize("early_stop", [True, False])
def test_activation_checkpointing_is_bit_identical_and_counts_once(moe, early_stop):
    """early_stop=False makes the recompute run every block to its end, the MoE layer's
    balancing update included (with early stop torch may halt it before)."""
    tok = torch.randint(0, 48, (3, 16), generator=torch.Generator().manual_seed(1))
    runs = []
    for ckpt in (False, True):
        m = _tiny(moe)
        m.enable_speedups(activation_checkpointing=ckpt)
        m.record_router_stats(True)
        seen = []
        for layer in m.moe_layers():
            layer.register_forward_pre_hook(lambda *_, s=seen: s.append(in_recompute()))
        for _ in range(2):  # two steps: the second routes with the updated balancing state
            with torch.utils.checkpoint.set_checkpoint_early_stop(early_stop):
                out = m(tok, tok)
            (out.loss + out.aux_loss).backward()
            state = [(lay.load_accum.clone(), lay.drop_accum.clone()) for lay in m.moe_layers()]
            upd = m.update_balancing()
        runs.append((out, [p.grad for p in m.parameters()], state, upd, m, seen))
    (o0, g0, s0, u0, m0, seen0), (o1, g1, s1, u1, m1, seen1) = runs
    assert torch.equal(o0.loss, o1.loss) and torch.equal(o0.aux_loss, o1.aux_loss)
    assert all(torch.equal(a, b) for a, b in zip(g0, g1))
    for (la, da), (lb, db) in zip(s0, s1):  # counters after the backward: counted once
        assert torch.equal(la, lb) and torch.equal(da, db)
    assert u0 == u1 and o0.router_stats == o1.router_stats
    for a, b in zip(m0.moe_layers(), m1.moe_layers()):
        assert torch.equal(a.expert_bias, b.expert_bias) and torch.equal(a.aux_coef, b.aux_coef)
    if moe is not None:  # the recompute really ran, and knew it was one
        L = len(m0.moe_layers())
        assert seen0 == [False] * 2 * L
        assert seen1.count(True) == 2 * L and seen1.count(False) == 2 * L


def test_activation_checkpointing_off_under_no_grad():
    m = _tiny(MOE_STATEFUL)
    m.enable_speedups(activation_checkpointing=True)
    with torch.no_grad():
        out = m(torch.zeros(1, 16, dtype=torch.long))
    assert out.logits.grad_fn is None


# ---- regional torch.compile --------------------------------------------------------------------

def _loss_and_grads(m, tok):
    m.zero_grad()
    out = m(tok, tok)
    (out.loss + out.aux_loss).backward()
    return out, [p.grad.clone() for p in m.parameters()]


@pytest.mark.slow
def test_compiled_blocks_match_eager():
    """Inductor-compiled blocks (C++ on CPU) give eager's loss and gradients within 1e-5
    relative (fused kernels round differently); the state dict keeps its keys."""
    m = _tiny(MoEConfig(num_experts=4, top_k=2, router=RouterConfig(loss_free_rate=1e-2)))
    tok = torch.randint(0, 48, (2, 16), generator=torch.Generator().manual_seed(2))
    keys = list(m.state_dict())
    ref, g_ref = _loss_and_grads(m, tok)
    load_eager = [lay.load_accum.clone() for lay in m.moe_layers()]
    assert m.enable_speedups(compile=True)
    out, g = _loss_and_grads(m, tok)
    if m._compiled is None:
        pytest.skip("torch.compile is unavailable here (the fallback warned)")
    assert list(m.state_dict()) == keys
    torch.testing.assert_close(out.logits, ref.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.loss, ref.loss, rtol=1e-5, atol=1e-6)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for lay, before in zip(m.moe_layers(), load_eager):  # counted once by the compiled run
        assert torch.equal(lay.load_accum, 2 * before)


def test_compile_failure_at_setup_falls_back_to_eager(monkeypatch, caplog):
    m = _tiny(MoEConfig(num_experts=4, top_k=2))
    tok = torch.randint(0, 48, (2, 16))
    ref, g_ref = _loss_and_grads(m, tok)

    def broken(*a, **k):
        raise RuntimeError("Python 3.x is not supported by torch.compile")

    monkeypatch.setattr(torch, "compile", broken)
    with caplog.at_level(logging.WARNING, logger="moe_core.model"):
        assert not m.enable_speedups(compile=True)
    assert [r.name for r in caplog.records if r.levelno >= logging.WARNING] == ["moe_core.model"]
    assert "model.compile=true" in caplog.text
    out, g = _loss_and_grads(m, tok)
    assert torch.equal(out.loss, ref.loss) and all(torch.equal(a, b) for a, b in zip(g, g_ref))


@pytest.mark.slow
def test_compile_failure_at_first_call_falls_back_once(caplog):
    """A backend that fails (as inductor does without a C compiler) at the first call: one
    warning naming the key, eager results bit for bit, and the balancing counters of the
    failed call are not counted twice."""
    m = _tiny(MoEConfig(num_experts=4, top_k=2, capacity_factor=1.0))
    tok = torch.randint(0, 48, (2, 16))
    ref, g_ref = _loss_and_grads(m, tok)
    load_eager = [lay.load_accum.clone() for lay in m.moe_layers()]

    def failing_backend(gm, example_inputs):
        raise RuntimeError("no working C compiler found")

    torch._dynamo.reset()
    assert m.enable_speedups(compile=True, backend=failing_backend)
    with caplog.at_level(logging.WARNING, logger="moe_core.model"):
        out, g = _loss_and_grads(m, tok)
        out2, _ = _loss_and_grads(m, tok)
    assert m._compiled is None
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.name for r in warned] == ["moe_core.model"]
    msg = warned[0].getMessage()
    assert "model.compile=true" in msg and "no working C compiler" in msg
    assert torch.equal(out.loss, ref.loss) and torch.equal(out2.loss, ref.loss)
    assert all(torch.equal(a, b) for a, b in zip(g, g_ref))
    for lay, before in zip(m.moe_layers(), load_eager):
        assert torch.equal(lay.load_accum, 3 * before)


def test_non_compile_errors_are_not_swallowed():
    """Only torch.compile's own failures switch to eager; any other error of a compiled block
    propagates and compilation stays on."""
    m = _tiny(None)

    def block_raising(*args):
        raise ValueError("a genuine error inside the block")

    m._compiled = [block_raising] * len(m.blocks)
    with pytest.raises(ValueError, match="genuine error"):
        m(torch.zeros(1, 4, dtype=torch.long))
    assert m._compiled is not None


# ---- the config keys -------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["compile", "activation_checkpointing", "chunked_loss"])
def test_keys_validated_with_their_yaml_name(key):
    allowed = "true or false or one of 'auto'" if key == "compile" else "true or false"
    with pytest.raises(ConfigError, match=rf"model\.{key}='yes' must be {allowed}"):
        train_config_from_dict({"model": {key: "yes"}})
    with pytest.raises(ConfigError, match=rf"model\.{key}"):
        ModelSpec(**{key: 1})
    assert getattr(train_config_from_dict({"model": {key: True}}).model, key) is True


def test_compile_auto_is_the_default_and_on_only_for_cuda(monkeypatch):
    """``model.compile: auto`` (the default) compiles the blocks of a model on a CUDA device
    and leaves a CPU model eager; true and false still force it."""
    assert ModelSpec().compile == "auto"
    assert train_config_from_dict({"model": {"compile": "auto"}}).model.compile == "auto"
    assert train_config_from_dict({"model": {"compile": False}}).model.compile is False
    m = build_model(model_config("tiny", vocab_size=64, max_seq_len=16))
    assert m.enable_speedups(compile="auto") is False and not m.compiled
    assert m.enable_speedups(compile=True, backend="eager") is True
    seen = []
    monkeypatch.setattr(torch, "compile", lambda b, backend: seen.append(b) or b)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    assert m.enable_speedups(compile="auto") is True and len(seen) == len(m.blocks)
    assert m.enable_speedups(compile=False) is False


def test_execution_keys_leave_the_parent_identity_alone():
    a, b = ModelSpec(), ModelSpec(compile=True, activation_checkpointing=True, chunked_loss=True)
    assert a.identity() == b.identity() == {"preset": "debug", "max_seq_len": None}


def trainer_cfg(tmp_path, **model):
    """A 3-step E4 top-2 run (loss-free bias on) with ``model.*`` options."""
    return train_config_from_dict({
        "model": {"preset": "debug", **model},
        "moe": {"num_experts": 4, "top_k": 2, "router": {"loss_free_rate": 1e-2}},
        "data": {"source": "synthetic", "synthetic_vocab": 32, "synthetic_tokens": 20_000,
                 "seq_len": 16, "cache_dir": str(tmp_path / "cache")},
        "batch": {"global_batch": 4, "micro_batch": 2},
        "eval": {"every_steps": 100, "batches": 1}, "tokens": 3 * 4 * 16,
    })


def test_trainer_with_checkpointing_trains_bit_identically(tmp_path):
    runs = []
    for ckpt in (False, True):
        t = Trainer(trainer_cfg(tmp_path, activation_checkpointing=ckpt))
        assert t.model.activation_checkpointing is ckpt
        losses = [t.step().train_loss for _ in range(3)]
        runs.append((losses, [m.expert_bias.clone() for m in t.model.moe_layers()]))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))


def test_trainer_with_chunked_loss(tmp_path):
    """``model.chunked_loss`` trains to the plain path's losses up to rounding (moe_core.loss)."""
    runs = []
    for chunked in (False, True):
        t = Trainer(trainer_cfg(tmp_path, chunked_loss=chunked))
        assert t.model.chunked_loss is chunked
        runs.append([t.step().train_loss for _ in range(3)] + [t.evaluate()["val_loss"]])
    assert runs[0] == pytest.approx(runs[1], rel=1e-5)

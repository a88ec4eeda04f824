"""The chunked LM-head loss (``moe_core.loss``, ``model.chunked_loss``): the loss and gradients of
``F.cross_entropy(logits.float(), targets)`` without the [tokens, vocab] logits."""

import pytest
import torch
import torch.nn.functional as F

from moe_core import build_model
from moe_core.config import MoEConfig
from moe_core.loss import linear_cross_entropy
from moe_core.presets import model_config


def reference(h, w, t, dtype=torch.float64):
    """Loss and gradients of the plain path, computed in ``dtype``."""
    h = h.detach().to(dtype).requires_grad_()
    w = w.detach().to(dtype).requires_grad_()
    loss = F.cross_entropy(h @ w.t(), t)
    loss.backward()
    return loss.detach(), h.grad, w.grad


def ours(h, w, t, **kw):
    h = h.detach().clone().requires_grad_()
    w = w.detach().clone().requires_grad_()
    loss = linear_cross_entropy(h, w, t, **kw)
    loss.backward()
    return loss.detach(), h.grad, w.grad


def rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


@pytest.mark.parametrize("chunk", [1, 7, 50, 64, None])
def test_equals_cross_entropy_in_fp32(chunk):
    """Loss and both gradients equal the plain path's to fp32 rounding, for chunks that do and
    do not divide the tokens, with ignored targets."""
    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(50, 16, generator=g), torch.randn(37, 16, generator=g) * 0.5
    t = torch.randint(0, 37, (50,), generator=g)
    t[[3, 17, 40]] = -100
    ref = reference(h, w, t)
    got = ours(h, w, t, chunk_tokens=chunk)
    assert got[0].dtype == torch.float32
    for a, b in zip(got, ref):
        assert rel(a, b) < 1e-6
    plain = reference(h, w, t, torch.float32)
    assert rel(got[0], plain[0]) < 1e-6 and rel(got[2], plain[2]) < 1e-6


def test_bf16_as_accurate_as_the_plain_path():
    """In bf16 the chunked path's loss and gradients are as close to an fp64 reference as the
    plain bf16 path's (the same casts: logits in bf16, loss in fp32, gradients cast back)."""
    g = torch.Generator().manual_seed(1)
    h, w = torch.randn(256, 64, generator=g), torch.randn(512, 64, generator=g) * 0.1
    t = torch.randint(0, 512, (256,), generator=g)
    hb, wb = h.bfloat16(), w.bfloat16()
    ref = reference(hb, wb, t)  # the same bf16 inputs, exact arithmetic

    def plain():
        hh, ww = hb.clone().requires_grad_(), wb.clone().requires_grad_()
        loss = F.cross_entropy((hh @ ww.t()).float(), t)
        loss.backward()
        return loss.detach(), hh.grad, ww.grad

    base, got = plain(), ours(hb, wb, t, chunk_tokens=48)
    assert got[1].dtype == got[2].dtype == torch.bfloat16
    for a, b, r in zip(got, base, ref):
        assert rel(a, r) <= max(2 * rel(b, r), 1e-6)


def test_no_grad_and_scaled_backward():
    g = torch.Generator().manual_seed(2)
    h, w = torch.randn(30, 8, generator=g), torch.randn(11, 8, generator=g)
    t = torch.randint(0, 11, (30,), generator=g)
    with torch.no_grad():
        assert torch.allclose(linear_cross_entropy(h, w, t, chunk_tokens=4),
                              F.cross_entropy(h @ w.t(), t), rtol=1e-6)
    hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
    (3.0 * linear_cross_entropy(hh, ww, t, chunk_tokens=4)).backward()
    _, gh, gw = reference(h, w, t)
    assert rel(hh.grad, 3 * gh) < 1e-6 and rel(ww.grad, 3 * gw) < 1e-6
    ww.grad = None  # a gradient for the weight only
    linear_cross_entropy(h, ww, t, chunk_tokens=4).backward()
    assert rel(ww.grad, gw) < 1e-6


@pytest.mark.parametrize("moe,tied", [(None, False), (MoEConfig(num_experts=4, top_k=2), False),
                                      (None, True)])
def test_model_chunked_loss_matches_the_plain_path(moe, tied, monkeypatch):
    """A model with ``chunked_loss`` gives the plain path's loss and every parameter's gradient
    to fp32 rounding (tied embeddings included), and no logits."""
    import dataclasses

    import moe_core.loss as loss_mod
    monkeypatch.setattr(loss_mod, "CHUNK_ELEMENTS", 3 * 512)  # 3 tokens a chunk: many chunks
    cfg = dataclasses.replace(model_config("debug", vocab_size=512, moe=moe),
                              tie_embeddings=tied)
    torch.manual_seed(0)
    m = build_model(cfg)
    tok = torch.randint(0, 512, (2, 16))
    tgt = torch.randint(0, 512, (2, 16))
    grads = []
    for chunked in (False, True):
        m.zero_grad()
        m.enable_speedups(chunked_loss=chunked)
        out = m(tok, tgt)
        assert (out.logits is None) is chunked
        (out.loss + out.aux_loss).backward()
        grads.append((out.loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}))
    (la, ga), (lb, gb) = grads
    assert torch.allclose(la, lb, rtol=1e-6)
    for n in ga:
        assert rel(gb[n], ga[n]) < 1e-5, n
    assert m(tok).logits is not None  # without targets: logits as always

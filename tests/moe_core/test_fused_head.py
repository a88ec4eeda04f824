"""Liger's fused linear cross-entropy for the LM head (``model.fused_head``), checked on CPU under
the Triton interpreter (``TRITON_INTERPRET=1``) against the chunked loss, which stays the CPU
path and the reference: loss and gradients in fp32 and bf16, ``ignore_index`` targets, tied
embeddings; and the rule that picks it (CUDA with liger-kernel installed, a switch to force
it off)."""

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from moe_core import build_model
from moe_core.config import MoEConfig
from moe_core.errors import ConfigError
from moe_core.loss import head_loss, liger_available
from moe_core.presets import model_config
from moe_core.train import engine as eng

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
RUNS_HERE = torch.cuda.is_available() or INTERPRETED
"""Triton reads ``TRITON_INTERPRET`` when a kernel is defined, and torch imports triton early
(``torch._dynamo``), so on a CPU the switch must be set before the process starts: the liger
cases then run in a child pytest (``test_liger_cases_under_the_triton_interpreter``)."""
NO_LIGER = "liger-kernel and triton are not installed (pip install -e '.[dev]' brings both)"
needs_liger = pytest.mark.skipif(
    not liger_available() or not RUNS_HERE,
    reason=NO_LIGER if not liger_available() else
    "no CUDA: run in a child process under TRITON_INTERPRET=1 by "
    "test_liger_cases_under_the_triton_interpreter")
LIGER_CASES = 5  # tests below whose name has "liger" and that run under needs_liger


def _dev():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _loss_and_grads(h, w, t, fused):
    h = h.detach().clone().requires_grad_()
    w = w.detach().clone().requires_grad_()
    loss = head_loss(h, w, t, fused=fused)
    loss.backward()
    return loss.detach(), h.grad, w.grad


def rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


@needs_liger
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_liger_equals_chunked_with_ignored_targets(dtype, tol):
    g = torch.Generator().manual_seed(0)
    N, d, V = 80, 32, 300
    h = (torch.randn(N, d, generator=g) * 0.5).to(dtype).to(_dev())
    w = (torch.randn(V, d, generator=g) * 0.05).to(dtype).to(_dev())
    t = torch.randint(0, V, (N,), generator=g).to(_dev())
    t[::5] = -100  # ignore_index: left out of the mean and of the gradients
    ref = _loss_and_grads(h, w, t, fused=False)
    got = _loss_and_grads(h, w, t, fused=True)
    assert got[0].dtype == torch.float32
    assert abs(float(got[0]) - float(ref[0])) <= tol * abs(float(ref[0]))
    assert got[1].dtype == h.dtype and got[2].dtype == w.dtype
    assert rel(got[1], ref[1]) < tol and rel(got[2], ref[2]) < tol
    assert torch.all(got[1][::5] == 0)  # ignored rows get no gradient
    # and the loss really leaves them out: all targets kept gives another loss
    t_all = torch.where(t < 0, 0, t)
    assert abs(float(head_loss(h, w, t_all, fused=True)) - float(got[0])) > 1e-4


@needs_liger
@pytest.mark.parametrize("moe,tied", [(None, True), (MoEConfig(num_experts=4, top_k=2), False)])
def test_liger_model_matches_the_chunked_loss(moe, tied):
    """Every parameter's gradient, the tied embedding's (head + embedding) included."""
    cfg = dataclasses.replace(model_config("debug", vocab_size=256, moe=moe),
                              tie_embeddings=tied)
    torch.manual_seed(0)
    m = build_model(cfg).to(_dev())
    tok = torch.randint(0, 256, (2, 16), device=_dev())
    tgt = torch.randint(0, 256, (2, 16), device=_dev())
    tgt[0, :3] = -100
    runs = []
    for fused in (False, True):
        m.zero_grad()
        m.enable_speedups(chunked_loss=not fused, fused_head=fused)
        out = m(tok, tgt)
        (out.loss + out.aux_loss).backward()
        runs.append((out.loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}))
    (la, ga), (lb, gb) = runs
    assert torch.allclose(la, lb, rtol=1e-6)
    for n in ga:
        assert rel(gb[n], ga[n]) < 1e-5, n
    with torch.no_grad():  # evaluation: the chunked sum, whichever head trains
        fused_eval = m(tok, tgt).loss
        m.enable_speedups(chunked_loss=True)
        assert torch.equal(fused_eval, m(tok, tgt).loss)


def test_selection_rule(monkeypatch):
    import moe_core.loss as loss_mod

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    monkeypatch.setattr(loss_mod, "liger_available", lambda: True)
    assert eng.pick_fused_head("auto", cuda) is True
    assert eng.pick_fused_head("auto", cpu) is False  # CPU: the chunked loss
    assert eng.pick_fused_head(False, cuda) is False  # the switch that forces it off
    assert eng.pick_fused_head(True, cuda) is True
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ConfigError, match="model.fused_head=true needs"):
        eng.pick_fused_head(True, cpu)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert eng.pick_fused_head(True, cpu) is True  # the interpreter runs it (tests)
    monkeypatch.setattr(loss_mod, "liger_available", lambda: False)
    assert eng.pick_fused_head("auto", cuda) is False  # not installed: chunked
    with pytest.raises(ConfigError, match=r"pip install -e '.\[gpu\]'"):
        eng.pick_fused_head(True, cuda)


@pytest.mark.parametrize("value", ["on", 1, None])
def test_config_key_validated(value, tmp_path):
    from .test_train import small_cfg

    with pytest.raises(ConfigError, match="model.fused_head"):
        small_cfg(tmp_path, model={"preset": "debug", "fused_head": value})


@needs_liger
def test_liger_trainer_learns_like_the_chunked_loss(tmp_path):
    from moe_core.train import Trainer

    from .test_train import small_cfg

    losses = []
    for fused in (False, True):
        cfg = small_cfg(tmp_path, model={"preset": "debug", "fused_head": fused,
                                         "chunked_loss": True})
        t = Trainer(cfg)
        assert t.model.fused_head is fused
        losses.append([t.step().train_loss for _ in range(3)])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(not liger_available(), reason=NO_LIGER)
@pytest.mark.skipif(RUNS_HERE, reason="the liger cases run in this process")
def test_liger_cases_under_the_triton_interpreter():
    """On a CPU: the liger cases above in a child pytest started with ``TRITON_INTERPRET=1``;
    all of them must run and pass (none skipped)."""
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-k", "liger and not interpreter", str(Path(__file__).resolve())],
        env={**os.environ, "TRITON_INTERPRET": "1"}, cwd=root, capture_output=True, text=True,
        timeout=900)
    tail = r.stdout[-4000:] + r.stderr[-2000:]
    assert r.returncode == 0, tail
    passed = re.search(r"(\d+) passed", r.stdout)
    assert passed and int(passed.group(1)) == LIGER_CASES and "skipped" not in r.stdout, tail

"""Gradient clipping (000 Table 4: clip 1.0) by one global norm over the whole model, every
expert counted once, whatever optimizer class DeepSpeed hands back at ZeRO 0.

DeepSpeed 0.19.8's own ZeRO-0 clipping is wrong for MoE models: the bf16 wrapper
(``FP16_UnfusedOptimizer``) leaves expert gradients out of the norm, and the fp32 path averages
per-rank norms that cover different experts under expert parallelism (the 2-rank case is in
``test_expert_parallel.py``). The loop clips instead (``engine.clip_gradients``)."""

import math

import pytest
import torch

from moe_core.train import Trainer
from moe_core.train import engine as eng

from .test_train import small_cfg


def _first_step_grads(cfg) -> tuple[list[torch.Tensor], list[bool]]:
    """The gradients AdamW itself sees at the first step (fp32; in bf16 the wrapper's fp32
    master gradients) and which of them belong to experts."""
    t = Trainer(cfg)
    inner = getattr(t.optimizer, "optimizer", t.optimizer)
    seen: list[list[torch.Tensor]] = []
    inner.register_step_pre_hook(lambda opt, args, kwargs: seen.append(
        [p.grad.detach().float().clone() for g in opt.param_groups for p in g["params"]]))
    # the model's parameters in the optimizer's order (bf16: the wrapper's fp16_groups)
    groups = getattr(t.optimizer, "fp16_groups", None) or [g["params"] for g in
                                                          t.optimizer.param_groups]
    experts = [getattr(p, "allreduce", True) is False for g in groups for p in g]
    t.step()
    return [g for call in seen for g in call], experts  # ZeRO 1/2 step one group per call


@pytest.fixture(params=["fp32", "bf16"])
def dtype(request, monkeypatch):
    if request.param == "bf16":  # DeepSpeed then wraps AdamW in FP16_UnfusedOptimizer, as on CUDA
        monkeypatch.setattr(eng, "pick_dtype", lambda cfg_dtype, device: torch.bfloat16)
        monkeypatch.setitem(eng.DEFAULT_BF16_MODE, 0, "deepspeed")  # auto's ZeRO 0: autocast
    return request.param


def test_clipping_scales_every_gradient_by_the_global_norm_experts_included(tmp_path, dtype):
    moe = {"num_experts": 4, "top_k": 2}
    free, experts = _first_step_grads(small_cfg(tmp_path, moe=moe,
                                                optim={"lr": 3e-3, "grad_clip": 0.0}))
    assert any(experts) and not all(experts)
    norm = math.sqrt(sum(float(g.pow(2).sum()) for g in free))
    shared = math.sqrt(sum(float(g.pow(2).sum()) for g, e in zip(free, experts) if not e))
    assert norm > 1.02 * shared  # the experts' share: far above bf16's rounding of the scale
    clip = norm / 4  # active: every gradient is scaled by a quarter
    clipped, _ = _first_step_grads(small_cfg(tmp_path, moe=moe,
                                             optim={"lr": 3e-3, "grad_clip": clip}))
    scale = clip / (norm + 1e-6)
    tol = 1e-6 if dtype == "fp32" else 2 ** -8  # bf16: the scaled gradient is rounded once more
    for i, (a, b) in enumerate(zip(free, clipped)):
        assert torch.allclose(b, a * scale, rtol=tol, atol=1e-12), (i, experts[i])


def test_clip_gradients_is_deepspeeds_arithmetic_on_one_rank():
    """On one expert rank the loop's clipping is torch-op for torch-op what DeepSpeed's fp32
    ``clip_grad_norm_`` does, so fp32 single-rank runs keep their results bit for bit."""
    from deepspeed.runtime.utils import clip_grad_norm_

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Linear(5, 3))
    m(torch.randn(4, 7)).pow(2).sum().backward()
    theirs = [p.grad.clone() for p in m.parameters()]
    ours_norm = eng.clip_gradients(m, 0.1)
    ours = [p.grad.clone() for p in m.parameters()]
    for p, g in zip(m.parameters(), theirs):
        p.grad = g.clone()
    eng.init_distributed()  # DeepSpeed's reduces over the (one-rank) data-parallel group
    their_norm = clip_grad_norm_(list(m.parameters()), 0.1)
    assert torch.equal(ours_norm.reshape(1), their_norm.reshape(1))
    for p, g in zip(m.parameters(), ours):
        assert torch.equal(p.grad, g)
    assert float(ours_norm) > 0.1  # it did clip


def test_deepspeed_is_told_not_to_clip_at_zero_0_only(tmp_path):
    cfg0 = small_cfg(tmp_path, optim={"lr": 3e-3, "grad_clip": 0.5})
    cfg1 = small_cfg(tmp_path, optim={"lr": 3e-3, "grad_clip": 0.5, "zero_stage": 1})
    assert eng.clips_in_loop(cfg0) and not eng.clips_in_loop(cfg1)
    assert eng.deepspeed_config(cfg0, 1, torch.float32)["gradient_clipping"] == 0.0
    assert eng.deepspeed_config(cfg1, 1, torch.float32)["gradient_clipping"] == 0.5



@pytest.mark.parametrize("stage", [1, 2])
def test_zero_1_and_2_keep_deepspeeds_clipping_which_counts_experts(tmp_path, dtype, stage):
    """At ZeRO 1/2 DeepSpeed clips (the gradients live in its partitions); its norm there is
    the global one, experts included. (Its optimizer steps one parameter group at a time, so
    the gradients of all steps are compared.)"""
    moe = {"num_experts": 4, "top_k": 2}
    free, _ = _first_step_grads(small_cfg(tmp_path, moe=moe, optim={
        "lr": 3e-3, "grad_clip": 0.0, "zero_stage": stage}))
    norm = math.sqrt(sum(float(g.pow(2).sum()) for g in free))
    clipped, _ = _first_step_grads(small_cfg(tmp_path, moe=moe, optim={
        "lr": 3e-3, "grad_clip": norm / 4, "zero_stage": stage}))
    ratio = math.sqrt(sum(float(g.pow(2).sum()) for g in clipped)) / norm
    assert ratio == pytest.approx(0.25, rel=1e-5)

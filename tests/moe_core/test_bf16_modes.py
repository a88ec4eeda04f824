"""``optim.bf16_mode``: how a bf16 run keeps its weights and optimizer. ``deepspeed`` (DeepSpeed's
wrapper for the stage: at ZeRO 0 ``FP16_UnfusedOptimizer``, the behaviour before the option),
``bf16_optimizer`` (DeepSpeed's ``BF16_Optimizer``: ZeRO 1, fp32 gradient accumulation) and
``torch_autocast`` (fp32 weights, bf16 compute, a fused torch AdamW). Run on CPU: only the
dtype choice is forced; DeepSpeed builds its real optimizers."""

import math

import pytest
import torch
from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

from moe_core.errors import ConfigError
from moe_core.train import Trainer
from moe_core.train import engine as eng
from moe_core.train.audit import audit

from .test_grad_clip import _first_step_grads
from .test_train import small_cfg

MOE = {"num_experts": 4, "top_k": 2}


@pytest.fixture
def bf16(monkeypatch):  # a bf16-capable CUDA device's rule: bf16 unless fp32 is asked for
    monkeypatch.setattr(eng, "pick_dtype", lambda cfg_dtype, device: (
        torch.float32 if cfg_dtype == "fp32" else torch.bfloat16))


@pytest.mark.parametrize("mode,stage,want", [
    ("auto", 0, "torch_autocast"), ("auto", 1, "bf16_optimizer"), ("auto", 2, "deepspeed"),
    ("deepspeed", 1, "deepspeed"), ("torch_autocast", 0, "torch_autocast"),
    ("torch_autocast", 2, "torch_autocast"), ("bf16_optimizer", 1, "bf16_optimizer")])
def test_mode_resolution_and_deepspeed_config(tmp_path, mode, stage, want):
    cfg = small_cfg(tmp_path, optim={"lr": 3e-3, "zero_stage": stage, "bf16_mode": mode})
    assert eng.bf16_mode(cfg, torch.float32) is None  # fp32 runs: no mode, config unchanged
    fp32 = eng.deepspeed_config(cfg, 1, torch.float32)
    assert not {"bf16", "torch_autocast", "data_types"} & fp32.keys()
    assert eng.bf16_mode(cfg, torch.bfloat16) == want
    ds = eng.deepspeed_config(cfg, 1, torch.bfloat16)
    assert ("bf16" in ds) is (want != "torch_autocast")
    assert ds.get("data_types") == ({"grad_accum_dtype": "fp32"} if want == "bf16_optimizer"
                                    else None)
    assert ds.get("torch_autocast") == ({"enabled": True, "dtype": "bfloat16"}
                                        if want == "torch_autocast" else None)
    assert eng.param_dtype(cfg, torch.bfloat16) == (
        torch.float32 if want == "torch_autocast" else torch.bfloat16)


@pytest.mark.parametrize("stage", [0, 2])
def test_bf16_optimizer_needs_zero_1(tmp_path, stage):
    with pytest.raises(ConfigError, match=r"optim.bf16_mode=bf16_optimizer needs "
                                          r"optim.zero_stage=1.*set optim.zero_stage: 1"):
        small_cfg(tmp_path, optim={"zero_stage": stage, "bf16_mode": "bf16_optimizer"})
    with pytest.raises(ConfigError, match="optim.bf16_mode='fp16' must be"):
        small_cfg(tmp_path, optim={"bf16_mode": "fp16"})


@pytest.mark.parametrize("mode,stage,cls,weights", [
    ("deepspeed", 0, FP16_UnfusedOptimizer, torch.bfloat16),
    ("bf16_optimizer", 1, BF16_Optimizer, torch.bfloat16),
    ("torch_autocast", 0, torch.optim.AdamW, torch.float32)])
def test_each_mode_builds_its_optimizer_and_learns(tmp_path, bf16, mode, stage, cls, weights):
    cfg = small_cfg(tmp_path, moe=MOE, optim={"lr": 3e-3, "zero_stage": stage,
                                              "bf16_mode": mode})
    t = Trainer(cfg)
    assert type(t.optimizer) is cls
    assert next(t.model.parameters()).dtype == weights
    assert audit(t)["optim.bf16_mode"] == (mode, mode)  # the knob audit reads the mode back
    if mode == "torch_autocast":  # one fused kernel, step counters on the device
        assert all(g["fused"] for g in t.optimizer.param_groups)
    first = t.step().train_loss
    losses = [t.step().train_loss for _ in range(5)]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < first
    m = t.evaluate()
    assert math.isfinite(m["val_loss"]) and m["val_loss"] < 3.7  # ln 32 = 3.47 at the start


def test_autocast_trains_in_bf16_with_fp32_weights_and_gradients(tmp_path, bf16):
    """torch_autocast: the GEMMs run in bf16 (the loss differs from the fp32 run's), the
    weights and their gradients stay fp32 (accumulated in fp32 across micro-batches)."""
    cfg = small_cfg(tmp_path, optim={"lr": 3e-3, "bf16_mode": "torch_autocast"})
    t = Trainer(cfg)
    seen = []
    t.optimizer.register_step_pre_hook(lambda opt, a, k: seen.append(
        {p.grad.dtype for g in opt.param_groups for p in g["params"]}))
    ac = t.step().train_loss
    assert seen == [{torch.float32}]
    fp32 = Trainer(small_cfg(tmp_path, optim={"lr": 3e-3, "dtype": "fp32"})).step().train_loss
    assert ac != fp32 and ac == pytest.approx(fp32, rel=2e-2)


def test_bf16_optimizer_clips_by_the_global_norm_experts_included(tmp_path, bf16):
    """BF16_Optimizer (ZeRO 1) clips itself; its MoE norm path counts every expert once."""
    optim = {"lr": 3e-3, "zero_stage": 1, "bf16_mode": "bf16_optimizer"}
    free, _ = _first_step_grads(small_cfg(tmp_path, moe=MOE, optim={**optim, "grad_clip": 0.0}))
    norm = math.sqrt(sum(float(g.pow(2).sum()) for g in free))
    clipped, _ = _first_step_grads(small_cfg(tmp_path, moe=MOE,
                                             optim={**optim, "grad_clip": norm / 4}))
    ratio = math.sqrt(sum(float(g.pow(2).sum()) for g in clipped)) / norm
    assert ratio == pytest.approx(0.25, rel=1e-5)


def test_router_stays_fp32_under_torch_autocast(tmp_path, bf16):
    cfg = small_cfg(tmp_path, moe=MOE, optim={"lr": 3e-3, "bf16_mode": "torch_autocast"})
    t = Trainer(cfg)
    layer = t.model.moe_layers()[0]
    x = torch.randn(8, t.model.config.d_model)
    with eng.autocast(cfg, torch.bfloat16, x.device):
        assert layer.router_logits(x).dtype == torch.float32


def test_experts_run_in_the_autocast_dtype_from_fp32_weights(tmp_path, bf16):
    """Under torch_autocast the expert rows and weights are cast to bf16 at the expert call
    (the grouped GEMM's bf16 path on CUDA, no fp32 fallback); the weights' gradients stay
    fp32."""
    import moe_core.moe.layer as layer_mod

    cfg = small_cfg(tmp_path, moe=MOE, optim={"lr": 3e-3, "bf16_mode": "torch_autocast"})
    layer = Trainer(cfg).model.moe_layers()[0]
    x = torch.randn(6, layer.w_gate.shape[1])
    counts = torch.tensor([2, 1, 0, 3])
    with eng.autocast(cfg, torch.bfloat16, x.device):
        y = layer._experts(x, counts, torch.ones(6))
    assert y.dtype == torch.bfloat16 and layer.w_gate.dtype == torch.float32
    y.float().sum().backward()
    assert layer.w_gate.grad.dtype == torch.float32 and layer.w_gate.grad.abs().sum() > 0
    assert layer_mod._autocast_dtype(x) is None  # outside autocast: nothing is cast


def test_auto_losses_equal_the_previous_default_within_tolerance(tmp_path, bf16):
    """``auto`` at ZeRO 0 became ``torch_autocast`` (1 host sync a step, not one per
    parameter): its losses stay within 1 % of DeepSpeed's bf16 wrapper's (the default before)
    over 4 steps of an E4 top-2 model. fp32 runs (the CPU default) have no bf16 mode at all."""
    runs = {}
    for mode in ("auto", "deepspeed"):
        t = Trainer(small_cfg(tmp_path, moe=MOE, optim={"lr": 3e-3, "bf16_mode": mode}))
        runs[mode] = [t.step().train_loss for _ in range(4)]
    assert runs["auto"] != runs["deepspeed"]  # two bf16 paths, not one
    assert runs["auto"] == pytest.approx(runs["deepspeed"], rel=1e-2), runs

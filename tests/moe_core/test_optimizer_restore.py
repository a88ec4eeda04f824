"""Restoring optimizer state into every optimizer class DeepSpeed can hand back, and bf16 resume
and WSD branches through DeepSpeed's bf16 optimizer wrappers (run on CPU: only the dtype choice
is forced; DeepSpeed builds its real bf16 optimizer)."""

import dataclasses
import inspect

import pytest
import torch
from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer
from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

from moe_core.schedules import Phase
from moe_core.train import Trainer
from moe_core.train import engine as eng
from moe_core.train.wsd import train_stable

from .test_train import _equal, fit, small_cfg


def _stub(cls, monkeypatch):
    """An instance of DeepSpeed's real class whose ``load_state_dict`` binds its arguments to
    the real signature (a TypeError exactly where DeepSpeed's would raise one) and records
    them."""
    sig = inspect.signature(cls.load_state_dict)
    calls = []

    def record(self, *args, **kwargs):
        calls.append(sig.bind(self, *args, **kwargs).arguments)

    monkeypatch.setattr(cls, "load_state_dict", record)
    return object.__new__(cls), calls


@pytest.mark.parametrize("cls", [FP16_UnfusedOptimizer, FP16_Optimizer])
def test_fp16_wrappers_get_one_state_dict(cls, monkeypatch):
    opt, calls = _stub(cls, monkeypatch)
    state = {"cur_scale": 1.0}
    eng.load_optimizer(opt, state, rank=0, world=1)
    (args,) = calls
    assert args["state_dict"] is state and args.get("load_optimizer_states", True) is True
    assert "load_from_fp32_weights" not in inspect.signature(cls.load_state_dict).parameters


@pytest.mark.parametrize("cls", [DeepSpeedZeroOptimizer, BF16_Optimizer])
@pytest.mark.parametrize("rank,world", [(0, 1), (1, 2), (2, 4)])
def test_zero_and_bf16_optimizers_get_a_per_rank_list(cls, rank, world, monkeypatch):
    opt, calls = _stub(cls, monkeypatch)
    state = {"ds_version": "0.19.8"}
    eng.load_optimizer(opt, state, rank=rank, world=world)
    (args,) = calls
    lst = args["state_dict_list"]
    assert len(lst) == world and lst[rank] is state
    assert sum(s is not None for s in lst) == 1
    assert args["load_from_fp32_weights"] is True and args["load_optimizer_states"] is True


def test_torch_optimizer_and_unknown_classes():
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.AdamW([p], lr=0.1)
    p.grad = torch.ones(2)
    opt.step()
    other = torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    eng.load_optimizer(other, opt.state_dict(), rank=0, world=1)
    assert torch.equal(other.state_dict()["state"][0]["exp_avg"],
                       opt.state_dict()["state"][0]["exp_avg"])
    with pytest.raises(TypeError, match="knows no such optimizer class"):
        eng.load_optimizer(object(), {}, rank=0, world=1)


def test_the_old_call_fails_on_the_unfused_wrapper():
    """The defect: ZeRO's keyword given to the ZeRO-0 bf16 wrapper."""
    sig = inspect.signature(FP16_UnfusedOptimizer.load_state_dict)
    with pytest.raises(TypeError):
        sig.bind(None, [{}], load_from_fp32_weights=True)


@pytest.fixture
def bf16(monkeypatch):
    """Train in bf16 on CPU: DeepSpeed then wraps AdamW in its bf16 optimizers as on CUDA."""
    monkeypatch.setattr(eng, "pick_dtype", lambda cfg_dtype, device: torch.bfloat16)


@pytest.mark.parametrize("stage,mode,cls", [
    (0, "deepspeed", FP16_UnfusedOptimizer),
    pytest.param(1, "deepspeed", DeepSpeedZeroOptimizer, marks=pytest.mark.slow),
    (1, "auto", BF16_Optimizer),
    (0, "torch_autocast", torch.optim.AdamW)])
def test_bf16_resume_equals_uninterrupted(tmp_path, bf16, stage, mode, cls):
    cfg = small_cfg(tmp_path, moe={"num_experts": 4, "top_k": 2,
                                   "router": {"loss_free_rate": 0.01}},
                    optim={"lr": 3e-3, "zero_stage": stage, "bf16_mode": mode})
    full, s_full = fit(cfg)
    killed = Trainer(cfg, out_dir=tmp_path / "ck", checkpoint_steps=[4])
    assert type(killed.optimizer) is cls
    assert next(killed.model.parameters()).dtype == (
        torch.float32 if mode == "torch_autocast" else torch.bfloat16)
    part = killed.fit(until=4)
    rest, s_rest = fit(cfg, resume_from=part.checkpoints[4])
    assert [m["val_loss"] for m in part.curve + rest.curve] == [m["val_loss"]
                                                                 for m in full.curve]
    assert _equal(s_rest, s_full)


@pytest.mark.parametrize("mode", ["deepspeed", "torch_autocast"])  # auto at ZeRO 0: autocast
def test_bf16_branch_equals_single_run(tmp_path, bf16, mode):
    cfg = small_cfg(tmp_path, moe={"num_experts": 4, "top_k": 2},
                    optim={"lr": 3e-3, "bf16_mode": mode})
    s, n = 6, 4
    single, s_single = fit(dataclasses.replace(
        cfg, tokens=(s + n) * cfg.tokens_per_step,
        schedule=dataclasses.replace(cfg.schedule, decay_frac=n / (s + n))))
    stable = train_stable(cfg, tmp_path / "st", [s])
    br, s_br = fit(cfg, resume_from=stable.checkpoints[s], phase=Phase.decay(s, n))
    assert br.val_loss == single.val_loss
    assert _equal(s_br, s_single)


@pytest.mark.parametrize("wrapped", [False, True])
def test_optimizer_state_cuts_into_expert_shards_and_joins_back(tmp_path, monkeypatch, wrapped):
    """``shard_optimizer_state`` then ``join_optimizer_states`` give back the whole state, for
    torch's format (fp32) and for DeepSpeed's bf16 ZeRO-0 wrapper's (its torch state and its
    fp32 master weights): what a checkpoint re-cut for another number of ranks goes through."""
    from moe_core.upcycle import (
        WRAPPED,
        join_optimizer_states,
        optimizer_param_names,
        shard_optimizer_state,
    )

    if wrapped:  # DeepSpeed's ZeRO-0 bf16 wrapper (optim.bf16_mode: deepspeed)
        monkeypatch.setattr(eng, "pick_dtype", lambda cfg_dtype, device: torch.bfloat16)
        monkeypatch.setitem(eng.DEFAULT_BF16_MODE, 0, "deepspeed")
    t = Trainer(small_cfg(tmp_path, moe={"num_experts": 4, "top_k": 2}))
    t.step()
    whole = t.optimizer.state_dict()
    assert (WRAPPED in whole) == wrapped and type(t.optimizer) is (
        FP16_UnfusedOptimizer if wrapped else torch.optim.AdamW)
    names = optimizer_param_names(t.model, t.optimizer)
    parts = [shard_optimizer_state(whole, names, r, 2) for r in range(2)]
    torch_part = parts[1][WRAPPED] if wrapped else parts[1]
    i = names.index("blocks.0.mlp.w_up")
    assert torch_part["state"][i]["exp_avg"].shape[0] == 2  # 4 experts, 2 per rank
    if wrapped:
        flat = [m for g in parts[1]["fp32_groups"] for m in g]
        assert flat[i].shape[0] == 2 and flat[i].dtype == torch.float32
    back = join_optimizer_states(parts, names)

    def same(a, b):
        if isinstance(a, torch.Tensor):
            return torch.equal(a, b)
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return a == b

    assert same(back, whole)

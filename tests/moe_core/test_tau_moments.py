"""Nothing lost at τ (003 §3): a run that replicates its parent's experts starts from the
parent's AdamW state, its expert moments gathered with the experts, and its first step is the
AdamW step a reference computes from those expanded moments."""

from __future__ import annotations

import copy

import pytest
import torch

from moe_core.train import Trainer, train_config_from_dict
from moe_core.upcycle import expand_optimizer_state, optimizer_param_names


def _cfg(tmp_path, **over):
    d = {"name": "t", "seed": 0, "model": {"preset": "debug"},
         "data": {"source": "synthetic", "synthetic_vocab": 32, "synthetic_tokens": 60_000,
                  "seq_len": 32, "cache_dir": str(tmp_path / "cache")},
         "batch": {"global_batch": 8, "micro_batch": 8}, "optim": {"lr": 3e-3},
         "schedule": {"kind": "constant", "warmup_steps": 0},
         "eval": {"every_steps": 100, "batches": 1}, "tokens": 8 * 32 * 6,
         "moe": {"num_experts": 4, "top_k": 2}}
    d.update(over)
    return train_config_from_dict(d)


@pytest.fixture
def parent_and_child(tmp_path):
    pcfg = _cfg(tmp_path, moe={"num_experts": 2, "top_k": 2})
    pt = Trainer(pcfg)
    pt.fit()
    parent = pt.parent_state()
    child = _cfg(tmp_path, parent={"tokens": 8 * 32 * 6, "moe": {"num_experts": 2, "top_k": 2}},
                 upcycle={"method": "expand_experts", "factor": 2,
                          "lr_policy": {"policy": "constant"}})
    return parent, child


def test_child_starts_from_the_expanded_parent_moments(parent_and_child):
    parent, child_cfg = parent_and_child
    t = Trainer(child_cfg, parent=parent)
    assert t.expansion is not None
    names = optimizer_param_names(t.model, t.optimizer)
    want = expand_optimizer_state(parent.optimizer_state, t.expansion, param_names=names)
    got = t.optimizer.state_dict()
    for pid, entry in want["state"].items():
        for k, v in entry.items():
            assert torch.equal(got["state"][pid][k], v), (names[pid], k)
    # an expert weight's replicas carry their source's moments, and the step count goes on
    i = names.index("blocks.0.mlp.w_gate")
    src = t.expansion.index(0)
    pstate = parent.optimizer_state["state"][i]["exp_avg"]
    assert torch.equal(got["state"][i]["exp_avg"], pstate[src])
    assert float(got["state"][i]["step"]) == float(parent.optimizer_state["state"][i]["step"])


def test_first_step_equals_adamw_from_the_expanded_moments(parent_and_child):
    parent, child_cfg = parent_and_child
    t = Trainer(child_cfg, parent=parent)
    # reference: the same model and batch, torch's AdamW loaded with the expanded moments,
    # DeepSpeed's gradient clipping (1.0) by hand
    ref_model = copy.deepcopy(t.model)
    groups = [{"params": [dict(ref_model.named_parameters())[n] for n in
                          (optimizer_param_names(t.model, t.optimizer)[j] for j in g["params"])],
               **{k: v for k, v in g.items() if k != "params"}}
              for g in t.optimizer.state_dict()["param_groups"]]
    ref_opt = torch.optim.AdamW(groups, lr=t.plan.lr(0))
    ref_opt.load_state_dict(copy.deepcopy(t.optimizer.state_dict()))
    x, y = t.batcher.batch(0, 0)
    out = ref_model(x, y)
    (out.loss + out.aux_loss).backward()
    torch.nn.utils.clip_grad_norm_(ref_model.parameters(), child_cfg.optim.grad_clip)
    ref_opt.step()
    t.step()
    for (n, a), b in zip(t.model.named_parameters(), ref_model.parameters()):
        assert torch.allclose(a, b, rtol=0, atol=1e-6), n
    # and it is not what a fresh AdamW would have done
    fresh = Trainer(child_cfg, parent=type(parent)(**{**vars(parent), "optimizer_state": None}))
    fresh.step()
    w = "blocks.0.mlp.w_gate"
    assert not torch.allclose(dict(fresh.model.named_parameters())[w],
                              dict(t.model.named_parameters())[w], atol=1e-6)


def test_bf16_child_continues_the_bf16_parents_moments_and_fp32_masters(tmp_path, monkeypatch):
    """In bf16 (DeepSpeed's ZeRO-0 wrapper, as on CUDA) the parent's state is the wrapper's:
    its AdamW moments and its fp32 master weights are expanded with the experts, so replicas
    start from their source's moments and from its fp32 (not bf16-rounded) weights. Before,
    such a run started with a fresh AdamW."""
    from moe_core.train import engine as eng
    from moe_core.upcycle import WRAPPED

    monkeypatch.setattr(eng, "pick_dtype", lambda cfg_dtype, device: torch.bfloat16)
    monkeypatch.setitem(eng.DEFAULT_BF16_MODE, 0, "deepspeed")  # the wrapper's fp32 masters
    pt = Trainer(_cfg(tmp_path, moe={"num_experts": 2, "top_k": 2}))
    pt.fit()
    parent = pt.parent_state()
    assert WRAPPED in parent.optimizer_state
    child = _cfg(tmp_path, parent={"tokens": 8 * 32 * 6, "moe": {"num_experts": 2, "top_k": 2}},
                 upcycle={"method": "expand_experts", "factor": 2,
                          "lr_policy": {"policy": "constant"}})
    t = Trainer(child, parent=parent)
    got = t.optimizer.state_dict()
    names = optimizer_param_names(t.model, t.optimizer)
    i = names.index("blocks.0.mlp.w_gate")
    src = t.expansion.index(0)
    p_inner = parent.optimizer_state[WRAPPED]["state"][i]
    assert torch.equal(got[WRAPPED]["state"][i]["exp_avg"], p_inner["exp_avg"][src])
    assert float(got[WRAPPED]["state"][i]["step"]) == float(p_inner["step"])
    masters = [m for g in got["fp32_groups"] for m in g]
    p_masters = [m for g in parent.optimizer_state["fp32_groups"] for m in g]
    assert masters[i].dtype == torch.float32
    assert torch.equal(masters[i], p_masters[i][src])
    # the fp32 masters carry more than the bf16 weights do
    assert not torch.equal(masters[i], masters[i].bfloat16().float())

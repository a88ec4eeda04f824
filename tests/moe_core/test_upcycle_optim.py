"""AdamW moments are expanded with the same replication map as the experts, so a run resumed
after the transition τ continues consistently."""

import numpy as np
import pytest
import torch

from moe_core import build_model
from moe_core.config import ModelConfig, MoEConfig
from moe_core.errors import ConfigError
from moe_core.upcycle import (
    expand_experts,
    expand_optimizer_state,
    optimizer_param_names,
    shard_optimizer_state,
)
from tests.hf_util import train_steps

EXPERT_KEYS = ("w_gate", "w_up", "w_down", "router.weight")


def trained():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=40, n_layer=2, d_model=32, n_head=2, d_ff=64, init_std=0.1,
                      max_seq_len=32, moe=MoEConfig(num_experts=4, top_k=2, interleave=2))
    m = build_model(cfg)
    decay = [p for p in m.parameters() if p.ndim >= 2]
    no_decay = [p for p in m.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-3)
    return train_steps(m, opt, 40), opt


def _param(model, name):
    return dict(model.named_parameters())[name]


@pytest.mark.parametrize("strategy", ["uniform", "grad_norm"])
def test_torch_state_dict_expands_and_loads(strategy):
    m, opt = trained()
    batch = torch.randint(0, 40, (4, 17), generator=torch.Generator().manual_seed(1))
    new, emap = expand_experts(m, 2, strategy=strategy, batch=batch, return_map=True)
    names = optimizer_param_names(m, opt)
    src_state = opt.state_dict()
    snapshot = {k: {n: t.clone() for n, t in v.items()} for k, v in src_state["state"].items()}
    st = expand_optimizer_state(src_state, emap, param_names=names)
    # Same grouping over the new model (parameter order is the source's).
    decay = [p for p in new.parameters() if p.ndim >= 2]
    no_decay = [p for p in new.parameters() if p.ndim < 2]
    opt2 = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": no_decay, "weight_decay": 0.0}], lr=1e-3)
    assert optimizer_param_names(new, opt2) == names
    opt2.load_state_dict(st)
    by_name = dict(zip(names, range(len(names))))
    for key in EXPERT_KEYS:
        name = f"blocks.1.mlp.{key}"
        s_old, s_new = src_state["state"][by_name[name]], opt2.state_dict()["state"][by_name[name]]
        assert s_new["exp_avg"].shape[0] == 8
        for j, s in enumerate(emap.sources[1]):  # every replica starts with its source's moments
            assert torch.equal(s_new["exp_avg"][j], s_old["exp_avg"][s])
            assert torch.equal(s_new["exp_avg_sq"][j], s_old["exp_avg_sq"][s])
        assert float(s_new["step"]) == float(s_old["step"]) == 3
    other = by_name["blocks.0.mlp.w_up"]  # a dense layer: untouched
    assert torch.equal(opt2.state_dict()["state"][other]["exp_avg"],
                       src_state["state"][other]["exp_avg"])
    # the input state is not modified and a step runs
    assert all(torch.equal(t, snapshot[k][n]) for k, v in src_state["state"].items()
               for n, t in v.items())
    x = torch.randint(0, 40, (2, 9))
    out = new(x[:, :-1], x[:, 1:])
    out.loss.backward()
    opt2.step()


def test_resumed_step_treats_replicas_like_sources():
    """Uniform copies with copied moments and equal gradients take identical AdamW steps: with
    identical router rows and no bias noise, a replica and its source receive the same update
    whenever they are routed the same tokens (here: K = 2 picks both copies of one source)."""
    m, opt = trained()
    new, emap = expand_experts(m, 2, return_map=True)
    st = expand_optimizer_state(opt.state_dict(), emap, param_names=optimizer_param_names(m, opt))
    decay = [p for p in new.parameters() if p.ndim >= 2]
    no_decay = [p for p in new.parameters() if p.ndim < 2]
    opt2 = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": no_decay, "weight_decay": 0.0}], lr=1e-3)
    opt2.load_state_dict(st)
    x = torch.randint(0, 40, (4, 17), generator=torch.Generator().manual_seed(2))
    out = new(x[:, :-1], x[:, 1:])
    out.loss.backward()  # aux loss left out: it is not symmetric in copies with ties broken
    opt2.step()
    layer = new.blocks[1].mlp
    for j in range(4, 8):
        s = emap.sources[1][j]
        assert torch.allclose(layer.w_up[j], layer.w_up[s], atol=1e-7)


def test_name_keyed_state_with_numpy_and_prefix():
    m, opt = trained()
    _, emap = expand_experts(m, 2, return_map=True)
    names = optimizer_param_names(m, opt)
    sd = opt.state_dict()["state"]
    keyed = {"module." + n: {k: (v.numpy() if v.ndim else float(v)) for k, v in sd[i].items()}
             for i, n in enumerate(names)}
    out = expand_optimizer_state(keyed, emap)
    a = out["module.blocks.1.mlp.router.weight"]["exp_avg"]
    b = keyed["module.blocks.1.mlp.router.weight"]["exp_avg"]
    assert isinstance(a, np.ndarray) and a.shape == (8, 32)
    assert np.array_equal(a, b[list(emap.sources[1])])
    assert out["module.tok_emb.weight"]["exp_avg"] is not keyed["module.tok_emb.weight"]["exp_avg"]


def test_torch_state_needs_names():
    m, opt = trained()
    _, emap = expand_experts(m, 2, return_map=True)
    with pytest.raises(ConfigError, match="needs param_names"):
        expand_optimizer_state(opt.state_dict(), emap)


@pytest.mark.parametrize("rank", [0, 1])
def test_shard_optimizer_state_cuts_expert_moments_like_the_weights(rank):
    """An expert-parallel rank gets its slice of each expert weight's moments (the slice
    ``MoELayer.shard_experts`` keeps of the weights); the router, the dense layer's 2-D
    ``w_gate`` and the step counts stay whole, and the result loads into an AdamW over the
    sharded model."""
    m, opt = trained()
    names = optimizer_param_names(m, opt)
    full = opt.state_dict()
    got = shard_optimizer_state(full, names, rank, 2)
    shard = build_model(m.config)
    shard.load_state_dict(m.state_dict())
    for layer in shard.moe_layers():
        layer.shard_experts(rank, 2)
    for pid, n in enumerate(names):
        for k, v in full["state"][pid].items():
            expert = n.startswith("blocks.1.mlp.w_") and v.ndim == 3  # E = 4: 2 per rank
            want = v[2 * rank:2 * rank + 2] if expert else v
            assert torch.equal(got["state"][pid][k], want), (n, k)
            assert got["state"][pid][k].shape == (v.shape if k == "step" else
                                                  dict(shard.named_parameters())[n].shape)
    assert got["state"][names.index("blocks.0.mlp.w_gate")]["exp_avg"].ndim == 2  # dense: whole
    decay = [p for p in shard.parameters() if p.ndim >= 2]
    no_decay = [p for p in shard.parameters() if p.ndim < 2]
    sharded = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=1e-3)
    sharded.load_state_dict(got)
    assert full["state"][names.index("blocks.1.mlp.w_gate")]["exp_avg"].shape[0] == 4  # not cut

"""Router-health statistics of an eval (moe_core.train.evaluate) and the transition jump."""

import torch

from moe_core import build_model
from moe_core.config import MoEConfig, RouterConfig
from moe_core.presets import model_config
from moe_core.train.evaluate import evaluate


def _model(E=4):
    torch.manual_seed(0)
    cfg = model_config("debug", vocab_size=32, moe=MoEConfig(
        num_experts=E, top_k=1, router=RouterConfig(order="softmax_topk")))
    return build_model(cfg)


def _batches():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 32, (2, 4, 16), generator=g)
    return [(x[i], x[i]) for i in range(2)]


def test_dead_experts_counts_experts_no_token_reached():
    model = _model()
    m = evaluate(model, _batches(), torch.device("cpu"))
    assert m["router.dead_experts"] == 0.0
    with torch.no_grad():  # every router sends every token to expert 0
        for layer in model.moe_layers():
            layer.router.weight.zero_()
            layer.expert_bias[0] = 1.0
    rng = torch.get_rng_state()
    m = evaluate(model, _batches(), torch.device("cpu"))
    assert torch.equal(rng, torch.get_rng_state())  # statistics draw no random numbers
    layers = len(model.moe_layers())
    assert m["router.dead_experts"] == 3.0 * layers  # summed over MoE layers
    assert m["router.max_load"] == 1.0


def test_transition_jump_is_reported_and_survives_a_resume(tmp_path):
    from moe_core.train import Trainer, train_config_from_dict

    d = {"name": "t", "seed": 0, "model": {"preset": "debug"},
         "data": {"source": "synthetic", "synthetic_vocab": 32, "synthetic_tokens": 60_000,
                  "seq_len": 32, "cache_dir": str(tmp_path / "cache")},
         "batch": {"global_batch": 8, "micro_batch": 8}, "optim": {"lr": 3e-3},
         "schedule": {"kind": "wsd", "warmup_steps": 2}, "eval": {"every_steps": 2, "batches": 2},
         "tokens": 8 * 32 * 4}
    parent = Trainer(train_config_from_dict(d))
    parent.fit()
    ps = parent.parent_state()
    child = train_config_from_dict(dict(d, moe={"num_experts": 4, "top_k": 2},
                                        parent={"tokens": 8 * 32 * 4},
                                        upcycle={"method": "dense_to_moe", "virtual_groups": False,
                                                 "weight_scaling": False}))
    t = Trainer(child, parent=ps, out_dir=tmp_path / "ck", checkpoint_steps=[2])
    res = t.fit()
    jump = res.curve[0]["val_loss"] - ps.val_loss
    assert abs(jump) > 1e-3  # without scaling the upcycled function is not the parent's
    assert [m["transition_jump"] for m in res.curve] == [jump] * len(res.curve)
    again = Trainer(child, parent=ps, resume_from=res.checkpoints[2]).fit()
    assert [m["transition_jump"] for m in again.curve] == [jump] * len(again.curve)
    fresh = Trainer(train_config_from_dict(d)).fit()  # no parent: no jump
    assert "transition_jump" not in fresh.curve[0]


def test_one_collapsed_layer_shows_in_the_worst_layer_and_is_hidden_by_the_mean():
    model = _model()
    blocks = [i for i, b in enumerate(model.blocks) if b.is_moe]
    assert len(blocks) >= 2
    healthy = evaluate(model, _batches(), torch.device("cpu"))
    with torch.no_grad():  # only the second MoE layer sends every token to expert 0
        layer = model.moe_layers()[1]
        layer.router.weight.zero_()
        layer.expert_bias[0] = 1.0
    m = evaluate(model, _batches(), torch.device("cpu"))
    E, L = 4, len(blocks)
    collapsed = f"layer{blocks[1]}"
    assert m[f"router.max_load.{collapsed}"] == 1.0
    assert m[f"router.max_vio.{collapsed}"] == E - 1  # MaxVio: one expert takes everything
    assert m[f"router.dead_experts.{collapsed}"] == E - 1
    assert m["router.max_load.worst"] == 1.0 and m["router.max_vio.worst"] == E - 1
    assert m["router.dead_experts.worst"] == E - 1
    # the other layers are as before, and the mean dilutes the collapse
    assert m[f"router.max_load.layer{blocks[0]}"] == healthy[f"router.max_load.layer{blocks[0]}"]
    other = m[f"router.max_load.layer{blocks[0]}"]
    assert abs(m["router.max_load"] - (other * (L - 1) + 1.0) / L) < 1e-9  # the mean
    assert m["router.max_load"] < 0.9 < m["router.max_load.worst"]
    assert m["router.max_vio"] < m["router.max_vio.worst"]
    assert healthy["router.max_load.worst"] < 0.9
    for stat in ("drop_rate", "max1_max2", "expert_similarity"):
        assert {f"router.{stat}.layer{i}" for i in blocks} <= m.keys()
        assert f"router.{stat}.worst" in m

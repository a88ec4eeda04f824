"""Configuration never travels in a state dict: a child trains with its own ``router.aux_coef``
whatever its parent used, read back from the live layers and from the loss; the adapted α^(l)
(002 §4.2) and the selection bias are named state with one rule per method
(``moe_core.moe.named_state.RULES``)."""

from __future__ import annotations

import pytest
import torch

from moe_core import build_model
from moe_core.moe.named_state import METHODS, RULES, load_model_state
from moe_core.train import Trainer, train_config_from_dict
from moe_core.train.callbacks import ParentState
from moe_core.train.init import UPCYCLERS, build_initial_model

PARENT_COEF, CHILD_COEF = 1e-3, 0.1
VOCAB = 32


def _cfg(tmp_path, **over):
    d = {"name": "t", "seed": 0, "model": {"preset": "debug"},
         "data": {"source": "synthetic", "synthetic_vocab": VOCAB, "synthetic_tokens": 20_000,
                  "seq_len": 32, "cache_dir": str(tmp_path / "cache")},
         "batch": {"global_batch": 8, "micro_batch": 8}, "optim": {"lr": 3e-3},
         "schedule": {"kind": "constant", "warmup_steps": 0},
         "eval": {"every_steps": 100, "batches": 1}, "tokens": 8 * 32 * 2,
         "moe": {"num_experts": 4, "top_k": 2, "router": {"aux_coef": CHILD_COEF}}}
    d.update(over)
    return train_config_from_dict(d)


def _parent(tmp_path, adaptive=False, legacy=False):
    """An MoE parent trained at aux_coef 0.001 (its state as a parent hands it over); with
    ``legacy``, as states were written before the rule: ``aux_coef`` in every MoE layer."""
    pcfg = _cfg(tmp_path, moe={"num_experts": 2, "top_k": 2, "router": {
        "aux_coef": PARENT_COEF, "adaptive_aux": adaptive}})
    model = build_model(pcfg.model_config(VOCAB))
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    if legacy:
        state.update({f"blocks.{i}.mlp.aux_coef": torch.tensor(PARENT_COEF).numpy()
                      for i in range(model.config.n_layer)})
    return ParentState(model_state=state, model_config=model.config, peak_lr=3e-3,
                       final_lr=3e-3, tokens=512, val_loss=3.0)


def _child(tmp_path, method, **router):
    """``continue`` states its parent's moe as its own (the config's rule); the parent state
    handed over is still one trained at 0.001, as a Hugging Face parent's or a WSD stable's."""
    up = {"method": method, "lr_policy": {"policy": "constant"}}
    moe = {"num_experts": 2, "top_k": 2, "router": {"aux_coef": CHILD_COEF, **router}}
    if method == "expand_experts":
        up["factor"] = 2
        return _cfg(tmp_path, parent={"tokens": 512, "moe": {"num_experts": 2, "top_k": 2}},
                    upcycle=up, moe={**moe, "num_experts": 4})
    return _cfg(tmp_path, parent={"tokens": 512, "moe": moe}, upcycle=up, moe=moe)


def _coefs(model):
    return [float(m.aux_coef) for m in model.moe_layers()]


def test_an_expand_experts_trial_trains_with_its_own_aux_coef(tmp_path):
    """The bug of issue 38: the parent's 0.001 travelled in its state dict and overrode the
    child's 0.1. Read back from the live layers, the eval row and the loss itself."""
    t = Trainer(_child(tmp_path, "expand_experts"), parent=_parent(tmp_path, legacy=True))
    assert t.expansion is not None and t.model.moe_layers()[0].num_experts == 4
    assert _coefs(t.model) == pytest.approx([CHILD_COEF] * 2, rel=1e-7)
    assert t.evaluate()["router.aux_coef"] == pytest.approx(CHILD_COEF, rel=1e-7)
    # the aux term of the loss scales with the coefficient: 0.1 × its value at coefficient 1
    x, y = t.batcher.batch(0, 0)
    with torch.no_grad():
        aux = float(t.model(x, y).aux_loss)
        for m in t.model.moe_layers():
            m.aux_coef.fill_(1.0)
        unit = float(t.model(x, y).aux_loss)
    assert unit > 0 and aux / unit == pytest.approx(CHILD_COEF, rel=1e-5)


@pytest.mark.parametrize("method", ["continue", "expand_experts"])
@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("legacy", [False, True])
def test_every_upcycler_starts_from_the_childs_coefficient(tmp_path, method, adaptive, legacy):
    parent = _parent(tmp_path, adaptive=adaptive, legacy=legacy)
    if adaptive:  # an adapted α^(l) far from both the parent's and the child's knob
        for k in parent.model_state:
            if k.endswith("mlp.aux_coef"):
                parent.model_state[k] = torch.tensor(0.0077).numpy()
    for child_adaptive in (False, True):
        cfg = _child(tmp_path, method, adaptive_aux=child_adaptive)
        model, _ = build_initial_model(cfg, VOCAB, parent)
        assert _coefs(model) == pytest.approx([CHILD_COEF] * 2, rel=1e-7)
        assert any(k.endswith("aux_coef") for k in model.state_dict()) == child_adaptive


def test_dense_to_moe_child_has_its_coefficient(tmp_path):
    dcfg = _cfg(tmp_path, moe=None)
    dense = build_model(dcfg.model_config(VOCAB))
    parent = ParentState(model_state=dense.state_dict(), model_config=dense.config,
                         peak_lr=3e-3, final_lr=3e-3, tokens=512)
    cfg = _cfg(tmp_path, parent={"tokens": 512, "moe": None},
               upcycle={"method": "dense_to_moe", "lr_policy": {"policy": "constant"}})
    model, _ = build_initial_model(cfg, VOCAB, parent)
    assert _coefs(model) == pytest.approx([CHILD_COEF] * 2, rel=1e-7)
    assert not any(k.endswith("aux_coef") for k in model.state_dict())


def test_resume_restores_an_adapted_coefficient_and_nothing_else(tmp_path):
    """Resume is the one method that carries α^(l): the run's own training state. A
    non-adaptive run takes its config's value even from a state that holds another."""
    cfg = _cfg(tmp_path, moe={"num_experts": 4, "top_k": 2, "router": {
        "aux_coef": CHILD_COEF, "adaptive_aux": True}})
    run = build_model(cfg.model_config(VOCAB))
    for m in run.moe_layers():
        m.aux_coef.fill_(0.0077)
    again = build_model(cfg.model_config(VOCAB))
    load_model_state(again, run.state_dict(), resume=True)
    assert _coefs(again) == pytest.approx([0.0077] * 2, rel=1e-6)
    fresh = build_model(cfg.model_config(VOCAB))
    load_model_state(fresh, run.state_dict(), resume=False)
    assert _coefs(fresh) == pytest.approx([CHILD_COEF] * 2, rel=1e-7)
    plain = build_model(_cfg(tmp_path).model_config(VOCAB))
    load_model_state(plain, run.state_dict(), resume=True)
    assert _coefs(plain) == pytest.approx([CHILD_COEF] * 2, rel=1e-7)
    # any other mismatch is still an error
    with pytest.raises(RuntimeError, match="blocks.0.mlp.expert_bias"):
        load_model_state(plain, {k: v for k, v in run.state_dict().items()
                                 if not k.endswith("expert_bias")}, resume=True)


def test_every_method_has_a_rule_for_every_named_entry():
    assert set(UPCYCLERS) <= set(METHODS)
    for entry, rules in RULES.items():
        assert set(rules) == set(METHODS), entry


def test_the_docs_table_is_the_rules():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "model-and-upcycling.md").read_text()
    for m in METHODS:
        assert f"| `{m}` | {RULES['expert_bias'][m]} | {RULES['aux_coef'][m]} |" in doc, m

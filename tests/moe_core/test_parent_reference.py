"""The dense parent's MLP as the reference of 004 Fig. 6's cosine: built once, in fp32, on the
device of the model's parameters (a reference left on the CPU crashed ``evaluate`` on CUDA)."""

import numpy as np
import pytest
import torch

from moe_core import build_model
from moe_core.config import MoEConfig
from moe_core.train import Trainer
from moe_core.train import engine as eng
from moe_core.train.evaluate import parent_reference_mlp
from moe_core.upcycle import dense_to_moe

from .test_train import small_cfg


def _parent(tmp_path):
    """A dense run's hand-off (no training needed for the reference's contract)."""
    return Trainer(small_cfg(tmp_path)).parent_state()


def _moe_cfg(tmp_path):
    return small_cfg(tmp_path, moe={"num_experts": 4, "top_k": 2}, parent={"tokens": 1024},
                     upcycle={"method": "dense_to_moe"})


def test_reference_follows_the_model_device_and_is_fp32(tmp_path):
    parent = _parent(tmp_path)
    dense = build_model(parent.model_config)
    moe = dense_to_moe(dense, MoEConfig(num_experts=4, top_k=2))
    for model in (moe, moe.to(torch.bfloat16), moe.to("meta")):
        ref = parent_reference_mlp(parent, model)
        dev = next(model.parameters()).device
        assert set(ref) == {0, 1}
        assert all(r.device == dev and r.dtype == torch.float32 for r in ref.values())


def test_trainer_builds_the_reference_on_its_device(tmp_path):
    t = Trainer(_moe_cfg(tmp_path), parent=_parent(tmp_path))
    p = next(t.model.parameters())
    assert t.reference and all(r.device == p.device and r.dtype == torch.float32
                               for r in t.reference.values())
    cos = t.evaluate()["router.cos_to_parent"]
    expect = []  # computed here from the parent's numpy state and the experts' weights
    for i, m in enumerate(t.model.moe_layers()):
        ref = np.concatenate([t.parent.model_state[f"blocks.{i}.mlp.{w}"].ravel()
                              for w in ("w_gate", "w_up", "w_down")]).astype(np.float64)
        v = m.expert_vectors().double().numpy()
        expect.append(np.mean(v @ ref / np.linalg.norm(v, axis=1) / np.linalg.norm(ref)))
    assert cos == pytest.approx(float(np.mean(expect)), rel=1e-9)


def test_bf16_model_keeps_an_fp32_reference(tmp_path, monkeypatch):
    monkeypatch.setattr(eng, "pick_dtype", lambda cfg_dtype, device: torch.bfloat16)
    monkeypatch.setitem(eng.DEFAULT_BF16_MODE, 0, "deepspeed")  # bf16 weights
    t = Trainer(_moe_cfg(tmp_path), parent=_parent(tmp_path))
    assert next(t.model.parameters()).dtype == torch.bfloat16
    assert all(r.dtype == torch.float32 for r in t.reference.values())
    assert 0.9 < t.evaluate()["router.cos_to_parent"] <= 1.0


def test_read_only_parent_arrays_build_the_reference_without_a_warning(tmp_path):
    """A parent from Ray's object store holds read-only numpy arrays (zero-copy): the reference
    is a copy, so torch's "NumPy array is not writable" warning (seen in every trial's log of
    the real-model sweep) is not raised."""
    import warnings

    parent = _parent(tmp_path)
    for a in parent.model_state.values():
        if isinstance(a, np.ndarray):
            a.setflags(write=False)
    moe = dense_to_moe(build_model(parent.model_config), MoEConfig(num_experts=4, top_k=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ref = parent_reference_mlp(parent, moe)
    assert set(ref) == {0, 1}

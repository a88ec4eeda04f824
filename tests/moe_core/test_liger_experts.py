"""``moe.experts_kernel``: liger-kernel's fused MoE in the layer, checked on CPU under the Triton
interpreter (``TRITON_INTERPRET=1``, ``LIGER_FUSED_MOE_AUTOTUNE=0``) against torch's path (the
per-expert loop and ``torch._grouped_mm``): output and the gradient of every parameter, the
router's (through the routing weights) included; ``auto``'s per-shape selection on hand-written
tables; ``auto`` with nothing measured is today's path bit for bit; the one-line errors."""

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import moe_core.moe.layer as layer_mod
from moe_core.config import MoEConfig
from moe_core.errors import ConfigError
from moe_core.moe import kernel_choice as kc
from moe_core.moe.layer import MoELayer

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
RUNS_HERE = torch.cuda.is_available() or INTERPRETED
"""Triton reads ``TRITON_INTERPRET`` when a kernel is defined, so on a CPU the liger cases run
in a child pytest started with it (``test_liger_cases_under_the_triton_interpreter``)."""
NO_LIGER = "liger-kernel and triton are not installed (pip install -e '.[dev]' brings both)"
needs_liger = pytest.mark.skipif(
    not kc.liger_available() or not RUNS_HERE,
    reason=NO_LIGER if not kc.liger_available() else
    "no CUDA: run in a child process under TRITON_INTERPRET=1 by "
    "test_liger_cases_under_the_triton_interpreter")
LIGER_TESTS = ("test_liger_layer_matches_torch_experts", "test_liger_selected_and_run_by_the_layer")
LIGER_CASES = 7  # the cases of LIGER_TESTS (6 parametrised + 1), all under needs_liger


def _dev():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def _run(layer, x, gy):
    layer.zero_grad()
    xx = x.clone().requires_grad_()
    y, aux = layer(xx)
    (y * gy).sum().backward()  # the output only: the router's gradient comes from the weights
    return y.detach(), aux.detach(), xx.grad, {n: p.grad.clone() for n, p in
                                                layer.named_parameters()}


@needs_liger
@pytest.mark.parametrize("E,cf,shared", [(4, None, 0), (8, None, 1), (8, 0.5, 0)])
@pytest.mark.parametrize("grouped", [False, True])
def test_liger_layer_matches_torch_experts(E, cf, shared, grouped, monkeypatch):
    """d 32, f 16, K 2, fp32: output, dx and every parameter's gradient (router included)."""
    monkeypatch.setattr(layer_mod, "GROUPED_MM", grouped)
    torch.manual_seed(E)
    cfg = MoEConfig(num_experts=E, top_k=2, expert_d_ff=16, capacity_factor=cf,
                    num_shared_experts=shared)
    ref = MoELayer(32, 64, cfg, init_std=0.1).to(_dev())
    with torch.no_grad():
        ref.router.weight[0] += 0.3  # skewed, so that a capacity really drops
    got = copy.deepcopy(ref)
    got.experts_kernel = "liger"
    x = torch.randn(2, 24, 32, device=_dev())
    gy = torch.randn_like(x)
    a, b = _run(ref, x, gy), _run(got, x, gy)
    assert rel(b[0], a[0]) < 1e-5 and torch.equal(b[1], a[1])
    assert rel(b[2], a[2]) < 1e-5
    assert set(b[3]) == set(a[3]) and "router.weight" in a[3]
    for n in a[3]:
        assert rel(b[3][n], a[3][n]) < 1e-5, n
    assert a[3]["router.weight"].abs().sum() > 0  # the routing weights carry a gradient
    if cf is not None:
        assert got.drop_accum[0] > 0


@needs_liger
def test_liger_selected_and_run_by_the_layer():
    """``experts_kernel: liger`` resolves to liger where it runs, and the forward takes it."""
    layer = MoELayer(32, 64, MoEConfig(num_experts=4, top_k=2, expert_d_ff=16,
                                       experts_kernel="liger"), init_std=0.1).to(_dev())
    assert layer.select_experts_kernel(_dev(), torch.float32) == "liger"
    calls = []
    orig = layer_mod.liger_experts
    try:
        layer_mod.liger_experts = lambda *a: calls.append(1) or orig(*a)
        layer(torch.randn(8, 32, device=_dev()))
    finally:
        layer_mod.liger_experts = orig
    assert calls == [1]


def _entry(device="H100", dtype="bfloat16", E=64, K=8, d=2048, f=1024, choice="liger"):
    g, li = (1.0, 0.5) if choice == "liger" else (0.5, 1.0)
    return {"device": device, "dtype": dtype, "E": E, "K": K, "d": d, "f": f,
            "grouped_s": g, "liger_s": li, "choice": choice, "date": "2026-11-25"}


H100 = "NVIDIA H100 80GB HBM3"


def test_choose_takes_the_nearest_measured_shape_on_the_same_device_class():
    table = [_entry(E=64, f=1024, choice="liger"), _entry(E=128, f=768, choice="grouped")]
    kw = dict(device_name=H100, dtype="bfloat16", K=8, d=2048)
    assert kc.choose(table, E=64, f=1024, **kw) == "liger"  # measured exactly
    assert kc.choose(table, E=128, f=768, **kw) == "grouped"
    assert kc.choose(table, E=64, f=896, **kw) == "liger"  # log2 distances 0.19 vs 1.22
    assert kc.choose(table, E=128, f=1024, **kw) == "grouped"  # 1.0 vs 0.415
    # nothing within a factor 2 in every dimension: grouped
    assert kc.choose(table, E=16, f=1024, **kw) == "grouped"
    assert kc.choose(table, E=64, f=1024, **{**kw, "d": 8192}) == "grouped"
    # another dtype or another device class: not measured, grouped
    assert kc.choose(table, E=64, f=1024, **{**kw, "dtype": "float32"}) == "grouped"
    assert kc.choose(table, E=64, f=1024, **{**kw, "device_name": "NVIDIA A100-SXM4-80GB"}) \
        == "grouped"
    assert kc.choose([], E=64, f=1024, **kw) == "grouped"


def test_choose_prefers_the_device_class_to_cuda_entries_and_breaks_ties_to_grouped():
    kw = dict(device_name=H100, dtype="bfloat16", E=64, K=8, d=2048, f=1024)
    generic = _entry(device="cuda", choice="grouped")
    assert kc.choose([generic], **kw) == "grouped"
    assert kc.choose([_entry(device="cuda")], **{**kw, "device_name": "NVIDIA L4"}) == "liger"
    # an H100 entry further away still wins over the exact cuda one
    assert kc.choose([generic, _entry(f=768)], **kw) == "liger"
    # two entries at the same distance (f 512 and f 2048 from 1024): grouped
    tie = [_entry(f=512, choice="liger"), _entry(f=2048, choice="grouped")]
    assert kc.choose(tie, **kw) == "grouped"


def test_device_class_and_matching():
    assert kc.device_class(H100) == "H100"
    assert kc.device_class("NVIDIA A100-SXM4-80GB") == "A100"
    assert kc.device_class("NVIDIA L40S") == "L40S"
    assert kc.matches("H100", "NVIDIA H100 PCIe") and kc.matches("h100", H100)
    assert not kc.matches("H10", H100) and not kc.matches("H100", "NVIDIA H200")
    assert kc.matches("cuda", "NVIDIA H200")


def test_merge_replaces_the_same_key_and_load_checks_entries(tmp_path):
    old = [_entry(choice="grouped"), _entry(E=128, f=768)]
    new = kc.merge(old, [_entry(device="h100")])
    assert len(new) == 2 and [e["choice"] for e in new] == ["liger", "liger"]
    p = tmp_path / "t.json"
    kc.write_table(p, new)
    assert kc.load_table(p) == new
    bad = _entry()
    bad["choice"] = "grouped"  # not the faster one
    kc.write_table(p, [bad])
    with pytest.raises(ConfigError, match=r"t.json: entry 0 has a choice that is not the faster"):
        kc.load_table(p)
    with pytest.raises(ConfigError, match="lacks date"):
        kc.merge([], [{k: v for k, v in _entry().items() if k != "date"}])


def test_the_committed_table_loads():
    for e in kc.load_table():  # empty until a GPU session records its figures
        assert e["device"].lower() != "cpu"


def test_pick(monkeypatch):
    shape = dict(device_name=H100, dtype="bfloat16", E=64, K=8, d=2048, f=1024)
    table = [_entry()]
    monkeypatch.setattr(kc, "liger_available", lambda: True)
    assert kc.pick("auto", device_type="cuda", entries=table, **shape) == "liger"
    assert kc.pick("auto", device_type="cuda", entries=table, ep_size=2, **shape) == "grouped"
    assert kc.pick("auto", device_type="cpu", entries=table, **shape) == "grouped"
    assert kc.pick("grouped", device_type="cuda", entries=table, **shape) == "grouped"
    assert kc.pick("liger", device_type="cuda", **shape) == "liger"
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ConfigError, match=r"^moe.experts_kernel=liger needs liger-kernel .*"
                                          r"this run is on cpu.*set moe.experts_kernel: auto$"):
        kc.pick("liger", device_type="cpu", **shape)
    with pytest.raises(ConfigError, match="moe.experts_kernel=liger does not run with expert"):
        kc.pick("liger", device_type="cuda", ep_size=2, **shape)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert kc.pick("liger", device_type="cpu", **shape) == "liger"  # the interpreter (tests)
    monkeypatch.setattr(kc, "liger_available", lambda: False)
    assert kc.pick("auto", device_type="cuda", entries=table, **shape) == "grouped"
    with pytest.raises(ConfigError, match=r"pip install -e '.\[gpu\]'"):
        kc.pick("liger", device_type="cuda", **shape)


def test_auto_on_cuda_with_the_committed_table_is_grouped(monkeypatch):
    """Nothing is measured on a GPU yet: ``auto`` takes torch's path at every shape."""
    monkeypatch.setattr(kc, "liger_available", lambda: True)
    if not kc.load_table():
        for E, f in ((8, 1408), (64, 1024), (128, 768)):
            assert kc.pick("auto", device_type="cuda", device_name=H100, dtype="bfloat16",
                           E=E, K=8, d=2048, f=f) == "grouped"


@pytest.mark.parametrize("path", ["cpu", "cuda"])
@pytest.mark.parametrize("cf", [None, 1.0])
def test_auto_is_the_old_path_bit_for_bit(path, cf, monkeypatch):
    """``auto`` resolved on this CPU computes what the layer computed before the knob: the
    forward of test_moe_forward_unchanged's reference, outputs and gradients bit for bit."""
    from .test_moe_forward_unchanged import _grads, old_forward

    grouped = atomic_free = path == "cuda"
    monkeypatch.setattr(layer_mod, "GROUPED_MM", grouped)
    monkeypatch.setattr(layer_mod, "ATOMIC_FREE", atomic_free)
    torch.manual_seed(1)
    new = MoELayer(32, 64, MoEConfig(num_experts=8, top_k=2, capacity_factor=cf), init_std=0.05)
    assert new.cfg.experts_kernel == "auto"
    assert new.select_experts_kernel(torch.device("cpu"), torch.float32) == "grouped"
    old = copy.deepcopy(new)
    x = torch.randn(2, 24, 32)
    y1, a1, dx1, g1 = _grads(new, x, lambda m, v: m(v))
    y0, a0, dx0, g0 = _grads(old, x, lambda m, v: old_forward(m, v, grouped, atomic_free))
    assert torch.equal(y1, y0) and torch.equal(a1, a0) and torch.equal(dx1, dx0)
    for n in g0:
        assert torch.equal(g1[n], g0[n]), n


@pytest.mark.parametrize("value", ["fast", "Liger", None, 1])
def test_config_key_validated(value):
    with pytest.raises(ConfigError, match=r"moe.experts_kernel"):
        MoEConfig(experts_kernel=value)


def test_yaml_key_validated_and_not_part_of_the_parents_identity(tmp_path):
    from moe_core.train.keys import parent_key

    from .test_train import small_cfg

    with pytest.raises(ConfigError, match=r"moe.experts_kernel='x'.*use auto, grouped or liger"):
        small_cfg(tmp_path, moe={"num_experts": 4, "experts_kernel": "x"})
    keys = set()
    for k in ("auto", "grouped", "liger"):
        m = {"num_experts": 4, "top_k": 2, "experts_kernel": k}
        cfg = small_cfg(tmp_path, moe=m, parent={"tokens": 2048, "moe": m},
                        upcycle={"method": "continue"})
        assert cfg.moe.experts_kernel == k
        keys.add(parent_key(cfg))
    assert len(keys) == 1
    # a continue run whose parent differs only in the kernel is the same model
    small_cfg(tmp_path, moe={"num_experts": 4, "experts_kernel": "liger"},
              parent={"tokens": 2048, "moe": {"num_experts": 4}}, upcycle={"method": "continue"})


def test_trainer_refuses_liger_where_it_cannot_run(tmp_path, monkeypatch):
    """At set-up, before any step: one line naming the key and the fix."""
    from moe_core.train import Trainer

    from .test_train import small_cfg

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cfg = small_cfg(tmp_path, moe={"num_experts": 4, "top_k": 2, "experts_kernel": "liger"})
    if torch.cuda.is_available():
        pytest.skip("liger runs on this CUDA device")
    with pytest.raises(ConfigError) as e:
        Trainer(cfg)
    assert "\n" not in str(e.value)
    assert "moe.experts_kernel=liger" in str(e.value) and "moe.experts_kernel: auto" in str(e.value)


@pytest.mark.slow
@pytest.mark.skipif(not kc.liger_available(), reason=NO_LIGER)
@pytest.mark.skipif(RUNS_HERE, reason="the liger cases run in this process")
def test_liger_cases_under_the_triton_interpreter():
    """On a CPU: the liger cases above in a child pytest started with ``TRITON_INTERPRET=1``
    and ``LIGER_FUSED_MOE_AUTOTUNE=0`` (the interpreter has no device to autotune on); all of
    them must run and pass (none skipped)."""
    root, here = Path(__file__).resolve().parents[2], Path(__file__).resolve()
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         *(f"{here}::{t}" for t in LIGER_TESTS)],
        env={**os.environ, "TRITON_INTERPRET": "1", "LIGER_FUSED_MOE_AUTOTUNE": "0"},
        cwd=root, capture_output=True, text=True, timeout=900)
    tail = r.stdout[-4000:] + r.stderr[-2000:]
    assert r.returncode == 0, tail
    passed = re.search(r"(\d+) passed", r.stdout)
    assert passed and int(passed.group(1)) == LIGER_CASES and "skipped" not in r.stdout, tail

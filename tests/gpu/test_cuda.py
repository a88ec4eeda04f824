"""The GPU tier (``pytest -m gpu``): training, routing, dtype policy and a sweep through Ray on
CUDA. Without CUDA (CI, ``make test``) the same tests run on the CPU with the CUDA code paths
forced (``tests/gpu/cuda_paths.py``: bf16 through DeepSpeed's real wrappers, grouped matmul,
atomic-free dispatch/combine; the sweep's Ray workers too). On a GPU box:
``python -m pytest -q -m gpu tests`` (or ``bash bench/gpu_session.sh``).

Bit-exactness on CUDA needs deterministic kernels: this module turns on
``torch.use_deterministic_algorithms(True, warn_only=True)`` and a fixed cuBLAS workspace
(set at import, before CUDA initialises)."""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import yaml  # noqa: E402

from tests.gpu import cuda_paths  # noqa: E402

pytestmark = [pytest.mark.gpu]

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
"""Where the tier runs: CUDA, or the CPU with the CUDA code paths forced."""
ROOT = Path(__file__).resolve().parents[2]
BUFFERS = {"expert_bias": torch.float32, "aux_coef": torch.float32,
           "load_accum": torch.float64, "drop_accum": torch.float64}


@pytest.fixture(scope="module", autouse=True)
def cuda_code_paths():
    if CUDA:
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        cuda_paths.force(mp.setattr)
        yield


@pytest.fixture(scope="module", autouse=True)
def deterministic():
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(before)


def small_cfg(tmp_path, dtype="auto", **over):
    from moe_core.train import train_config_from_dict

    d = {
        "name": "t", "seed": 0, "model": {"preset": "debug"},
        "data": {"source": "synthetic", "synthetic_vocab": 32, "synthetic_tokens": 60_000,
                 "seq_len": 32, "cache_dir": str(tmp_path / "cache")},
        "batch": {"global_batch": 8, "micro_batch": 4},
        "optim": {"lr": 3e-3, "dtype": dtype},
        "schedule": {"kind": "wsd", "warmup_steps": 2, "decay_frac": 0.25},
        "eval": {"every_steps": 2, "batches": 2},
        "tokens": 8 * 32 * 8,
        "moe": {"num_experts": 4, "top_k": 2, "router": {"loss_free_rate": 0.01}},
    }
    d.update(over)
    return train_config_from_dict(d)


def fit(cfg, **kw):
    from moe_core.train import Trainer

    t = Trainer(cfg, **kw)
    assert t.device.type == DEVICE
    res = t.fit()
    return res, {k: torch.as_tensor(v) for k, v in t.model_state_numpy().items()}


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _losses(res):
    return [m["val_loss"] for m in res.curve]


DTYPES = ["bf16", "fp32"]


# ---- moe_core training on CUDA ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_training_is_deterministic_and_learns(tmp_path, dtype):
    cfg = small_cfg(tmp_path, dtype)
    a, sa = fit(cfg)
    b, sb = fit(cfg)
    assert _losses(a) == _losses(b) and _equal(sa, sb)
    assert a.val_loss < a.initial_val_loss and all(math.isfinite(v) for v in _losses(a))


@pytest.mark.slow
@pytest.mark.parametrize("dtype,stage", [("bf16", 0), ("bf16", 1), ("bf16", 2), ("fp32", 0)])
def test_cuda_resume_is_bit_exact(tmp_path, dtype, stage):
    """bf16 at ZeRO 0 is DeepSpeed's FP16_UnfusedOptimizer (defect 2), ZeRO 1/2 its ZeRO
    optimizer, fp32 a plain torch AdamW."""
    from moe_core.train import Trainer

    cfg = small_cfg(tmp_path, dtype, optim={"lr": 3e-3, "dtype": dtype, "zero_stage": stage})
    full, s_full = fit(cfg)
    killed = Trainer(cfg, out_dir=tmp_path / "ck", checkpoint_steps=[4])
    part = killed.fit(until=4)
    rest, s_rest = fit(cfg, resume_from=part.checkpoints[4])
    assert _losses(part) + _losses(rest) == _losses(full)
    assert _equal(s_rest, s_full)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_wsd_branch_is_bit_exact(tmp_path, dtype):
    from moe_core.schedules import Phase
    from moe_core.train.wsd import train_stable

    cfg = small_cfg(tmp_path, dtype)
    s, n = 6, 4
    single, s_single = fit(dataclasses.replace(
        cfg, tokens=(s + n) * cfg.tokens_per_step,
        schedule=dataclasses.replace(cfg.schedule, decay_frac=n / (s + n))))
    stable = train_stable(cfg, tmp_path / "st", [s])
    br, s_br = fit(cfg, resume_from=stable.checkpoints[s], phase=Phase.decay(s, n))
    assert br.val_loss == single.val_loss and _equal(s_br, s_single)
    walls = [m["wall_s"] for m in stable.curve if m["step"] <= s] + [m["wall_s"]
                                                                       for m in br.curve]
    assert walls == sorted(walls)


# ---- the dtype policy on CUDA -------------------------------------------------------------------


def _layer(E=64, K=8, d=256, order="softmax_topk"):
    from moe_core.config import MoEConfig, RouterConfig
    from moe_core.moe.layer import MoELayer

    torch.manual_seed(0)
    cfg = MoEConfig(num_experts=E, top_k=K, expert_d_ff=64, router=RouterConfig(
        order=order, loss_free_rate=1e-3))
    return MoELayer(d, 256, cfg, init_std=0.02)


@pytest.mark.parametrize("order", ["softmax_topk", "topk_softmax"])
def test_bf16_routing_equals_fp32_router_on_cuda(order):
    from moe_core.moe.routing import route

    layer = _layer(order=order)
    with torch.no_grad():
        layer.expert_bias.uniform_(-1e-3, 1e-3)
    lb = copy.deepcopy(layer).to(DEVICE, torch.bfloat16)
    x = torch.randn(8192, 256, device=DEVICE).bfloat16()
    got = lb.routing(x)
    ref = route(F.linear(x.float(), lb.router.weight.float()), top_k=8, cfg=lb.cfg.router,
                selection_bias_E=lb.expert_bias)
    assert torch.equal(got.topk_idx_TK, ref.topk_idx_TK)
    assert torch.equal(got.topk_weight_TK, ref.topk_weight_TK)
    flipped = route(F.linear(x, lb.router.weight), top_k=8, cfg=lb.cfg.router,
                    selection_bias_E=lb.expert_bias)
    assert not torch.equal(flipped.topk_idx_TK.sort(-1).values, ref.topk_idx_TK.sort(-1).values)
    y, aux = lb(x.view(16, 512, 256))  # the grouped-GEMM path in bf16
    assert y.dtype == torch.bfloat16 and aux.dtype == torch.float32 and y.isfinite().all()


def test_buffers_stay_fp32_after_bf16_cast_and_in_the_trainer(tmp_path):
    from moe_core.train import Trainer

    layer = _layer().to(DEVICE, torch.bfloat16)
    assert {n: getattr(layer, n).dtype for n in BUFFERS} == BUFFERS
    assert all(getattr(layer, n).device.type == DEVICE for n in BUFFERS)
    # after DeepSpeed's own bf16 set-up (its ZeRO-0 wrapper: bf16 weights; auto's
    # torch_autocast keeps them fp32)
    t = Trainer(small_cfg(tmp_path, "bf16", optim={"lr": 3e-3, "dtype": "bf16",
                                                   "bf16_mode": "deepspeed"}))
    for _ in range(3):
        t.step()
    for m in t.model.moe_layers():
        assert m.w_up.dtype == torch.bfloat16
        assert {n: getattr(m, n).dtype for n in BUFFERS} == BUFFERS
        assert m.expert_bias.abs().max() > 0  # the loss-free updates landed


def test_bf16_clipping_on_cuda_counts_expert_gradients(tmp_path):
    """The bf16 ZeRO-0 wrapper DeepSpeed hands back on CUDA leaves expert gradients out of its
    clipping norm; the loop's clipping scales every gradient by clip / global norm."""
    from moe_core.train import Trainer

    def grads(clip):
        t = Trainer(small_cfg(tmp_path, "bf16", optim={"lr": 3e-3, "dtype": "bf16",
                                                       "bf16_mode": "deepspeed",
                                                       "grad_clip": clip}))
        seen = []
        t.optimizer.optimizer.register_step_pre_hook(lambda opt, a, k: seen.append(
            [p.grad.detach().float().clone() for g in opt.param_groups for p in g["params"]]))
        t.step()
        return seen[0]

    free = grads(0.0)
    norm = math.sqrt(sum(float(g.pow(2).sum()) for g in free))
    clipped = grads(norm / 4)
    for a, b in zip(free, clipped):
        assert torch.allclose(b, a * (norm / 4) / (norm + 1e-6), rtol=2 ** -8, atol=1e-12)


@pytest.mark.slow
def test_chunked_loss_on_cuda_in_bf16(tmp_path):
    """``model.chunked_loss`` on CUDA: the LM-head loss and gradients in bf16 are as close to an
    fp64 reference as the plain bf16 path's, and a bf16 Trainer with it is deterministic and
    tracks the plain path's losses."""
    from moe_core.loss import linear_cross_entropy

    g = torch.Generator(device=DEVICE).manual_seed(0)
    h = (torch.randn(4096, 256, generator=g, device=DEVICE) * 0.5).bfloat16()
    w = (torch.randn(8192, 256, generator=g, device=DEVICE) * 0.02).bfloat16()
    t = torch.randint(0, 8192, (4096,), generator=g, device=DEVICE)

    def grads(fn, hh, ww):
        hh, ww = hh.detach().clone().requires_grad_(), ww.detach().clone().requires_grad_()
        loss = fn(hh, ww)
        loss.backward()
        return loss.detach().double(), hh.grad.double(), ww.grad.double()

    ref = grads(lambda a, b: F.cross_entropy(a @ b.t(), t), h.double(), w.double())
    plain = grads(lambda a, b: F.cross_entropy((a @ b.t()).float(), t), h, w)
    ours = grads(lambda a, b: linear_cross_entropy(a, b, t, chunk_tokens=1000), h, w)

    def rel(a, b):
        return ((a - b).abs().max() / b.abs().max()).item()

    for o, p_, r in zip(ours, plain, ref):
        assert rel(o, r) <= max(2 * rel(p_, r), 1e-6)
    runs = [_losses(fit(small_cfg(tmp_path / str(i), "bf16",
                                  model={"preset": "debug", "chunked_loss": c}))[0])
            for i, c in enumerate((True, True, False))]
    assert runs[0] == runs[1]
    assert runs[0] == pytest.approx(runs[2], rel=2e-2)


def test_evaluate_with_a_parent_reference_on_cuda(tmp_path):
    """Defect 1: the parent MLP reference lived on the CPU and ``evaluate`` crashed."""
    from moe_core.train import Trainer

    dense = Trainer(small_cfg(tmp_path, moe=None))
    for _ in range(2):
        dense.step()
    parent = dense.parent_state()
    t = Trainer(small_cfg(tmp_path, parent={"tokens": 512},
                          upcycle={"method": "dense_to_moe"},
                          moe={"num_experts": 4, "top_k": 2}), parent=parent)
    assert all(r.device.type == DEVICE and r.dtype == torch.float32
               for r in t.reference.values())
    m = t.evaluate()
    assert 0.5 < m["router.cos_to_parent"] <= 1.0


# ---- a sweep through Ray on one GPU ------------------------------------------------------------

SPEC = {
    "sweep": "gpu2",
    "base": {
        "model": {"preset": "debug"},
        "moe": {"num_experts": 4, "top_k": 2,
                "router": {"order": "topk_softmax", "loss_free_rate": 1.0e-3}},
        "data": {"source": "synthetic", "synthetic_vocab": 32, "synthetic_tokens": 60000,
                 "seq_len": 32},
        "batch": {"global_batch": 8, "micro_batch": 8},
        # DeepSpeed's bf16 ZeRO-0 wrapper, whose state (bf16 weights, fp32_groups) the test
        # reads back; the default (auto: torch_autocast at ZeRO 0) is tests/moe_core/
        # test_bf16_modes.py's
        "optim": {"lr": 3e-3, "bf16_mode": "deepspeed"},
        "schedule": {"kind": "wsd", "warmup_steps": 2, "decay_frac": 0.25},
        "eval": {"every_steps": 2, "batches": 2},
        "tokens": 2048,
        "parent": {"tokens": 2048, "seed": 0},
        "upcycle": {"method": "dense_to_moe"},
    },
    # two budgets: one parent task, one WSD stable-run task, two decay-branch trials, all on
    # the one GPU (0.5 each: both trials at once)
    "search": {"tokens": {"grid": [1536, 2048]}},
    "resources": {"cpus": 1, "gpus": 0.5 if CUDA else 0},
    "logging": {"wandb": {"enabled": False}},
    "checkpoint": {"every_evals": 2, "every_minutes": None},
}


@pytest.mark.slow
@pytest.mark.distributed  # starts Ray
def test_two_trial_sweep_on_one_gpu(tmp_path):
    from moe_core.train.checkpoint import load_checkpoint

    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump(dict(SPEC, results=str(tmp_path / "r"))))
    site = () if CUDA else (str(cuda_paths.SITE),)  # the CUDA paths in every Ray worker
    env = dict(os.environ, WANDB_MODE="disabled", UPCYCLE_CACHE=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join(p for p in (*site, str(ROOT),
                                                      os.environ.get("PYTHONPATH")) if p),
               **({} if CUDA else {cuda_paths.ENV: "1"}))
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-m", "sweeps.run", str(f), "--json"], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    res = tmp_path / "r" / "gpu2"
    rows = pq.read_table(res / "results.parquet").to_pylist()
    trials = {r["trial_id"] for r in rows}
    assert len(trials) == 2 and {r["status"] for r in rows} == {"ok"}
    for t in trials:
        mine = sorted((r for r in rows if r["trial_id"] == t), key=lambda r: r["step"])
        assert mine[-1]["step"] == mine[-1]["tokens_budget"] // 256
        assert all(math.isfinite(r["val_loss"]) for r in mine)
        walls = [r["wall_s"] for r in mine]
        assert walls == sorted(walls)
    # the trials trained in bf16 on the GPU, their balancing buffers in fp32
    kept = sorted((res / "tune").glob("*/checkpoint_*"))
    assert len(kept) == 2
    for ck in kept:
        state = load_checkpoint(ck).model_state()
        assert state["blocks.0.mlp.w_up"].dtype == torch.bfloat16
        assert state["blocks.0.mlp.expert_bias"].dtype == torch.float32
    # the parent task and the stable-run task had the GPU too: bf16 optimizer wrapper state,
    # bf16 stable checkpoints
    (parent,) = [p for p in (res / "parents").iterdir() if (p / "meta.json").exists()]
    assert "fp32_groups" in load_checkpoint(parent).optimizer_state()
    stable = sorted((res / "stable").glob("*/step_*"))
    assert stable and all(load_checkpoint(s).model_state()["blocks.0.mlp.w_up"].dtype ==
                          torch.bfloat16 for s in stable)
    # ... on a GPU Ray lent them (defect 5): the ids Ray assigned are the ones they saw; on the
    # CPU (gpus: 0) Ray hid every GPU from them
    for ck in (parent, *stable):
        where = load_checkpoint(ck).meta["placement"]
        if CUDA:
            assert where["ray_gpu_ids"] and where["cuda_visible_devices"] == ",".join(
                where["ray_gpu_ids"])
        else:
            assert where == {"ray_gpu_ids": [], "cuda_visible_devices": ""}

"""On the CUDA code path (grouped experts, atomic-free dispatch/combine, bf16), forced on CPU as
``../shared/gpu/probes`` does, a dense block and an MoE block each compile as ONE graph with no
graph break (``dynamo.explain``), forward and backward, and neither skewed expert loads nor 15
blocks add graphs or recompiles. A host read in the forward (``expert_bias.any()``,
``torch.bincount``, ``.tolist()``, a boolean mask) would break the graph and fail these tests."""

import dataclasses

import pytest
import torch
import torch._dynamo as dynamo
from torch._dynamo.utils import counters

import moe_core.moe.layer as layer_mod
from moe_core.config import MoEConfig, RouterConfig
from moe_core.model import Transformer
from moe_core.presets import model_config

pytestmark = pytest.mark.slow

ROUTERS = {
    "default": RouterConfig(),  # loss_free_rate 0, switch aux: the `.any()` and bincount case
    "loss_free_adaptive_z": RouterConfig(loss_free_rate=1e-3, adaptive_aux=True,
                                         z_loss_coef=1e-3),
}


@pytest.fixture(autouse=True)
def cuda_code_path(monkeypatch):
    monkeypatch.setattr(layer_mod, "GROUPED_MM", True)
    monkeypatch.setattr(layer_mod, "ATOMIC_FREE", True)
    dynamo.reset()
    counters.clear()
    yield
    dynamo.reset()


def _model(moe: bool, router: str = "default", cf: float | None = None,
           n_layer: int | None = None) -> Transformer:
    torch.manual_seed(0)
    m = (MoEConfig(num_experts=8, top_k=2, capacity_factor=cf, router=ROUTERS[router])
         if moe else None)
    c = model_config("tiny", vocab_size=128, moe=m, max_seq_len=64)
    if n_layer is not None:
        c = dataclasses.replace(c, n_layer=n_layer)
    return Transformer(c).to(torch.bfloat16)


def _block_call(model: Transformer, blk, B: int = 2, S: int = 32):
    x = torch.randn(B, S, model.config.d_model, dtype=torch.bfloat16, requires_grad=True)
    y, aux = blk(x, model.rope_cos, model.rope_sin)
    (y.float().pow(2).mean() + (aux if aux is not None else 0)).backward()


@pytest.mark.parametrize("moe,router,cf", [(False, "default", None), (True, "default", None),
                                           (True, "loss_free_adaptive_z", None),
                                           (True, "default", 1.0)])
def test_block_is_one_graph_on_the_cuda_path(moe, router, cf):
    model = _model(moe, router, cf)
    blk = model.blocks[0]
    assert blk.is_moe == moe
    x = torch.randn(2, 32, model.config.d_model, dtype=torch.bfloat16)
    ex = dynamo.explain(blk)(x, model.rope_cos, model.rope_sin)
    reasons = [b.reason.splitlines()[0] for b in ex.break_reasons]
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), reasons
    # forward and backward through one graph (aot_eager traces the backward too)
    dynamo.reset()
    before = blk.mlp.load_accum.clone() if moe else None
    _block_call(model, torch.compile(blk, fullgraph=True, backend="aot_eager"))
    if moe:  # the counters were updated inside the graph: 2·32 tokens × top-2
        assert float((blk.mlp.load_accum - before).sum()) == 2 * 32 * 2


def test_skewed_loads_add_no_graph_or_recompile():
    model = _model(True, "loss_free_adaptive_z", cf=1.0)
    blk = model.blocks[0]
    # not fullgraph: torch 2.13 then captures a data-dependent-shape op (bincount) with an
    # unbacked size instead of refusing it; a plain compile counts it as a graph break
    f = torch.compile(blk, backend="aot_eager")
    for step in range(5):
        if step >= 2:  # the selection bias sends every token to expert 0, then to 0 and 1
            with torch.no_grad():
                blk.mlp.expert_bias[0] = 10.0
                blk.mlp.expert_bias[1] = 9.0 if step == 4 else 0.0
                blk.mlp.load_accum.zero_()
                blk.mlp.drop_accum.zero_()
        _block_call(model, f)
    load = blk.mlp.load_accum.tolist()  # of the last step: 64 tokens, all on experts 0 and 1
    assert load == [64.0, 64.0] + [0.0] * 6
    assert float(blk.mlp.drop_accum[0]) == 2 * (64 - 16)  # capacity 16 per expert at cf 1
    assert counters["stats"]["unique_graphs"] == 1
    assert sum(counters["recompiles"].values()) == 0, dict(counters["recompiles"])
    assert not counters["graph_break"], list(counters["graph_break"])


@pytest.mark.parametrize("moe", [False, True])
def test_fifteen_blocks_share_one_graph(moe):
    model = _model(moe, "default", n_layer=15)
    assert model.enable_speedups(compile=True, backend="aot_eager")
    for _ in range(2):
        tok = torch.randint(0, 128, (2, 32))
        out = model(tok, tok)
        (out.loss + out.aux_loss).backward()
    assert model.compiled
    assert counters["stats"]["unique_graphs"] == 1
    assert sum(counters["recompiles"].values()) == 0, dict(counters["recompiles"])
    assert not counters["graph_break"], dict(counters["graph_break"])

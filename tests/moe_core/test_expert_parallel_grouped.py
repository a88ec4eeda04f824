"""The expert-parallel layer over 2 gloo ranks, with grouped experts (``torch._grouped_mm``, what
CUDA runs) and with the per-expert loop, gives each rank the output and gradients of the whole
layer on one rank."""

import sys

import pytest
import torch

from sweeps.cluster.local import free_port
from tests.ranks import start_ranks

E, K, D, F_ = 4, 2, 16, 24


def _layer():
    from moe_core.config import MoEConfig, RouterConfig
    from moe_core.moe.layer import MoELayer

    torch.manual_seed(0)
    cfg = MoEConfig(num_experts=E, top_k=K, expert_d_ff=F_, router=RouterConfig())
    return MoELayer(D, F_, cfg, init_std=0.1)


def _run(layer, rank: int):
    torch.manual_seed(100 + rank)  # each rank its own tokens
    x = torch.randn(24, D, requires_grad=True)
    y, aux = layer(x)
    (y.pow(2).mean() + aux).backward()
    return x, y


def _worker(rank: int, port: int, grouped: bool, out: str) -> None:
    import torch.distributed as dist

    import moe_core.moe.layer as layer_mod

    layer_mod.GROUPED_MM = grouped
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    try:
        full, ep = _layer(), _layer()
        ep.shard_experts(rank, 2, group=dist.group.WORLD)
        x1, y1 = _run(full, rank)
        x2, y2 = _run(ep, rank)
        sl = slice(rank * E // 2, (rank + 1) * E // 2)
        # each rank's expert gradients come from both ranks' tokens: sum the full layer's
        g_full = full.w_gate.grad.clone()
        dist.all_reduce(g_full)
        checks = {
            "y": torch.allclose(y1, y2, atol=1e-6, rtol=1e-5),
            "dx": torch.allclose(x1.grad, x2.grad, atol=1e-6, rtol=1e-5),
            "w_gate": torch.allclose(g_full[sl], ep.w_gate.grad, atol=1e-6, rtol=1e-5),
        }
        torch.save(checks, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="gloo multiprocess test on Linux")
@pytest.mark.parametrize("grouped", [True, False])
def test_expert_parallel_matches_one_rank(tmp_path, grouped):
    out = str(tmp_path / "checks")
    start_ranks(_worker, args=(free_port(), grouped, out), nprocs=2)
    for rank in (0, 1):
        checks = torch.load(f"{out}.{rank}")
        assert all(checks.values()), (rank, checks)

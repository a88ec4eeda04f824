"""Expert parallelism over 2 gloo ranks reproduces the single-rank loss curve."""

import json
import os
import socket
import sys

import pytest
import torch.multiprocessing as mp

CFG = {
    "name": "ep", "seed": 0, "model": {"preset": "debug"},
    "moe": {"num_experts": 4, "top_k": 2, "router": {"loss_free_rate": 0.01}},
    "data": {"source": "synthetic", "synthetic_vocab": 32, "synthetic_tokens": 60_000,
             "seq_len": 32},
    "batch": {"global_batch": 8, "micro_batch": 4},
    "optim": {"lr": 3e-3},
    "schedule": {"kind": "wsd", "warmup_steps": 2},
    "eval": {"every_steps": 1, "batches": 2},
    "tokens": 6 * 8 * 32,
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, cache: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    from moe_core.train import train, train_config_from_dict

    cfg = dict(CFG)
    cfg["data"] = dict(CFG["data"], cache_dir=cache)
    res = train(train_config_from_dict(cfg))
    layer_experts = [res.params["expert_parallel"], res.params["local_experts"]]
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"curve": [[m["step"], m["val_loss"], m["train_loss"]]
                                 for m in res.curve], "experts": layer_experts}, f)


def _run(world: int, tmp_path) -> list:
    out = tmp_path / f"w{world}.json"
    mp.start_processes(_worker, args=(world, _port(), str(tmp_path / "cache"), str(out)),
                       nprocs=world, start_method="spawn")
    data = json.loads(out.read_text())
    assert data["experts"] == [world, 4 // world]  # experts really are sharded
    return data["curve"]


@pytest.mark.distributed
@pytest.mark.skipif(sys.platform != "linux", reason="gloo multiprocess test on Linux")
def test_two_rank_expert_parallel_matches_single_rank(tmp_path):
    single = _run(1, tmp_path)
    ep2 = _run(2, tmp_path)
    assert [s[0] for s in single] == [e[0] for e in ep2] == list(range(7))
    # The same math in another summation order (an expert's gradient is one matmul over both
    # ranks' tokens instead of one per micro-batch) differs by float rounding, which Adam's
    # early normalised steps and top-K's discrete choices amplify over time: the first steps
    # agree to 1e-4, the later ones stay close.
    for (step, v1, t1), (_, v2, t2) in zip(single, ep2):
        tol = 1e-4 if step <= 3 else 1e-3
        assert abs(v1 - v2) <= tol, (step, v1, v2)
        if t1 is not None and t1 == t1:
            assert abs(t1 - t2) <= tol, (step, t1, t2)

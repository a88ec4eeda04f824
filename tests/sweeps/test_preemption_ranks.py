"""A multi-rank trial's ranks agree on a preemption notice (``sweeps.run.preemption.RankWatch``):
two gloo ranks train the tiny model, only rank 1's node is drained (the notice simulated as in
``test_preemption_watch.py``: the watch's GCS query answered by the test), and both ranks stop
at the same step, evaluate, checkpoint there and raise ``Preempted``; rank 0 carries the
notice's timings. The agreement is an all-reduce once per about ``poll_s``, not per step."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from sweeps.cluster.local import free_port
from tests.ranks import start_ranks

NOTICE_AT = 12
"""Rank 1's node is drained once rank 1 has trained this many steps."""
POLL_S = 0.3
LIMIT_S = 180.0
"""The ranks are killed after this long: a rank left in a collective would wait for good."""

CFG = {
    "name": "pr", "seed": 0, "model": {"preset": "debug"},
    "data": {"source": "synthetic", "synthetic_vocab": 32, "synthetic_tokens": 60_000,
             "seq_len": 32},
    "batch": {"global_batch": 8, "micro_batch": 4},
    "optim": {"lr": 3e-3},
    "eval": {"every_steps": 1000, "batches": 1},
    "tokens": 400 * 8 * 32,  # 400 steps: the notice stops the run long before
}


def _rank(rank: int, port: int, d: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE="2")
    from pathlib import Path

    from moe_core.schedules import Phase
    from moe_core.train import train_config_from_dict
    from moe_core.train.callbacks import Callback
    from moe_core.train.loop import Trainer
    from sweeps.run.preemption import Preempted, PreemptionWatch, RankWatch
    from sweeps.run.trial import CheckpointCadence
    from sweeps.spec.sweep import CheckpointSpec

    trained = {"steps": 0}

    class Steps(Callback):
        def should_stop(self) -> bool:  # asked once per step, after the watch
            trained["steps"] += 1
            return False

    def draining() -> dict[str, int]:  # only rank 1's node drains, at NOTICE_AT
        hit = rank == 1 and trained["steps"] >= NOTICE_AT
        return {"node1": int((time.time() + 30) * 1000)} if hit else {"elsewhere": 0}

    watch = RankWatch(PreemptionWatch(f"node{rank}", POLL_S, draining), rank)
    cfg = dict(CFG, data=dict(CFG["data"], cache_dir=f"{d}/cache"))
    cfg = train_config_from_dict(cfg)
    trainer = Trainer(cfg, phase=Phase.full(), out_dir=Path(d) / f"ckpt{rank}",
                      out_dir_per_rank=True, callbacks=(watch, Steps()),
                      should_checkpoint=CheckpointCadence(CheckpointSpec(), 1000, now=watch.due))
    watch.start()
    try:
        trainer.fit()
    finally:
        watch.close()
    try:
        watch.check(trainer.step_count, trainer.plan.end_step)
        raised = None
    except Preempted as e:
        raised = str(e)
    with open(f"{d}/rank{rank}.json", "w") as f:
        json.dump({"step": trainer.step_count, "raised": raised,
                   "checkpoints": sorted(trainer.result.checkpoints),
                   "evals": [m["step"] for m in trainer.result.curve],
                   "columns": watch.columns()}, f)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.skipif(sys.platform != "linux", reason="gloo multiprocess test on Linux")
def test_a_notice_on_one_ranks_node_checkpoints_every_rank_at_one_step(tmp_path):
    ctx = start_ranks(_rank, args=(free_port(), str(tmp_path)), nprocs=2, join=False)
    deadline = time.monotonic() + LIMIT_S
    while not ctx.join(timeout=1.0):  # ranks that disagree would wait in a collective forever
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the ranks did not finish in {LIMIT_S:.0f} s (a collective left "
                        "waiting: the ranks did not stop at the same step)")
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    step = r0["step"]
    assert r1["step"] == step and NOTICE_AT <= step < 400  # stopped together, early
    assert r0["checkpoints"] == r1["checkpoints"] == [step]  # one checkpoint, at the stop
    assert r0["evals"][-1] == r1["evals"][-1] == step  # evaluated there too
    assert r0["raised"].startswith("another rank's node is being drained (preemption notice)")
    assert r1["raised"].startswith("node node1 is being drained (preemption notice)")
    c0, c1 = r0["columns"], r1["columns"]
    assert c0["node_id"] == "node0" and c1["node_id"] == "node1"
    assert 0 <= c0["preempt_notice_to_ckpt_s"] < 30  # rank 0 saw no drain of its own node
    assert 0 < c0["preempt_deadline_left_s"] <= 30
    assert c0["preempt_syncs"] == c1["preempt_syncs"] <= step  # the same rounds on both
    print(f"\nstopped at step {step} (notice at {NOTICE_AT}); {c0['preempt_syncs']} agreements "
          f"in {step} steps; notice to checkpoint {c0['preempt_notice_to_ckpt_s']:.2f} s")


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_ranks_agree_once_per_poll_interval_not_per_step():
    """One rank (a world of 1, gloo): with 10 ms steps and ``poll_s`` 0.5 the all-reduce comes
    at step 1, then every 50 steps; between those, ``should_stop`` runs no collective. A notice
    seen between two rounds is acted on at the next round, not before."""
    import torch.distributed as dist

    from sweeps.run.preemption import PreemptionWatch, RankWatch

    # an in-process training test before this one (DeepSpeed's world of 1) may have left the
    # default group up: a world of one rank either way
    ours = not dist.is_initialized()
    if ours:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    assert dist.get_world_size() == 1
    try:
        clock, drained = Clock(), {}
        watch = RankWatch(PreemptionWatch("n0", 0.5, lambda: dict(drained)), 0, clock=clock)
        rounds = []
        for step in range(1, 131):
            clock.t += 0.01
            before = watch.syncs
            if step == 60:
                drained["n0"] = 0  # the notice, seen by the poll between rounds
                watch.watch.poll()
            stop = watch.should_stop()
            if watch.syncs > before:
                rounds.append(step)
            if stop:
                break
    finally:
        if ours:
            dist.destroy_process_group()
    assert rounds == [1, 51, 101] and step == 101  # stopped at the round after the notice
    assert watch.due() and watch.columns()["preempt_syncs"] == 3

"""Acting on a preemption notice inside a Tune *function* trial.

A cloud's reclaim warning reaches Ray as a GCS drain of the node, which
``ray.train.get_preemption_info`` sees only inside Ray Train workers: :class:`PreemptionWatch`
polls for it from a thread, and the trial checkpoints, reports and raises :class:`Preempted`, so
Tune restarts it from that checkpoint on another node. :class:`RankWatch` makes the ranks of a
multi-rank trial stop at the same step. Described in docs/cluster.md, "With a preemption notice".
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from moe_core.train.callbacks import Callback


class Preempted(RuntimeError):
    """The trial's node is being drained: the trial checkpointed and hands itself back to Tune,
    which restarts it from that checkpoint elsewhere (a retried failure, not a
    configuration error)."""


def draining_nodes() -> dict[str, int]:
    """Ray's draining nodes: ``{node id (hex): deadline (ms since the epoch, 0 = none)}``."""
    import ray

    return ray._private.state.state.get_draining_nodes()


def this_node() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


@dataclass(frozen=True, slots=True)
class Notice:
    seen: float
    """``time.monotonic()`` when the poll saw the drain."""
    deadline: float | None
    """The node's deadline, seconds since the epoch (None: the drain gave none)."""


class PreemptionWatch(Callback):
    """Polls the GCS every ``poll_s`` seconds, in a thread of its own from :meth:`start` to
    :meth:`close` (the training thread never waits on the GCS), for a drain of ``node_id``. At
    the first step boundary after it is seen, :meth:`should_stop` is True (the loop evaluates,
    checkpoints through :meth:`due`, reports and stops); :meth:`columns` adds the polls' cost
    and the notice's timings to the rows."""

    def __init__(self, node_id: str, poll_s: float,
                 draining: Callable[[], dict[str, int]] = draining_nodes):
        self.node_id, self.poll_s, self.draining = node_id, poll_s, draining
        self.notice: Notice | None = None
        self.drained = f"node {node_id[:12]}"
        """What is being drained, as :meth:`check` says it (``RankWatch``: another rank's node)."""
        self.stopping = False
        self.polls, self.poll_time, self.poll_cpu, self.first_poll = 0, 0.0, 0.0, 0.0
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> PreemptionWatch:
        self._thread = threading.Thread(target=self._run, name="preemption-watch", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, 2 * self.poll_s))

    def _run(self) -> None:
        while self.notice is None and not self._halt.is_set():
            self.poll()
            self._halt.wait(self.poll_s)

    def poll(self) -> None:
        """One query of the GCS (its wall and CPU seconds counted); a drain of this node is
        the notice."""
        t, cpu = time.perf_counter(), time.thread_time()
        try:
            drained = self.draining()
        except Exception:  # a GCS hiccup must not end a trial: the next poll retries
            drained = {}
        took = time.perf_counter() - t
        if not self.polls:  # the process's first GCS query connects its state accessor
            self.first_poll = took
        self.poll_time += took
        self.poll_cpu += time.thread_time() - cpu
        self.polls += 1
        if self.node_id in drained:
            ms = drained[self.node_id]
            self.notice = Notice(time.monotonic(), ms / 1000 if ms else None)

    def should_stop(self) -> bool:
        self.stopping = self.stopping or self.notice is not None
        return self.stopping

    def due(self) -> bool:
        """The cadence's ``now``: checkpoint at this eval (the loop is stopping on a notice)."""
        return self.stopping

    def columns(self) -> dict[str, Any]:
        """Per row: the trial's node, the polls so far with their wall and CPU seconds and the
        first one's (it connects); on the notice's row, the seconds from the notice to the
        checkpoint written and those left before the node's deadline."""
        out: dict[str, Any] = {"node_id": self.node_id, "preempt_polls": self.polls,
                               "preempt_poll_s": round(self.poll_time, 6),
                               "preempt_poll_cpu_s": round(self.poll_cpu, 6),
                               "preempt_first_poll_s": round(self.first_poll, 6)}
        n = self.notice
        if self.stopping and n is not None:
            out["preempt_notice_to_ckpt_s"] = round(time.monotonic() - n.seen, 3)
            if n.deadline is not None:
                out["preempt_deadline_left_s"] = round(n.deadline - time.time(), 3)
        return out

    def check(self, step: int, last_step: int) -> None:
        """After the loop returned: raise :class:`Preempted` if it stopped on a notice before
        the trial's last step (the checkpoint of ``step`` is already with Tune)."""
        n = self.notice
        if not self.stopping or n is None or step >= last_step:
            return
        left = "" if n.deadline is None else f", {n.deadline - time.time():.1f} s before the " \
            "node's deadline"
        raise Preempted(f"{self.drained} is being drained (preemption notice): checkpointed "
                        f"at step {step} {time.monotonic() - n.seen:.1f} s after the notice"
                        f"{left}; the trial restarts from it on another node")


MAX_SYNC_STEPS = 10_000
"""Most steps between two agreements of a multi-rank trial's ranks (:class:`RankWatch`)."""


class RankWatch(Callback):
    """One rank's part of a multi-rank trial's agreement on a preemption notice (docs/cluster.md):
    ``watch`` polls this rank's node; at every ``every``-th step boundary all ranks all-reduce
    (max) [notice seen, rank 0's ``every``, seconds since the notice, -deadline] on ``device``
    (the ranks' process group's: CUDA under NCCL); no collective runs between agreements."""

    def __init__(self, watch: PreemptionWatch, rank: int, device: Any = "cpu",
                 clock: Callable[[], float] = time.monotonic):
        self.watch, self.rank, self.device, self.clock = watch, rank, device, clock
        self.steps, self.at, self.next, self.syncs, self.since = 0, 0, 1, 0, clock()

    def start(self) -> RankWatch:
        self.watch.start()
        return self

    def close(self) -> None:
        self.watch.close()

    def _every(self) -> int:
        """Rank 0: steps until the next agreement, about ``poll_s`` at its step time since the
        last one."""
        now = self.clock()
        step_s = (now - self.since) / max(1, self.steps - self.at)
        self.since, self.at = now, self.steps
        return int(min(MAX_SYNC_STEPS, max(1, round(self.watch.poll_s / max(step_s, 1e-9)))))

    def should_stop(self) -> bool:
        if self.watch.stopping:
            return True
        self.steps += 1
        if self.steps < self.next:
            return False
        import torch
        import torch.distributed as dist

        n = self.watch.notice
        flag = torch.tensor([float(n is not None), float(self._every()) if self.rank == 0 else 0.0,
                             time.monotonic() - n.seen if n else 0.0,
                             -n.deadline if n and n.deadline else -math.inf],
                            dtype=torch.float64, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        seen, every, ago, deadline = flag.tolist()  # the one host sync, once per agreement
        self.syncs += 1
        self.next = self.steps + max(1, int(every))
        if seen:  # a notice on some rank's node: this rank stops too, with its timings
            if n is None:
                self.watch.notice = Notice(time.monotonic() - ago,
                                           -deadline if math.isfinite(deadline) else None)
                self.watch.drained = "another rank's node"
            self.watch.stopping = True
        return self.watch.stopping

    def due(self) -> bool:
        return self.watch.due()

    def columns(self) -> dict[str, Any]:
        return {**self.watch.columns(), "preempt_syncs": self.syncs}

    def check(self, step: int, last_step: int) -> None:
        self.watch.check(step, last_step)

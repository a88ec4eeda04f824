"""When each job of a sweep starts: a list schedule over a pool of GPUs (or CPU trial slots),
under the driver's two policies, ``barrier`` (every parent first, then the trials, longest first:
Graham's LPT) and ``own_parent`` (each trial, in Tune's order, once its own parent is ready,
holding its GPUs while it waits); docs/preflight-and-cost.md. Pure: no Ray.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

BARRIER, OWN_PARENT = "barrier", "own_parent"
POLICIES = (BARRIER, OWN_PARENT)


@dataclass(frozen=True, slots=True)
class Task:
    name: str
    seconds: float
    gpus: float
    """GPUs (or slots) it holds while it runs."""
    parent: str | None = None
    """The name of the parent task it waits for (None: none; a parent itself)."""


def _priority(t: Task, parents: set[str], policy: str) -> tuple[int, float]:
    return (0 if t.name in parents else 1, -t.seconds if policy == BARRIER else 0.0)


def schedule(tasks: Iterable[Task], capacity: float, policy: str = OWN_PARENT
             ) -> dict[str, tuple[float, float]]:
    """Each task's (start, end) of training in seconds on ``capacity`` GPUs under ``policy`` (a
    trial waiting for its parent holds its GPUs from when it took them until its end). A task wider
    than the pool runs alone on all of it (a forecast, not a refusal: preflight refuses)."""
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r}: one of {', '.join(POLICIES)}")
    tasks = list(tasks)
    parents = {t.parent for t in tasks if t.parent is not None} & {t.name for t in tasks}
    waiting = sorted(tasks, key=lambda t: _priority(t, parents, policy))  # stable: plan order
    done: set[str] = set()
    out: dict[str, tuple[float, float]] = {}
    running: list[tuple[float, str, float]] = []  # (end, name, gpus)
    now, free = 0.0, float(capacity)

    def start(t: Task) -> float | None:
        """When ``t`` trains if it takes its GPUs now; None: it may not take them yet."""
        if t.name in parents or t.parent is None or t.parent not in parents:
            return now if t.name in parents or policy == OWN_PARENT or parents <= done \
                else None
        if policy == BARRIER:
            return now if parents <= done else None
        return max(now, out[t.parent][1]) if t.parent in out else None

    while waiting:
        for t in list(waiting):
            need, at = min(t.gpus, capacity), start(t)
            if at is not None and need <= free + 1e-9:
                waiting.remove(t)
                free -= need
                out[t.name] = (at, at + t.seconds)
                heapq.heappush(running, (at + t.seconds, t.name, need))
            elif policy == OWN_PARENT and t.name not in parents:
                break  # Tune starts the trials in order
        if not running:  # nothing can ever start
            raise ValueError(f"unschedulable: {[t.name for t in waiting][:3]}")
        now = running[0][0]  # the next end, and every other end at that instant
        while running and running[0][0] <= now:
            _, name, g = heapq.heappop(running)
            free += g
            done.add(name)
    return out


def makespan(spans: Mapping[str, tuple[float, float]]) -> float:
    return max((e for _, e in spans.values()), default=0.0)


def busy(tasks: Iterable[Task], capacity: float) -> float:
    """GPU-seconds the tasks train (each task's seconds × the GPUs it holds)."""
    return sum(t.seconds * min(t.gpus, capacity) for t in tasks)


def policy_for(up_front: bool, stable_runs: int, parent_gpus: float, capacity: float) -> str:
    """The policy the driver runs: own_parent where the algorithm trains its parents up front, there
    are no WSD stable runs (each needs its parent first and its trials need it), and every parent
    task fits ``capacity`` at once, so all of them start before any trial takes a GPU (a trial
    waiting for a parent that cannot start would hold its GPUs for ever); else barrier."""
    own = up_front and stable_runs == 0 and parent_gpus <= capacity + 1e-9
    return OWN_PARENT if own else BARRIER

"""Ray's memory-monitor kill (``ray.exceptions.OutOfMemoryError``, past
``RAY_memory_usage_threshold``) read into the ``oom`` status's reason line and ``memory.*``
columns: what happened and what to lower (docs/reliability.md).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

OOM_STATUS = "oom"
THRESHOLD_ENV = "RAY_memory_usage_threshold"
DEFAULT_THRESHOLD = 0.95
"""Ray 2.60's ``memory_usage_threshold`` when the variable is not set."""
LOWER = ("lower max_concurrent (--max-concurrent), batch.micro_batch or the model size, or "
         "raise optim.zero_stage (a trial of several ranks)")
"""What makes a trial fit in less memory (``docs/own-checkpoint.md``)."""
MARKERS = ("running low on memory", "OutOfMemoryError")
"""Text of Ray's memory-monitor kill (its message, or the exception's name in a traceback)."""
MEMORY_COLUMNS = ("memory.total_gb", "memory.used_gb", "memory.available_gb",
                  "memory.threshold", "memory.trial_rss_gb")
GB = 1e9  # Ray's message counts GB of 10^9 bytes

_USED = re.compile(r"was ([\d.]+)GB used / ([\d.]+)GB limit")
_THRESHOLD = re.compile(r"threshold of (\d+)B \(([\d.]+)% of (\d+)B limit\)")
_KILLED = re.compile(r"Selected to kill: .*?task name=([^,]+),.*?actual memory used=([\d.]+)GB")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeMemory:
    """The node's memory when a worker was killed for it (GB of 10^9 bytes)."""

    total_gb: float | None
    """The limit Ray counts against: the node's memory, or its cgroup's limit."""
    used_gb: float | None
    threshold: float | None
    """Ray's kill threshold, a fraction of ``total_gb``."""
    trial_rss_gb: float | None = None
    """Memory of the killed trial's process (the largest killed worker that is not one of Ray's
    own actors, ``_QueueActor``, ``_WandbLoggingActor``...), when Ray's message names it."""
    others: tuple[str, ...] = ()
    """Ray's own actors killed with it (W&B's logging and queue actors)."""

    @property
    def available_gb(self) -> float | None:
        if self.total_gb is None or self.used_gb is None:
            return None
        return max(0.0, self.total_gb - self.used_gb)

    def columns(self) -> dict[str, float | None]:
        """The row's ``memory.*`` columns."""
        vals = (self.total_gb, self.used_gb, self.available_gb, self.threshold, self.trial_rss_gb)
        return {k: None if v is None else round(v, 4) for k, v in zip(MEMORY_COLUMNS, vals)}

    def text(self) -> str:
        """``node 9.10 of 23.54 GB used (threshold 0.38), 14.44 GB available, the killed worker
        at 0.92 GB``; the parts that are known."""
        parts = []
        if self.used_gb is not None and self.total_gb is not None:
            parts.append(f"node {self.used_gb:.2f} of {self.total_gb:.2f} GB used")
        if self.threshold is not None:
            parts.append(f"Ray's kill threshold {self.threshold:.2f}")
        if self.available_gb is not None:
            parts.append(f"{self.available_gb:.2f} GB available")
        if self.trial_rss_gb is not None:
            parts.append(f"the killed worker at {self.trial_rss_gb:.2f} GB")
        if self.others:
            parts.append(f"also killed: {', '.join(self.others)}")
        return ", ".join(parts) or "node memory unknown"


def is_oom(error: BaseException | str | None) -> bool:
    """Whether ``error`` (an exception, its chain included, or an error's text) is a kill by
    Ray's memory monitor."""
    seen: set[int] = set()
    while isinstance(error, BaseException) and id(error) not in seen:
        seen.add(id(error))
        if type(error).__name__ == "OutOfMemoryError" or is_oom(str(error)):
            return True
        error = error.__cause__ or error.__context__ or getattr(error, "cause", None)
    return isinstance(error, str) and any(m in error for m in MARKERS)


def configured_threshold() -> float:
    """Ray's threshold as this process's environment sets it (the Ray it starts uses it)."""
    try:
        return float(os.environ.get(THRESHOLD_ENV, DEFAULT_THRESHOLD))
    except ValueError:
        return DEFAULT_THRESHOLD


def _killed(message: str) -> tuple[float | None, tuple[str, ...]]:
    """(the killed trial's GB, Ray's own actors killed with it) from Ray's ``Selected to kill``
    lines: a trial's actor is named by its class (``ImplicitFunc``), Ray's own start with _."""
    found = [(name.split(".")[0], float(gb)) for name, gb in _KILLED.findall(message)]
    ours = [gb for name, gb in found if not name.startswith("_")] or [gb for _, gb in found]
    return max(ours, default=None), tuple(sorted({n for n, _ in found if n.startswith("_")}))


def from_message(message: str) -> NodeMemory:
    """The figures in Ray's kill message; what it lacks, from this node now."""
    used, thr = _USED.search(message), _THRESHOLD.search(message)
    rss, others = _killed(message)
    if used is None:  # no figures in the message: this node's memory now
        import psutil

        vm = psutil.virtual_memory()
        total, used_gb = vm.total / GB, (vm.total - vm.available) / GB
    else:
        total, used_gb = float(used.group(2)), float(used.group(1))
    return NodeMemory(total_gb=total, used_gb=used_gb,
                      threshold=float(thr.group(2)) / 100 if thr else configured_threshold(),
                      trial_rss_gb=rss, others=others)


def oom_outcome(message: str, what: str = "the trial") -> tuple[str, dict[str, Any]]:
    """The ``oom`` row's reason (one line: what was killed, the figures, what to lower) and
    its ``memory.*`` columns."""
    mem = from_message(message)
    return (f"{what} was killed by Ray's memory monitor ({mem.text()}); {LOWER}, then rerun "
            "with --resume", mem.columns())

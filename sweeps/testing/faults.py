"""Fault injection for the fault-tolerance tests, kept out of the production path.

``UPCYCLE_SWEEPS_FAIL_ONCE_AFTER=N`` in the driver's environment makes every trial raise once,
right after its N-th report (a multi-rank trial: its rank 0, so Ray Train restarts the worker
group from its checkpoint); a marker file ``.failed-<trial>`` in the parent cache records that
it did, so the restarted trial runs through, and ``.resumed-<trial>`` holds the step of the
restarted trial's first report (the eval after the checkpoint it resumed from; 0 if it had
none). The driver swaps this in for ``tune.report`` only when the variable is set; the
trainable and its reporter know nothing of it. ``UPCYCLE_SWEEPS_REPORT_COST_S=S`` makes every
report claim S seconds of work (``CostedReport``: ``time_this_iter_s``, which Tune keeps when a
trial reports it): trials of known cost for the budget's tests (``sweeps.run.budget``).
``UPCYCLE_SWEEPS_HOLD_AT_STEP=S`` holds every trial once after its report of step S until the
test releases it (``HoldReport``): the preemption test's disruptions at a known step.
``UPCYCLE_SWEEPS_OOM_AFTER=N`` makes the first trial of the sweep to reach its N-th report eat
memory until Ray's memory monitor kills it (``MemoryHog``; a marker ``.oom-once`` in the parent
cache says it did, so no other trial, and no retry, eats again).
``UPCYCLE_SWEEPS_SIM_STEP_S=parent=S,trial=T`` simulates durations: every parent (trial) run,
tiny as it is, lasts S (T) seconds per optimizer step longer (``Stretch``): the scheduling
proof on the local fake cluster (``tests/sweeps/test_schedule_cluster.py``); a kind not named
is not slowed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from moe_core.train.callbacks import Callback

FAIL_ONCE_ENV = "UPCYCLE_SWEEPS_FAIL_ONCE_AFTER"
HOLD_ENV = "UPCYCLE_SWEEPS_HOLD_AT_STEP"
COST_ENV = "UPCYCLE_SWEEPS_REPORT_COST_S"
OOM_AFTER_ENV = "UPCYCLE_SWEEPS_OOM_AFTER"
SIM_STEP_ENV = "UPCYCLE_SWEEPS_SIM_STEP_S"
HOG_STEP = 64 << 20  # bytes the hog takes at a time
HOG_SPARE = 3 << 30  # it never takes the node below this much available memory


class MemoryHog:
    """``report`` after whose ``after``-th call, in the first trial of the sweep to get there,
    memory is taken (and touched) 64 MiB at a time until Ray's memory monitor kills the
    process; should the node run down to ``HOG_SPARE`` first, it raises instead."""

    def __init__(self, after: int, marker_dir: str | Path, report: Any):
        self.after, self.marker_dir, self.report, self.calls = after, Path(marker_dir), report, 0

    def __call__(self, metrics: dict[str, Any], checkpoint: Any = None) -> None:
        self.report(metrics, checkpoint=checkpoint)
        self.calls += 1
        if self.calls != self.after:
            return
        self.marker_dir.mkdir(parents=True, exist_ok=True)
        try:
            os.close(os.open(self.marker_dir / ".oom-once", os.O_CREAT | os.O_EXCL))
        except FileExistsError:  # another trial, or this one before a retry, ate already
            return
        held = []
        while psutil.virtual_memory().available > HOG_SPARE:
            held.append(bytearray(HOG_STEP))  # zero-filled: the pages are really taken
            time.sleep(0.02)
        raise RuntimeError(f"injected memory hog took {len(held) * HOG_STEP >> 20} MiB and was "
                           "not killed (test hook: is RAY_memory_usage_threshold set?)")


class CostedReport:
    """``report`` whose every call claims ``seconds`` of work."""

    def __init__(self, seconds: float, report: Any):
        self.seconds, self.report = seconds, report

    def __call__(self, metrics: dict[str, Any], checkpoint: Any = None) -> None:
        self.report({**metrics, "time_this_iter_s": self.seconds}, checkpoint=checkpoint)


class FailOnceReport:
    """``report`` (``tune.report``; in a multi-rank trial rank 0's ``ray.train.report``, which
    takes the whole worker group down) that raises once per trial after ``after`` reports."""

    def __init__(self, after: int, marker_dir: str | Path, report: Any,
                 trial_id: Callable[[], str]):
        self.after, self.marker_dir, self.report = after, Path(marker_dir), report
        self.trial_id, self.counts = trial_id, {}

    def __call__(self, metrics: dict[str, Any], checkpoint: Any = None) -> None:
        self.report(metrics, checkpoint=checkpoint)
        trial = self.trial_id()
        marker = self.marker_dir / f".failed-{trial}"
        if marker.exists():  # the restarted trial
            resumed = self.marker_dir / f".resumed-{trial}"
            if not resumed.exists():
                resumed.write_text(str(metrics.get("step")))
            return
        self.counts[trial] = self.counts.get(trial, 0) + 1
        if self.counts[trial] >= self.after:
            self.marker_dir.mkdir(parents=True, exist_ok=True)  # a sweep without parents
            marker.write_text("failed once")
            raise RuntimeError(f"injected failure after {self.counts[trial]} reports (test hook)")


class HoldReport:
    """``report`` that, once per trial, after reporting step ``step`` writes ``.held-<trial>``
    (its pid) in ``marker_dir`` and waits until ``.release-<trial>`` appears (at most
    ``timeout_s``): the test then disrupts the trial at a known step (its node killed or
    drained) with nothing trained after that report."""

    def __init__(self, step: int, marker_dir: str | Path, report: Any,
                 trial_id: Callable[[], str], timeout_s: float = 300.0):
        self.step, self.marker_dir, self.report = step, Path(marker_dir), report
        self.trial_id, self.timeout_s = trial_id, timeout_s

    def __call__(self, metrics: dict[str, Any], checkpoint: Any = None) -> None:
        self.report(metrics, checkpoint=checkpoint)
        trial = self.trial_id()
        held = self.marker_dir / f".held-{trial}"
        if metrics.get("step") != self.step or held.exists():
            return
        self.marker_dir.mkdir(parents=True, exist_ok=True)
        held.write_text(str(os.getpid()))
        deadline = time.monotonic() + self.timeout_s
        while not (self.marker_dir / f".release-{trial}").exists() and \
                time.monotonic() < deadline:
            time.sleep(0.05)


def report_function(marker_dir: str | Path, report: Any = None,
                    trial_id: Callable[[], str] | None = None) -> Any:
    """``report`` (default ``tune.report``), or the failing one when the test variable is set
    (``trial_id`` names the trial where Tune's context does not: a Ray Train worker)."""
    from ray import tune

    report = report or tune.report
    trial_id = trial_id or (lambda: tune.get_context().get_trial_id())
    if os.environ.get(COST_ENV):
        report = CostedReport(float(os.environ[COST_ENV]), report)
    if os.environ.get(HOLD_ENV):
        report = HoldReport(int(os.environ[HOLD_ENV]), marker_dir, report, trial_id)
    if os.environ.get(OOM_AFTER_ENV):
        report = MemoryHog(int(os.environ[OOM_AFTER_ENV]), marker_dir, report)
    if os.environ.get(FAIL_ONCE_ENV):
        report = FailOnceReport(int(os.environ[FAIL_ONCE_ENV]), marker_dir, report, trial_id)
    return report


class Stretch(Callback):
    """Sleeps once, at the run's first eval (a fresh run's step-0 eval), ``per_step`` seconds
    for each step from there to the run's ``steps``: the run ends that much later and every
    later eval's ``wall_s`` counts the sleep, as if each step had been that much slower."""

    def __init__(self, per_step: float, steps: int):
        self.per_step, self.steps, self.done = per_step, steps, False

    def on_eval(self, metrics: dict[str, Any], checkpoint: Path | None) -> None:
        if not self.done:
            self.done = True
            time.sleep(self.per_step * max(0, self.steps - int(metrics.get("step") or 0)))


def stretch(kind: str, steps: int) -> tuple[Callback, ...]:
    """The simulated duration of a ``kind`` ("parent" or "trial") run of ``steps`` optimizer
    steps: a ``Stretch`` when ``SIM_STEP_ENV`` names ``kind``, else none (the product path)."""
    raw = os.environ.get(SIM_STEP_ENV)
    if not raw:
        return ()
    try:
        per = {k.strip(): float(v) for k, v in (p.split("=", 1) for p in raw.split(","))}
    except ValueError:
        raise ValueError(f"{SIM_STEP_ENV}={raw!r}: write parent=S,trial=T (seconds per "
                         "step)") from None
    return (Stretch(per[kind], steps),) if per.get(kind, 0.0) > 0 else ()

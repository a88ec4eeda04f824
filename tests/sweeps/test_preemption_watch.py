"""The preemption watch of a single-rank trial (``sweeps.run.preemption``) without Ray: it polls
at most every ``poll_s``, sees only its own node's drain, survives a failing poll, makes the
cadence checkpoint and hands the trial back to Tune only before its last step. The trial on a
real drained node: ``tests/sweeps/test_preemption_notice.py``."""

import time

import pytest

from moe_core.errors import SearchSpaceError
from sweeps.run.preemption import Preempted, PreemptionWatch
from sweeps.run.trial import CheckpointCadence
from sweeps.spec.sweep import CheckpointSpec


def _wait(pred, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "the watch's thread did not get there"
        time.sleep(0.01)


def test_polls_in_its_thread_and_sees_only_its_own_node():
    drained = {"other": 0}
    w = PreemptionWatch("mine", 0.05, lambda: dict(drained)).start()
    try:
        _wait(lambda: w.polls >= 3)
        assert not w.should_stop() and not w.due()  # another node's drain is not ours
        drained["mine"] = int((time.time() + 30) * 1000)
        _wait(lambda: w.notice is not None)
        polls = w.polls
        assert "preempt_notice_to_ckpt_s" not in w.columns()  # not acted on yet
        assert w.should_stop() and w.due()  # the loop's next step boundary
        time.sleep(0.2)
        assert w.polls == polls  # no poll once the notice is in
    finally:
        w.close()
    cols = w.columns()
    assert cols["node_id"] == "mine" and cols["preempt_polls"] == polls
    assert 0 <= cols["preempt_notice_to_ckpt_s"] < 10
    assert 20 < cols["preempt_deadline_left_s"] <= 30
    assert 0 <= cols["preempt_poll_cpu_s"] <= cols["preempt_poll_s"] + 0.1


def test_a_failing_poll_is_retried_not_raised():
    answers = [OSError("GCS unavailable"), {"mine": 0}]

    def draining():
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    w = PreemptionWatch("mine", 1.0, draining)
    w.poll()
    assert not w.should_stop() and w.polls == 1
    w.poll()
    assert w.should_stop()  # a drain without a deadline is acted on too
    assert "preempt_deadline_left_s" not in w.columns()


def test_close_ends_the_thread():
    w = PreemptionWatch("mine", 0.05, dict).start()
    _wait(lambda: w.polls >= 1)
    w.close()
    assert not w._thread.is_alive()


def test_check_hands_back_only_before_the_last_step():
    w = PreemptionWatch("mine", 1.0, dict)
    w.poll()
    w.should_stop()
    w.check(10, 64)  # no notice: nothing
    w = PreemptionWatch("mine", 1.0, lambda: {"mine": 0})
    w.poll()
    w.check(27, 64)  # seen, but the loop has not stopped on it: no checkpoint was taken
    assert w.should_stop()
    w.check(64, 64)  # the notice came at the last step: the trial is done
    with pytest.raises(Preempted, match=r"drained.*checkpointed at step 27"):
        w.check(27, 64)


def test_cadence_checkpoints_on_the_notice():
    flag = []
    c = CheckpointCadence(CheckpointSpec(every_evals=4, every_minutes=None), 8,
                          now=lambda: bool(flag))
    assert not c(8, False)
    flag.append(1)
    assert c(11, False)  # off the eval grid: the notice's own eval


def test_poll_interval_is_checked():
    assert CheckpointSpec().on_preemption and CheckpointSpec().preemption_poll_s == 2.0
    for bad in (0, -1, float("nan"), 601):
        with pytest.raises(SearchSpaceError, match=r"checkpoint\.preemption_poll_s="):
            CheckpointSpec(preemption_poll_s=bad)

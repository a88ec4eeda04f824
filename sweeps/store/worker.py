"""The results sink's background threads, kept off the caller's way (#42: no ``add`` slower
than 50 ms at 10⁶ rows).

Measured with ``bench/results_sink.py`` (each slow ``add`` listed with its thread's run-queue
wait and what ran meanwhile), the slow adds were the caller waiting for a core while the sink's
own writer merged parts or rewrote ``results.parquet`` on it. So the writer is one thread per
sink, started once and woken by :meth:`Worker.kick` (which never waits: starting a thread per
flush made the caller wait for the new thread to be scheduled), and it runs at a lower CPU
priority (``NICE`` above the caller's), so a waking caller takes the core from it at once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

NICE = 5
"""How much nicer (lower CPU priority) than the process the sink's background threads run
(Linux: a thread's own nice value; elsewhere unchanged). Moderate: a thread that holds the GIL
must still get a core soon when the caller waits for it."""


def lower_priority(by: int = NICE) -> None:
    """Make the calling thread ``by`` nicer, where the platform has per-thread priorities."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + by)
    except (AttributeError, OSError):  # no setpriority here, or not allowed: run as is
        pass


class Worker:
    """One thread that runs ``work()`` after each :meth:`kick`, once for every kick that came
    while it was busy (their work is covered by the next run)."""

    def __init__(self, work: Callable[[], None], name: str):
        self._work, self._cv = work, threading.Condition()
        self._asked = self._done = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)
        self._thread.start()

    def kick(self) -> int:
        """Ask for one more run; returns at once with its ticket (for :meth:`wait`)."""
        with self._cv:
            self._asked += 1
            self._cv.notify_all()
            return self._asked

    def wait(self, ticket: int | None = None) -> None:
        """Until the run that covers ``ticket`` (default: every kick so far) has ended."""
        with self._cv:
            ticket = self._asked if ticket is None else ticket
            while self._done < ticket and self._thread.is_alive():
                self._cv.wait(0.5)

    def stop(self) -> None:
        """Finish what was asked, then end the thread."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        self._thread.join()

    def _run(self) -> None:
        lower_priority()
        while True:
            with self._cv:
                while self._asked == self._done and not self._stopping:
                    self._cv.wait()
                if self._asked == self._done:
                    return
                ticket = self._asked
            try:
                self._work()
            finally:
                with self._cv:
                    self._done = ticket
                    self._cv.notify_all()

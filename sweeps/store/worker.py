"""The results sink's background writer: one thread per sink, started once and woken by each
flush (#42: no ``add`` slower than 50 ms at 10⁶ rows).

The sink used to start a new thread for a flush that found its writer idle, and
``Thread.start`` waits until the new thread has run: on a loaded machine the ``add`` that
triggered the flush waited for the scheduler to run another thread first. :meth:`Worker.kick`
only sets a flag and notifies; it never waits.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable


class Worker:
    """One thread that runs ``work()`` after each :meth:`kick`, once for every kick that came
    while it was busy (their work is covered by the next run). A run that raises is reported
    and the thread goes on (as a new thread per run did)."""

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
        while True:
            with self._cv:
                while self._asked == self._done and not self._stopping:
                    self._cv.wait()
                if self._asked == self._done:
                    return
                ticket = self._asked
            try:
                self._work()
            except Exception:  # noqa: BLE001 - reported; the next kick runs again
                traceback.print_exc()
            finally:
                with self._cv:
                    self._done = ticket
                    self._cv.notify_all()

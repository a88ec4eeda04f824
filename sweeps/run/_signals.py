"""Ctrl+C and SIGTERM stop a sweep gracefully: Tune saves its experiment state, the driver
writes an honest summary (``complete: false``) and exits with 128 + the signal number and the
resume hint. SIGTERM is turned into Tune's own graceful SIGINT path; it must be installed after
``ray.init``, which replaces the SIGTERM handler with one that aborts."""

from __future__ import annotations

import os
import signal

_received: list[int] = []


def _on_term(signum, frame) -> None:
    _received.append(signum)
    os.kill(os.getpid(), signal.SIGINT)  # Tune's handler: stop trials, save state, return


def _on_int(signum, frame) -> None:
    _received.append(signum)
    raise KeyboardInterrupt


def install() -> None:
    """SIGINT raises KeyboardInterrupt (even when the shell started us with SIGINT ignored);
    SIGTERM becomes a SIGINT."""
    signal.signal(signal.SIGINT, _on_int)
    signal.signal(signal.SIGTERM, _on_term)


def received() -> int | None:
    return _received[0] if _received else None


def exit_code(default: int = 130) -> int:
    """128 + signal number: 130 after Ctrl+C, 143 after SIGTERM."""
    sig = received()
    return 128 + sig if sig else default

"""A trial's set-up as the driver's console shows it, before the trial's first eval
(docs/preflight-and-cost.md, "Set-up progress"): set-up can take minutes on a real model. Each
stage goes to a :class:`SetupBoard`, a node-local JSON file and, for a driver on another node,
an entry of Ray's GCS internal key-value store. Advisory: nothing of it reaches the results.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from moe_core.fsio import atomic_write_text
from moe_core.train.callbacks import Callback

SUFFIX = ".json"
KV_NAMESPACE = "upcycle_sweeps_setup"
KV_TIMEOUT_S = 2.0
"""Longest wait for one GCS call of a board's write or the driver's read."""


def gcs() -> Any | None:
    """This process's GCS client (a connected Ray driver or worker), or None (no Ray)."""
    if "ray" not in sys.modules:  # never imports Ray itself
        return None
    from ray.experimental import internal_kv

    return internal_kv.internal_kv_get_gcs_client()


def _kv(method: str, *args: Any) -> Any:
    """``method`` of this process's GCS client in :data:`KV_NAMESPACE`, or None: without Ray, or
    when the call fails or takes over :data:`KV_TIMEOUT_S` (the boards are advisory: a slow or
    lost GCS never fails a trial, and the driver's line falls back to this node's files)."""
    client = gcs()
    if client is None:
        return None
    try:
        return getattr(client, method)(*args, KV_NAMESPACE.encode(), timeout=KV_TIMEOUT_S)
    except Exception:  # noqa: BLE001 -- advisory, as above
        return None


def kv_boards(sweep: str) -> dict[str, str]:
    """Trial id → board JSON of every board of ``sweep`` in the GCS KV."""
    keys = _kv("internal_kv_keys", f"{sweep}/".encode())
    got = (_kv("internal_kv_multi_get", list(keys)) if keys else None) or {}
    return {k.decode().split("/", 1)[1]: v.decode() for k, v in got.items() if v is not None}


def kv_clear(sweep: str) -> None:
    """Drop every board of ``sweep`` from the GCS KV once its trials are over (a long-lived
    cluster would keep them until it stops)."""
    _kv("internal_kv_del", f"{sweep}/".encode(), True)


def board_dir(cache_local: str | Path, sweep: str) -> Path:
    """Where a sweep's trials keep their set-up boards (this node's parent cache folder, in a
    hidden folder that no listing of parent entries counts)."""
    return Path(cache_local) / ".setup" / sweep


class SetupBoard(Callback):
    """Records each set-up stage (``on_stage``) with its start time; the first eval marks the
    set-up done (its seconds are the next trials' ETA). ``param_bytes``: the trial's fp32
    parameter bytes; ``stages``: how many stages this trial's set-up has; ``node``: the Ray
    node it runs on (kept as ``node``; the scheduling proof reads it, docs/cluster.md §4)."""

    def __init__(self, path: Path, param_bytes: int, stages: int,
                 clock: Callable[[], float] = time.time, node: str | None = None):
        self.path, self.clock = Path(path), clock
        self.state: dict[str, Any] = {"started": clock(), "bytes": int(param_bytes),
                                      "of": int(stages), "stages": [], "done": None,
                                      "node": node}

    def _write(self) -> None:
        # progress is advisory: a full or read-only disk never fails a trial
        text = json.dumps(self.state)
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.path, text)
        # for a driver on another node, under ``<sweep>/<trial_id>`` (as the file, board_dir)
        _kv("internal_kv_put", f"{self.path.parent.name}/{self.path.stem}".encode(),
            text.encode(), True)

    def on_stage(self, text: str) -> None:
        if self.state["done"] is None:
            self.state["stages"].append([text, self.clock()])
            self._write()

    def on_eval(self, metrics: dict[str, Any], checkpoint: Path | None) -> None:
        if self.state["done"] is None:
            self.state["done"] = self.clock()
            self._write()


def _board(text: str) -> dict[str, Any] | None:
    try:
        b = json.loads(text)
    except ValueError:
        return None
    return b if isinstance(b, dict) and isinstance(b.get("stages"), list) else None


def read_boards(folder: str | Path) -> dict[str, dict[str, Any]]:
    """Every readable board of a sweep: this node's files in ``folder`` and, with Ray, the GCS
    KV's of the sweep (``folder``'s name; the boards of trials on other nodes), by trial id (a
    half-written or foreign entry is skipped)."""
    texts = {}
    for f in Path(folder).glob(f"*{SUFFIX}"):
        with contextlib.suppress(OSError, UnicodeDecodeError):
            texts[f.stem] = f.read_text()
    texts.update(kv_boards(Path(folder).name))  # the same board, or one from another node
    return {t: b for t, text in texts.items() if (b := _board(text)) is not None}


def eta_s(board: Mapping[str, Any], earlier: list[Mapping[str, Any]], now: float
          ) -> tuple[float | None, int]:
    """(seconds left of ``board``'s set-up or None, how many finished set-ups it rests on):
    the median of the finished set-ups' seconds × this trial's bytes / theirs, less the
    seconds spent so far (at least 0)."""
    done = [(float(b["done"]) - float(b["started"])) * board["bytes"] / max(1, int(b["bytes"]))
            for b in earlier if b.get("done") is not None and b.get("bytes")]
    if not done:
        return None, 0
    return max(0.0, statistics.median(done) - (now - float(board["started"]))), len(done)


def secs(s: float) -> str:
    """Seconds as the progress lines say them (minutes from 90 s)."""
    return f"{s / 60:.1f} min" if s >= 90 else f"{s:.0f} s"


def setup_line(trial_id: str, board: Mapping[str, Any] | None,
               earlier: list[Mapping[str, Any]], now: float) -> str:
    """The progress line of a trial that has reported no eval yet."""
    if board is None or not board.get("stages"):
        return f"trial {trial_id}: setting up (no stage reported yet)"
    stages = board["stages"]
    text, since = stages[-1]
    of = max(int(board.get("of") or 0), len(stages))
    left, n = eta_s(board, earlier, now)
    eta = (f"ETA ~{secs(left)} (from {n} earlier set-up{'s' if n > 1 else ''}, scaled by "
           f"size)" if left is not None else "ETA unknown until a first trial has set up")
    return (f"trial {trial_id}: set-up {len(stages)}/{of} {text} ({secs(now - float(since))}"
            f" in this stage, {secs(now - float(board['started']))} in set-up; {eta})")


def lines_for(folder: str | Path, trial_ids: list[str], now: float | None = None
              ) -> dict[str, str]:
    """The set-up line of each of ``trial_ids`` (the running trials without an eval)."""
    now = time.time() if now is None else now
    boards = read_boards(folder)
    earlier = [b for t, b in boards.items() if b.get("done") is not None]
    return {t: setup_line(t, boards.get(t), [b for b in earlier if b is not boards.get(t)], now)
            for t in trial_ids}

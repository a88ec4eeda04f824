"""A trial's set-up as the driver's console shows it, before the trial's first eval.

Set-up (parent, data, model, DeepSpeed engine, knob audit, the first eval that compiles) can take
minutes on a real model. Each stage is announced (``Callback.on_stage``) to a
:class:`SetupBoard`, which keeps the stages and their start times in a hidden node-local JSON
file (``<parent cache>/.setup/<sweep>/<trial_id>.json``); the driver's line for a trial with no
eval yet reads it (:func:`setup_line`): the stage (i of n), its seconds and the set-up's, and an
ETA: the median of the sweep's earlier set-ups, each scaled by this trial's parameter bytes over
its own (set-up moves the weights a few times). A trial on another node has no file here: its
line says it is setting up.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from moe_core.fsio import atomic_write_text
from moe_core.train.callbacks import Callback

SUFFIX = ".json"


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
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.path, json.dumps(self.state))

    def on_stage(self, text: str) -> None:
        if self.state["done"] is None:
            self.state["stages"].append([text, self.clock()])
            self._write()

    def on_eval(self, metrics: dict[str, Any], checkpoint: Path | None) -> None:
        if self.state["done"] is None:
            self.state["done"] = self.clock()
            self._write()


def read_boards(folder: str | Path) -> dict[str, dict[str, Any]]:
    """Every readable board of a sweep's folder, by trial id (a half-written or foreign file
    is skipped)."""
    out = {}
    for f in Path(folder).glob(f"*{SUFFIX}"):
        try:
            b = json.loads(f.read_text())
            if isinstance(b, dict) and isinstance(b.get("stages"), list):
                out[f.stem] = b
        except (OSError, ValueError):
            continue
    return out


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


def _secs(s: float) -> str:
    return f"{s / 60:.1f} min" if s >= 90 else f"{s:.0f} s"


def setup_line(trial_id: str, board: Mapping[str, Any] | None,
               earlier: list[Mapping[str, Any]], now: float) -> str:
    """The progress line of a trial that has reported no eval yet."""
    if board is None or not board.get("stages"):
        return f"trial {trial_id}: setting up (no stage reported on this node yet)"
    stages = board["stages"]
    text, since = stages[-1]
    of = max(int(board.get("of") or 0), len(stages))
    left, n = eta_s(board, earlier, now)
    eta = (f"ETA ~{_secs(left)} (from {n} earlier set-up{'s' if n > 1 else ''}, scaled by "
           f"size)" if left is not None else "ETA unknown until a first trial has set up")
    return (f"trial {trial_id}: set-up {len(stages)}/{of} {text} ({_secs(now - float(since))}"
            f" in this stage, {_secs(now - float(board['started']))} in set-up; {eta})")


def lines_for(folder: str | Path, trial_ids: list[str], now: float | None = None
              ) -> dict[str, str]:
    """The set-up line of each of ``trial_ids`` (the running trials without an eval)."""
    now = time.time() if now is None else now
    boards = read_boards(folder)
    earlier = [b for t, b in boards.items() if b.get("done") is not None]
    return {t: setup_line(t, boards.get(t), [b for b in earlier if b is not boards.get(t)], now)
            for t in trial_ids}

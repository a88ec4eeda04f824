"""Per-trial ``torch.compile`` state: a clean start, and what compilation did, for the row.

A reused Tune actor runs trial after trial in one process, and dynamo's cache is per code object
(``Block.forward``, ``MoELayer.forward`` and their resume functions), so it is shared by all of
them: after a few differently shaped trials a frame reaches ``recompile_limit`` and runs eager
from then on, while ``model.compiled`` still says true (measured on CPU: the 5th trial of
E/K/seq/micro-batch variants). :func:`start_trial` resets dynamo and its counters at each
trial's start; :func:`snapshot` is what the trial's rows carry:

- ``compile.graphs``: FX graphs dynamo produced (``counters["stats"]["unique_graphs"]``);
- ``compile.graph_breaks``: graph breaks met while tracing (``counters["graph_break"]``);
- ``compile.recompiles``: compilations of a frame beyond its first (guard failures: new shapes,
  eval/no-grad, a new dtype);
- ``compile.limit_hit``: whether some frame reached ``recompile_limit`` and fell back to eager.

All four are counted since the trial started (its restart after a failure starts again).
"""

from __future__ import annotations

from typing import Any

import torch
import torch._dynamo.convert_frame as _convert_frame
from torch._dynamo.utils import counters

PREFIX = "compile."
LIMIT_MESSAGE = "recompile limit"
"""How dynamo names the graph break it records when a frame reaches the limit."""


def start_trial() -> None:
    """A trial's compile state starts empty: dynamo's caches (``torch.compiler.reset``) and
    its counters."""
    torch.compiler.reset()
    counters.clear()


def _recompiles() -> int:
    # FRAME_COMPILE_COUNTER: compilations per frame id (cleared by torch.compiler.reset)
    per_frame = getattr(_convert_frame, "FRAME_COMPILE_COUNTER", {})
    return int(sum(max(0, n - 1) for n in per_frame.values()))


def snapshot() -> dict[str, Any]:
    """The compile columns of a row, counted since :func:`start_trial`."""
    unimpl = counters.get("unimplemented", {})
    return {
        PREFIX + "graphs": int(counters.get("stats", {}).get("unique_graphs", 0)),
        PREFIX + "graph_breaks": int(sum(counters.get("graph_break", {}).values())),
        PREFIX + "recompiles": _recompiles(),
        PREFIX + "limit_hit": any(LIMIT_MESSAGE in str(m).lower() for m in unimpl),
    }

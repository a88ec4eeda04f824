"""Per-trial ``torch.compile`` state: a clean start, and what compilation did, for the row
(docs/gpu.md, "Compilation, per trial").

A reused Tune actor runs trial after trial in one process, and dynamo's cache is per code object
(``Block.forward``, ``MoELayer.forward`` and their resume functions), so it is shared by all of
them: after a few differently shaped trials a frame reaches ``recompile_limit`` and runs eager
from then on, while ``model.compiled`` still says true (measured on CPU: the 5th trial of
E/K/seq/micro-batch variants). A process that never loaded ``torch._dynamo`` compiled nothing.
"""

from __future__ import annotations

import sys
from typing import Any

PREFIX = "compile."
LIMIT_MESSAGE = "recompile limit"
"""How dynamo names the graph break it records when a frame reaches the limit."""
DYNAMO = "torch._dynamo"


def start_trial() -> None:
    """A trial's compile state starts empty: dynamo's caches (``torch.compiler.reset``) and
    its counters (none to clear while dynamo is not loaded)."""
    if DYNAMO not in sys.modules:
        return
    import torch
    from torch._dynamo.utils import counters

    torch.compiler.reset()
    counters.clear()


def _recompiles() -> int:
    import torch._dynamo.convert_frame as convert_frame

    # FRAME_COMPILE_COUNTER: compilations per frame id (cleared by torch.compiler.reset)
    per_frame = getattr(convert_frame, "FRAME_COMPILE_COUNTER", {})
    return int(sum(max(0, n - 1) for n in per_frame.values()))


def snapshot() -> dict[str, Any]:
    """The compile columns of a row, counted since :func:`start_trial` (all 0 while dynamo
    is not loaded: nothing compiled)."""
    if DYNAMO not in sys.modules:
        return {PREFIX + "graphs": 0, PREFIX + "graph_breaks": 0, PREFIX + "recompiles": 0,
                PREFIX + "limit_hit": False}
    from torch._dynamo.utils import counters

    unimpl = counters.get("unimplemented", {})
    return {
        PREFIX + "graphs": int(counters.get("stats", {}).get("unique_graphs", 0)),
        PREFIX + "graph_breaks": int(sum(counters.get("graph_break", {}).values())),
        PREFIX + "recompiles": _recompiles(),
        PREFIX + "limit_hit": any(LIMIT_MESSAGE in str(m).lower() for m in unimpl),
    }

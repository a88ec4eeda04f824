"""The tiny sweep base that the sweep-level tests share: the debug model on synthetic tokens,
8 steps of 8 × 32 tokens, an eval every 2 steps (steps 0, 2, 4, 6, 8)."""

from __future__ import annotations

import copy
from typing import Any

TINY_BASE: dict[str, Any] = {
    "model": {"preset": "debug"},
    "data": {"source": "synthetic", "synthetic_vocab": 32, "synthetic_tokens": 60000,
             "seq_len": 32},
    "batch": {"global_batch": 8, "micro_batch": 8},
    "optim": {"lr": 3e-3},
    "schedule": {"kind": "wsd", "warmup_steps": 2},
    "eval": {"every_steps": 2, "batches": 2},
    "tokens": 2048,
}


def tiny_base(**over: Any) -> dict[str, Any]:
    """A fresh copy of ``TINY_BASE`` with top-level keys replaced by ``over``."""
    return {**copy.deepcopy(TINY_BASE), **copy.deepcopy(over)}

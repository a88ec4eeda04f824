"""WSD branching (000 §3.1): one stable-phase run, many token budgets.

``train_stable`` runs warmup + constant LR and saves checkpoints (model, optimizer, data position)
at a list of token counts, log-spaced by default. ``branch`` resumes one of them and runs only
the decay phase, so a run of D tokens costs the decay alone. A branch from the checkpoint at
step s decaying over n steps equals, bit for bit on CPU in fp32, a single WSD run of s + n steps
whose decay covers the last n.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from moe_core.errors import ConfigError
from moe_core.schedules import ScheduleConfig
from moe_core.train.checkpoint import load_checkpoint
from moe_core.train.config import TrainConfig
from moe_core.train.trainer import Callback, ParentState, TrainResult, train


def log_spaced_tokens(max_tokens: int, count: int, min_tokens: int) -> list[int]:
    """``count`` token counts log-spaced between min_tokens and max_tokens (000 App. A.5)."""
    if count < 1 or min_tokens < 1 or max_tokens < min_tokens:
        raise ConfigError(
            f"log-spaced checkpoints need 1 <= min_tokens={min_tokens} <= "
            f"max_tokens={max_tokens} and count={count} >= 1"
        )
    vals = np.geomspace(min_tokens, max_tokens, count)
    return sorted({int(round(v)) for v in vals})


def tokens_to_step(cfg: TrainConfig, tokens: int) -> int:
    return max(1, math.ceil(tokens / cfg.tokens_per_step))


def stable_schedule(cfg: TrainConfig, total_steps: int) -> tuple[float, ScheduleConfig]:
    """Warmup then constant at the peak: a WSD schedule without its decay."""
    return cfg.optim.lr, dataclasses.replace(
        cfg.schedule, kind="wsd", total_steps=total_steps, decay_frac=0.0
    )


def decay_schedule(cfg: TrainConfig, branch_step: int, decay_steps: int) -> ScheduleConfig:
    """The single-run WSD schedule whose decay covers exactly the last ``decay_steps`` of
    ``branch_step + decay_steps`` steps (its stable part equals the stable run's LR)."""
    total = branch_step + decay_steps
    return dataclasses.replace(
        cfg.schedule, kind="wsd", total_steps=total, decay_frac=decay_steps / total
    )


def train_stable(
    cfg: TrainConfig,
    out_dir: str | Path,
    *,
    checkpoint_tokens: Sequence[int] | None = None,
    num_checkpoints: int = 5,
    callbacks: Sequence[Callback] = (),
    parent: ParentState | None = None,
) -> TrainResult:
    """Stable phase of ``cfg`` up to its last checkpoint; checkpoints at ``checkpoint_tokens``
    (default: ``num_checkpoints`` log-spaced up to ``cfg.tokens``)."""
    if checkpoint_tokens is None:
        checkpoint_tokens = log_spaced_tokens(
            cfg.tokens, num_checkpoints, max(cfg.tokens_per_step, cfg.tokens // 32)
        )
    steps = sorted({tokens_to_step(cfg, t) for t in checkpoint_tokens})
    return train(
        cfg, out_dir=out_dir, callbacks=callbacks, parent=parent,
        schedule_override=stable_schedule(cfg, steps[-1]), checkpoint_steps=steps,
    )


def branch(
    cfg: TrainConfig,
    checkpoint: str | Path,
    decay_tokens: int,
    *,
    callbacks: Sequence[Callback] = (),
    parent: ParentState | None = None,
    out_dir: str | Path | None = None,
) -> TrainResult:
    """Resume the stable checkpoint and run only its decay over ``decay_tokens`` tokens."""
    ck = load_checkpoint(checkpoint)
    s = ck.step
    n = tokens_to_step(cfg, decay_tokens)
    peak = float(ck.meta.get("peak_lr", cfg.optim.lr))
    return train(
        cfg, resume_from=checkpoint, schedule_override=(peak, decay_schedule(cfg, s, n)),
        callbacks=callbacks, parent=parent, out_dir=out_dir, end_step=s + n,
        eval_at_start=False,
    )

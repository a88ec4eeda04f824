"""WSD branching (000 §3.1): one stable-phase run, many token budgets.

``train_stable`` runs warmup + constant LR and saves checkpoints (model, optimizer, data position)
at given steps; given a checkpoint of the same stable run (``resume_from``) it extends it: the
stable phase up to step s is the same for every budget whose decay starts at or after s, so a
stable run trained to s1 and then on to s2 equals, bit for bit on CPU in fp32, the one trained to
s2 in one go (the data of step t depends on (seed, t) only, the RNG state travels in the
checkpoint). ``branch`` resumes one of them and runs only the decay phase, so a run of D
tokens costs the decay alone. A branch from the checkpoint at step s decaying over n steps
equals, bit for bit on CPU in fp32, a single WSD run of s + n steps whose decay covers the last
n. The schedules of both come from ``schedules.run_schedule`` (phases ``stable`` and ``decay``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from moe_core.errors import ConfigError
from moe_core.schedules import Phase
from moe_core.train.callbacks import Callback, ParentState, TrainResult
from moe_core.train.checkpoint import load_checkpoint
from moe_core.train.config import TrainConfig
from moe_core.train.loop import Trainer


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


def train_stable(cfg: TrainConfig, out_dir: str | Path, checkpoint_steps: Sequence[int], *,
                 parent: ParentState | None = None,
                 callbacks: Sequence[Callback] = (),
                 resume_from: str | Path | None = None) -> TrainResult:
    """The stable phase of ``cfg`` (LR policy against ``parent`` included) up to its last
    checkpoint step, with a checkpoint at each of ``checkpoint_steps``; with ``resume_from`` (a
    checkpoint of this stable run, at a step before them) it resumes there and trains on."""
    steps = sorted({int(s) for s in checkpoint_steps})
    if not steps:
        raise ConfigError("a stable run needs at least one checkpoint step to branch from")
    return Trainer(cfg, parent=parent, phase=Phase.stable(steps[-1]), out_dir=out_dir,
                   checkpoint_steps=steps, callbacks=callbacks, resume_from=resume_from).fit()


def branch(cfg: TrainConfig, checkpoint: str | Path, decay_tokens: int, *,
           callbacks: Sequence[Callback] = (), parent: ParentState | None = None,
           out_dir: str | Path | None = None) -> TrainResult:
    """Resume the stable checkpoint and run only its decay over ``decay_tokens`` tokens."""
    ck = load_checkpoint(checkpoint)
    t = Trainer(cfg, parent=parent, resume_from=checkpoint, callbacks=callbacks,
                phase=Phase.decay(ck.step, tokens_to_step(cfg, decay_tokens)), out_dir=out_dir)
    stable_peak = ck.meta.get("peak_lr")
    if stable_peak is not None and not math.isclose(float(stable_peak), t.plan.peak):
        raise ConfigError(
            f"checkpoint {checkpoint} was trained at peak LR {stable_peak}, but this branch's "
            f"config resolves to {t.plan.peak}: branch with the stable run's config and parent"
        )
    return t.fit()

"""Deterministic batching: data order is a pure function of (seed, step)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from moe_core.errors import ConfigError


class TokenBatcher:
    """Random windows of ``seq_len + 1`` tokens; the global batch of step t is fixed by
    (seed, t). Rank r takes rows [r·B/W, (r+1)·B/W) of it and micro-batch m the m-th
    ``micro_batch`` rows of those, so rank-major, micro-minor order matches a single rank's
    micro-batch order whatever the world size."""

    def __init__(self, tokens: np.ndarray, *, seq_len: int, global_batch: int, micro_batch: int,
                 seed: int, rank: int = 0, world_size: int = 1):
        if global_batch % world_size or (global_batch // world_size) % micro_batch:
            raise ConfigError(
                f"batch.global_batch={global_batch} must split into {world_size} ranks × "
                f"micro-batches of batch.micro_batch={micro_batch}"
            )
        self.n = len(tokens) - seq_len - 1
        if self.n < 1:
            raise ConfigError(
                f"the training split has {len(tokens)} tokens, fewer than data.seq_len+1"
            )
        self.tokens, self.seq_len, self.seed = tokens, seq_len, seed
        self.global_batch, self.micro_batch = global_batch, micro_batch
        self.rank, self.world_size = rank, world_size
        self.per_rank = global_batch // world_size
        self.step = 0

    @property
    def num_micro_batches(self) -> int:
        return self.per_rank // self.micro_batch

    def global_starts(self, step: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, step])
        return rng.integers(0, self.n + 1, size=self.global_batch)

    def batch(self, step: int, micro_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y) int64 [micro_batch, seq_len] with y = x shifted by one token."""
        starts = self.global_starts(step)
        lo = self.rank * self.per_rank + micro_idx * self.micro_batch
        s = starts[lo: lo + self.micro_batch]
        idx = s[:, None] + np.arange(self.seq_len + 1)[None, :]
        w = torch.from_numpy(np.asarray(self.tokens[idx], dtype=np.int64))
        self.step = step
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.seed = int(state["step"]), int(state["seed"])

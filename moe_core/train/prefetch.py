"""Batches one step ahead on the device: pinned host memory and ``non_blocking`` copies on CUDA,
so the loop never waits on a pageable host-to-device copy (readiness S8)."""

from __future__ import annotations

from collections.abc import Callable

import torch

Batch = tuple[torch.Tensor, torch.Tensor]


class Prefetcher:
    """``get(step, micro)`` returns the micro-batch ``fetch(step, micro)`` on ``device`` and
    starts the copy of the one after it (``micro + 1``, or micro-batch 0 of ``step + 1`` after
    the last of ``gas``). Batches are keyed by position, so a resume, an out-of-order call or
    a prefetch that is never used changes nothing: what ``get`` returns is always ``fetch``'s
    batch for the position asked. On CUDA the host tensors are pinned and copied with
    ``non_blocking=True`` (the copy is queued on the current stream ahead of the next
    forward; the caching host allocator keeps the pinned buffer alive until it is done); on
    other devices a plain ``.to(device)``."""

    def __init__(self, fetch: Callable[[int, int], Batch], device: torch.device, gas: int):
        self.fetch, self.device, self.gas = fetch, device, gas
        self._ahead: tuple[tuple[int, int], Batch] | None = None

    def _load(self, step: int, micro: int) -> Batch:
        x, y = self.fetch(step, micro)
        if self.device.type == "cuda":
            return (x.pin_memory().to(self.device, non_blocking=True),
                    y.pin_memory().to(self.device, non_blocking=True))
        return x.to(self.device), y.to(self.device)

    def get(self, step: int, micro: int) -> Batch:
        if self._ahead is not None and self._ahead[0] == (step, micro):
            batch = self._ahead[1]
        else:
            batch = self._load(step, micro)
        nxt = (step, micro + 1) if micro + 1 < self.gas else (step + 1, 0)
        self._ahead = (nxt, self._load(*nxt))
        return batch

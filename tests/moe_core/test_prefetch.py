"""``moe_core.train.prefetch.Prefetcher``: batches one position ahead, the one asked for."""

import pytest
import torch

from moe_core.train.prefetch import Prefetcher


class Source:
    """A batch per (step, micro) whose values name its position; records every fetch."""

    def __init__(self):
        self.calls = []

    def __call__(self, step, micro):
        self.calls.append((step, micro))
        x = torch.full((2, 3), 10 * step + micro)
        return x, x + 1


def test_in_order_each_batch_fetched_once_and_the_next_one_ahead():
    src = Source()
    p = Prefetcher(src, torch.device("cpu"), gas=2)
    for step in range(3):
        for micro in range(2):
            x, y = p.get(step, micro)
            assert torch.all(x == 10 * step + micro) and torch.all(y == x + 1)
    # every position once, in order, plus the one after the last (prefetched, unused)
    assert src.calls == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0)]


def test_a_jump_returns_the_position_asked_for():
    """A resume (or any out-of-order call) gets its own batch, not the prefetched one."""
    src = Source()
    p = Prefetcher(src, torch.device("cpu"), gas=1)
    p.get(0, 0)
    x, _ = p.get(7, 0)  # (1, 0) was prefetched; 7 is asked
    assert torch.all(x == 70)
    x, _ = p.get(8, 0)
    assert torch.all(x == 80)
    assert src.calls[-2:] == [(8, 0), (9, 0)]  # 8 came from the prefetch after 7


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory and non_blocking "
                    "copies are the CUDA path")
def test_cuda_batches_arrive_on_the_device():
    p = Prefetcher(Source(), torch.device("cuda"), gas=1)
    x, y = p.get(3, 0)
    assert x.is_cuda and torch.all(x.cpu() == 30) and torch.all(y.cpu() == 31)

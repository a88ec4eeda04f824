"""Suite-wide hygiene: a test that leaves a Ray session connected in the pytest process (Ray's
auto-connect, a test failing before its ``ray.shutdown()``) must not leak it into the next
test, whose own ``ray.init`` would then fail ("ray.init twice")."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture(autouse=True)
def _no_ray_session_left_behind():
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()

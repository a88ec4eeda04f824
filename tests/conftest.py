"""Suite-wide hygiene and scheduling.

- A test that leaves a Ray session connected in the pytest process (Ray's auto-connect, a test
  failing before its ``ray.shutdown()``) must not leak it into the next test, whose own
  ``ray.init`` would then fail ("ray.init twice").
- ``make test`` runs the suite on three pytest-xdist workers (``-n 3 --dist loadgroup``; the
  machine has two cores, and the third keeps them busy while a test waits). The tests marked
  ``distributed`` (they start Ray, gloo ranks or a cluster of processes: about two thirds of the
  suite's time in about 40 tests) are dealt into one ``xdist_group`` per worker,
  ``distributed-0`` to ``distributed-2``. pytest-xdist hands out the largest groups first and
  each group runs on one worker, so each worker starts on its share of them and the short
  ungrouped tests fill in after: at most one such test runs at once per worker. Before,
  they all were one group on one worker, whose 13 min alone outlasted the other worker's whole
  share by minutes.
- They are dealt by module (a module's tests stay on one worker, so a module-scoped fixture,
  a sweep several tests read or an S3 server, starts once), heaviest module first to the worker
  with the fewest estimated seconds so far (``deal``). The estimates are ``durations.json``
  beside this file, seconds per test node id: the quiet-machine ``--durations`` figures of
  docs/getting-started.md where it has them, else a loaded machine's divided by 4 (the
  weights only need to be in proportion); a test it does not list counts ``DEFAULT_S``. Dealt
  in collection order instead, one worker's group could end minutes after the other's."""

from __future__ import annotations

import gc
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from sweeps.cluster.local import LIGHT_ENV

HEAVY_GROUP = "distributed"
"""Prefix of the groups of the tests marked ``distributed``: ``distributed-<k>``, one per
worker."""
TERMINAL_ENV = ("COLUMNS", "LINES")
"""Set to 80 x 24 in every pytest-xdist worker (GNU readline's start-up does it there), where
rich would then wrap the project's output at 80 columns: a worker gets the values (or their
absence) of the process that started the run, as a run without workers sees them."""
DURATIONS = Path(__file__).with_name("durations.json")
"""Estimated seconds of the ``distributed`` tests, by node id (what ``deal`` weighs)."""
DEFAULT_S = 20.0
"""The estimate of a ``distributed`` test ``durations.json`` does not list."""
TEST_RAY_ENV = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}
"""Set (unless set) in the test process, so in every sweep it starts and in their Ray workers.
Ray Train (v2) hands a rank's report to its controller through a queue of one, which the
controller empties when it polls the ranks, every 2 s by default: a multi-rank trial whose
evals come every few hundred milliseconds, as the tests' do, reports once per 2 s (a 2-rank
trial's 9 reports here: 14.2 s of its clock at 2 s, 4.8 s at 0.5 s). Real trials report
minutes apart, where the product's default of 2 s costs nothing."""


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook, on the controller
def pytest_configure_node(node) -> None:
    node.workerinput["terminal_env"] = {k: os.environ.get(k) for k in TERMINAL_ENV}


def pytest_configure(config: pytest.Config) -> None:
    # Every Ray the tests start (in process, or in a sweep's driver, which inherits it) runs as
    # the fake cluster's nodes do: no metrics export (every sweep runs without a dashboard) and
    # no usage report (no outside host is reachable); their periodic work cost about 8 % of the
    # CPU of three sweep tests (61.3 against 56.1 core-seconds). Nor does a raylet prestart a
    # worker per CPU that no trial can use (LIGHT_ENV: about 1.5 core-seconds a sweep here).
    # Each, if set, is kept.
    for k, v in {**LIGHT_ENV, **TEST_RAY_ENV}.items():
        os.environ.setdefault(k, v)
    for k, v in getattr(config, "workerinput", {}).get("terminal_env", {}).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    workers = max(1, int(getattr(config, "workerinput", {}).get("workercount", 1)))
    heavy = [item for item in items if item.get_closest_marker("distributed") is not None]
    estimates = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    group = deal([item.nodeid for item in heavy], workers, estimates)
    for item in heavy:  # before pytest-xdist's own hook reads the group marks
        item.add_marker(pytest.mark.xdist_group(f"{HEAVY_GROUP}-{group[item.nodeid]}"))
    result = yield
    _tag_loadgroup_ids(config, items)  # after it
    return result


def deal(nodeids: Sequence[str], workers: int, estimates: Mapping[str, float]) -> dict[str, int]:
    """The worker group (0 .. workers-1) of each test: whole modules, the heaviest first (by the
    sum of their tests' ``estimates``, ``DEFAULT_S`` where a test has none; ties in collection
    order), each to the group with the fewest seconds so far (the lowest-numbered on a tie)."""
    weight: dict[str, float] = {}
    for nodeid in nodeids:
        module = nodeid.split("::", 1)[0]
        weight[module] = weight.get(module, 0.0) + float(estimates.get(nodeid, DEFAULT_S))
    load = [0.0] * max(1, workers)
    of_module: dict[str, int] = {}
    for module in sorted(weight, key=lambda m: -weight[m]):  # stable: collection order on ties
        k = min(range(len(load)), key=lambda g: (load[g], g))
        load[k] += weight[module]
        of_module[module] = k
    return {nodeid: of_module[nodeid.split("::", 1)[0]] for nodeid in nodeids}


def _tag_loadgroup_ids(config: pytest.Config, items: list[pytest.Item]) -> None:
    """pytest-xdist (3.8) tells its ``loadgroup`` scheduler an item's group by appending
    ``@group`` to the item's node id through the legacy ``_nodeid`` field, which pytest 9.2's
    structured node ids no longer read: the groups are then silently ignored (pytest-xdist
    issue #1386). Where that happened, put the suffix on the structured id, as the fix proposed
    there does."""
    if not getattr(config.option, "loadgroup", False):  # set on xdist workers only
        return
    for item in items:
        names = {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                 for m in item.iter_markers("xdist_group")}
        suffix = "@" + "_".join(sorted(names))
        if names and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
            item._id = type(item._id).parse(item.nodeid + suffix)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move what importing the test modules built (torch, DeepSpeed, transformers, Ray) out of
    the garbage collector's sight (``gc.freeze``): DeepSpeed's BF16_Optimizer calls
    ``gc.collect()`` about nine times per construction (``see_memory_usage(force=True)``), each a
    walk over that whole heap, 5 s a construction in a test process."""
    gc.freeze()


def pytest_unconfigure(config: pytest.Config) -> None:
    gc.unfreeze()  # the interpreter's shutdown frees them as usual (nanobind counts leaks)


@pytest.fixture(autouse=True)
def _no_ray_session_left_behind():
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()

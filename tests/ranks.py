"""Processes for the tests' gloo ranks and process pools: forked from one forkserver per test
process that has imported the training stack once (``multiprocessing.set_forkserver_preload``),
not spawned. A spawned rank spends about 3.5 of its CPU seconds importing torch, DeepSpeed and
``moe_core``: ``tests/moe_core/test_expert_parallel.py`` took 86.7 core-seconds (56 s) spawned,
44.2 (30 s) forked from the forkserver, its tests and assertions unchanged.

The forkserver keeps the environment it started with, so each process is handed the caller's
``os.environ`` as it is at the call and takes it before running the test's function (what a
spawned process inherits). What the preloaded modules read from the environment as they import
is the forkserver's: ``OMP_NUM_THREADS`` of ``make test``, set before any test runs."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Mapping
from multiprocessing.pool import Pool
from typing import Any

import torch.multiprocessing as tmp

PRELOAD = ["torch", "deepspeed", "moe_core.train"]
"""What the forkserver imports once (each forked process then starts with it imported)."""


def _context() -> Any:
    multiprocessing.set_forkserver_preload(PRELOAD)  # no effect once the server runs
    return multiprocessing.get_context("forkserver")


def _take_env(env: Mapping[str, str]) -> None:
    os.environ.clear()
    os.environ.update(env)


def _in_env(rank: int, fn: Callable[..., Any], env: Mapping[str, str], *args: Any) -> Any:
    _take_env(env)
    return fn(rank, *args)


def start_ranks(fn: Callable[..., Any], args: tuple = (), nprocs: int = 1,
                join: bool = True) -> Any:
    """``torch.multiprocessing.start_processes(fn, args, nprocs, join)``, forked from the
    forkserver: ``fn(rank, *args)`` in each of ``nprocs`` processes."""
    _context()
    return tmp.start_processes(_in_env, args=(fn, dict(os.environ), *args), nprocs=nprocs,
                               join=join, start_method="forkserver")


def pool(processes: int) -> Pool:
    """A ``multiprocessing`` pool of ``processes`` forked from the forkserver."""
    return _context().Pool(processes, initializer=_take_env, initargs=(dict(os.environ),))

"""Recorded trials as ``scaling.predict.Curve`` objects, and the predictor's calibration.

A results file holds one row per (trial, eval) with the trial's config columns; a trial's LR
schedule is rebuilt from them (``schedule.*``, ``upcycle.lr_policy.policy``, ``tokens_budget``,
``data.seq_len``, ``batch.global_batch``) and its peak LR from the ``lr`` it reported.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from moe_core.errors import ConfigError
from moe_core.schedules import LRPolicyConfig, ScheduleConfig, lr_schedule, run_schedule
from scaling.predict import Calibration, Curve, calibrate
from sweeps.store.results import read_rows


def schedule_of(row: Mapping[str, Any], peak: float) -> tuple[tuple[float, ...], int]:
    """(per-step LRs, decay start) of the trial a row belongs to, resolved by the trainer's own
    resolver (``moe_core.schedules.run_schedule``), with the reported peak standing in for
    whatever peak the trial's LR policy gave it."""
    per_step = int(row["data.seq_len"]) * int(row["batch.global_batch"])
    total = max(1, math.ceil(int(row["tokens_budget"]) / per_step))
    own = ScheduleConfig(kind=row.get("schedule.kind") or "wsd",
                         warmup_steps=int(row.get("schedule.warmup_steps") or 0),
                         total_steps=total,
                         decay_frac=float(row.get("schedule.decay_frac") or 0.0),
                         min_ratio=float(row.get("schedule.min_ratio") or 0.0))
    policy = row.get("upcycle.lr_policy.policy") if row.get("D1") else None
    upcycle = None if policy is None else SimpleNamespace(lr_policy=LRPolicyConfig(
        policy="constant" if policy == "constant" else "reset", peak=peak))
    run = run_schedule(SimpleNamespace(schedule=own, steps=total, optim=SimpleNamespace(lr=peak),
                                       upcycle=upcycle),
                       None if upcycle is None else SimpleNamespace(peak_lr=peak, final_lr=peak))
    cfg = run.schedule
    start = cfg.decay_start if cfg.kind == "wsd" and cfg.decay_steps > 0 else total
    return lr_schedule(run.peak, cfg), start


def curves_from_rows(rows: Iterable[Mapping[str, Any]]) -> dict[str, Curve]:
    """One Curve per trial (evals sorted by step; rows without a finite loss left out)."""
    by_trial: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_trial.setdefault(str(r["trial_id"]), []).append(r)
    out = {}
    for tid, mine in by_trial.items():
        mine = sorted((r for r in mine if isinstance(r.get("val_loss"), (int, float))
                       and math.isfinite(r["val_loss"])), key=lambda r: r["step"])
        lrs_seen = [r["lr"] for r in mine if isinstance(r.get("lr"), (int, float))]
        if not mine or not lrs_seen:
            continue
        lrs, start = schedule_of(mine[0], max(lrs_seen))
        per_step = int(mine[0]["data.seq_len"]) * int(mine[0]["batch.global_batch"])
        out[tid] = Curve(tuple(int(r["step"]) for r in mine),
                         tuple(float(r["val_loss"]) for r in mine), lrs, start, per_step)
    return out


def load_calibration(paths: str | Path | Iterable[str | Path]) -> Calibration:
    """Fit the predictor on the finished WSD trials of one or more results files or sweep
    directories (``scheduler.calibration``)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    curves = []
    for p in paths:
        rows = [r for r in read_rows(p) if r.get("status") == "ok"]
        if not rows:
            raise ConfigError(f"scheduler.calibration={str(p)!r} holds no finished trial; point "
                              "it at the results of a finished WSD sweep (results.parquet)")
        curves += [c for c in curves_from_rows(rows).values() if c.final_loss is not None]
    try:
        return calibrate(curves)
    except ValueError as e:
        raise ConfigError(f"scheduler.calibration: {e}; use a sweep whose trials report at "
                          "least 3 stable-phase evals") from None

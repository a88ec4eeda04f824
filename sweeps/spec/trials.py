"""A spec's trials: grid points, the trial config of a search point, and validation.

``validate`` refuses an impossible sweep before any work: every grid point (and the corners of
every sampled range) must make a valid trial config. The configs it builds are kept on the spec
and taken by ``sweeps.plan.build.build_plan``, so that each is built once.
"""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Iterator
from typing import Any

from moe_core.errors import ConfigError, SearchSpaceError
from moe_core.train.config import TrainConfig, train_config_from_dict
from sweeps.spec.algorithm import plugins
from sweeps.spec.space import eval_expr, get_dotted, set_dotted

SweepSpec = Any
"""A :class:`sweeps.spec.sweep.SweepSpec` (not imported: ``sweeps.spec.sweep`` imports this
module)."""

MAX_TRIALS = 10_000
"""Most trials a spec may define (grid points × seeds × num_samples), and most trial configs
validation builds (grid points × every value or bound of the sampled knobs)."""
METRICS = {"val_loss", "train_loss", "aux_loss", "router.max_load", "router.entropy",
           "router.max1_max2", "router.expert_similarity", "router.dead_experts"}
"""What trials report, and so what ``metric`` may name."""


def _err(msg: str) -> SearchSpaceError:
    return SearchSpaceError(msg)


def point_key(point: dict[str, Any]) -> str:
    """A search point as a stable string (the plan's index, the validated configs' key)."""
    return json.dumps(dict(point), sort_keys=True, default=str)


# ---- search points -> trial configs ------------------------------------------------------------


def iter_grid(spec: SweepSpec) -> Iterator[dict[str, Any]]:
    return spec.space.grid_points()


def validation_points(spec: SweepSpec) -> list[dict[str, Any]]:
    """Grid points combined with every value (choice) or bound (ranges) of sampled knobs."""
    return spec.space.corner_points()


def knob_values(spec: SweepSpec, point: dict[str, Any],
                cfg: dict[str, Any] | None = None) -> dict[str, Any]:
    """The value each searched knob (and each expr knob) has in the trial's config (``cfg``:
    its ``trial_dict``, built here if not given): a conditional knob whose ``when`` does not
    hold shows the base value the trial really ran."""
    cfg = trial_dict(spec, point) if cfg is None else cfg
    keys = list(point) + [p.key for p in spec.space.exprs() if p.key not in point]
    return {k: cfg.get("seed") if k == "seed" else get_dotted(cfg, k, point.get(k))
            for k in keys}


def trial_dict(spec: SweepSpec, point: dict[str, Any]) -> dict[str, Any]:
    """The base config with a search point applied (conditions and expr knobs resolved)."""
    cfg = copy.deepcopy(spec.base)
    for k, v in point.items():
        if k == "seed":
            cfg["seed"] = v
            continue
        param = spec.space.param(k)
        if param is not None and not param.applies(_merged(cfg, point)):
            continue
        set_dotted(cfg, k, v)
    for p in spec.space.exprs():
        if p.applies(cfg):
            val = eval_expr(p.expr, cfg, p.key)
            if isinstance(val, float) and val.is_integer():
                val = int(val)
            set_dotted(cfg, p.key, val)
    return cfg


def _merged(cfg: dict[str, Any], point: dict[str, Any]) -> dict[str, Any]:
    m = copy.deepcopy(cfg)
    for k, v in point.items():
        set_dotted(m, k, v)
    return m


def trial_config(spec: SweepSpec, point: dict[str, Any]) -> TrainConfig:
    """The trial config of ``point``, kept on the spec with its ``trial_dict`` for the plan
    (:func:`take_config`)."""
    d = trial_dict(spec, point)
    cfg = train_config_from_dict(d)
    spec.validated[point_key(point)] = (d, cfg)
    return cfg


def take_config(spec: SweepSpec, point: dict[str, Any]) -> tuple[dict[str, Any], TrainConfig]:
    """(``trial_dict``, config) of ``point`` as validation built them, else built now."""
    got = spec.validated.get(point_key(point))
    if got is not None:
        return got
    d = trial_dict(spec, point)
    return d, train_config_from_dict(d)


# ---- validation --------------------------------------------------------------------------------


def validate(spec: SweepSpec) -> None:
    """Refuse impossible sweeps before any work: every grid point (and the corners of every
    sampled range) must make a valid trial config."""
    keys = [p.key for p in spec.search]
    dup = {k for k in keys if keys.count(k) > 1}
    if dup:
        raise _err(f"search.{sorted(dup)[0]} appears twice")
    _check_counts(spec)
    for algorithm in plugins(spec):  # the search algorithm's and the scheduler's own checks
        algorithm.validate(spec)
    _check_resources(spec)
    try:
        _ = spec.base_config
    except ConfigError as e:
        raise _err(f"base: {e}") from None
    if spec.metric not in METRICS:
        raise _err(f"metric={spec.metric!r} is not reported by trials; use one of "
                   f"{', '.join(sorted(METRICS))}")
    for point in validation_points(spec):
        try:
            trial_config(spec, point).batch.accumulation_steps(spec.resources.ranks)
        except SearchSpaceError:
            raise
        except ConfigError as e:
            shown = ", ".join(f"{k}={v}" for k, v in point.items())
            raise _err(f"{e} (at search point {shown})") from None
    check_kernels(spec)


def check_kernels(spec: SweepSpec) -> None:
    """``moe.experts_kernel: liger`` (Triton, CUDA only) on trials that run on the CPU
    (``resources.gpus`` 0, or ``auto`` resolved to 0 on a machine without GPUs): refused before
    anything starts instead of in every trial."""
    if spec.resources.gpus != 0 or os.environ.get("TRITON_INTERPRET") == "1":
        return
    for point in validation_points(spec):
        moe = trial_config(spec, point).moe
        if moe is not None and moe.experts_kernel == "liger":
            raise _err("moe.experts_kernel=liger needs a CUDA device, and these trials run on "
                       "the CPU (resources.gpus=0 or no GPU here); set moe.experts_kernel: auto")


MAX_CPUS = 1024.0
"""CPUs one trial rank may reserve (the largest machines have a few hundred)."""
MAX_GPUS = 64.0
"""GPUs one trial rank may reserve (a node has at most 16; fractions share one)."""
MAX_RANKS = 4096


def _check_resources(spec: SweepSpec) -> None:
    r = spec.resources
    if isinstance(r.ranks, bool) or not 1 <= r.ranks <= MAX_RANKS:
        raise _err(f"resources.ranks={r.ranks} must be >= 1 (an integer, at most {MAX_RANKS:,})")
    if not 0 < r.cpus <= MAX_CPUS:
        raise _err(f"resources.cpus={r.cpus} must be > 0 and at most {MAX_CPUS:g} (CPUs each "
                   "trial rank reserves)")
    if r.gpus != "auto" and not 0 <= r.gpus <= MAX_GPUS:
        raise _err(f"resources.gpus={r.gpus} must lie in [0, {MAX_GPUS:g}] (GPUs each trial "
                   "rank reserves; fractions share one), or be auto")
    if not 0 <= spec.resources.trial_driver < math.inf:
        raise _err(f"resources.trial_driver={spec.resources.trial_driver} must be >= 0 (e.g. "
                   "0.01: a share of a node's trial_driver slots; 0 turns it off)")


def _check_counts(spec: SweepSpec) -> None:
    """At most ``MAX_TRIALS`` trials, and at most as many trial configs to validate, counted
    before anything is enumerated."""
    grid = math.prod(len(p.values) for p in spec.grid_params()) * max(1, len(spec.seeds))
    if grid * spec.num_samples > MAX_TRIALS:
        raise _err(f"num_samples={spec.num_samples:,} × {grid:,} grid point(s) (search.*.grid "
                   f"× seeds) = {grid * spec.num_samples:,} trials, more than {MAX_TRIALS:,}; "
                   "lower num_samples or shrink the grid")
    corners = math.prod(len(p.corners()) for p in spec.sampled_params())
    if grid * corners > MAX_TRIALS:
        raise _err(f"validating the search builds {grid:,} grid point(s) × {corners:,} "
                   f"combinations of the sampled knobs' values and bounds, more than "
                   f"{MAX_TRIALS:,} trial configs; list fewer choice values or shrink the grid")

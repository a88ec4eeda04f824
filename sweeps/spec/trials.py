"""A spec's trials: grid points, the trial config of a search point, and building them all
(:func:`build_configs`, the validation of a spec's search, once per config)."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from typing import Any

from moe_core.errors import ConfigError, SearchSpaceError
from moe_core.train.config import TrainConfig, train_config_from_dict
from sweeps.spec.space import eval_expr, get_dotted, set_dotted
from sweeps.spec.sweep import SweepSpec

Built = dict[str, tuple[dict[str, Any], TrainConfig]]
"""(``trial_dict``, config) by search point (:func:`point_key`)."""


def point_key(point: dict[str, Any]) -> str:
    """A search point as a stable string (the plan's index, the built configs' key)."""
    return json.dumps(dict(point), sort_keys=True, default=str)


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
    cfg, merged = copy.deepcopy(spec.base), copy.deepcopy(spec.base)
    for k, v in point.items():
        set_dotted(merged, k, v)  # what a knob's ``when`` reads: the base and every knob's value
    for k, v in point.items():
        param = spec.space.param(k)
        if k == "seed" or param is None or param.applies(merged):
            set_dotted(cfg, k, v)
    for p in spec.space.exprs():
        if p.applies(cfg):
            val = eval_expr(p.expr, cfg, p.key)
            if isinstance(val, float) and val.is_integer():
                val = int(val)
            set_dotted(cfg, p.key, val)
    return cfg


def trial_config(spec: SweepSpec, point: dict[str, Any]) -> TrainConfig:
    return train_config_from_dict(trial_dict(spec, point))


def build_configs(spec: SweepSpec) -> Built:
    """Every validation point's (``trial_dict``, config), each built once; the first point
    that makes no valid trial config is refused in one line naming it."""
    built: Built = {}
    for point in validation_points(spec):
        try:
            d = trial_dict(spec, point)
            cfg = train_config_from_dict(d)
            cfg.batch.accumulation_steps(spec.resources.ranks)
        except SearchSpaceError:
            raise
        except ConfigError as e:
            shown = ", ".join(f"{k}={v}" for k, v in point.items())
            raise SearchSpaceError(f"{e} (at search point {shown})") from None
        built[point_key(point)] = (d, cfg)
    check_kernels(spec, experts_kernels(built))
    return built


def experts_kernels(built: Built) -> frozenset[str]:
    """The ``moe.experts_kernel`` values the built trial configs ask for."""
    return frozenset(cfg.moe.experts_kernel for _, cfg in built.values() if cfg.moe is not None)


def check_kernels(spec: SweepSpec, kernels: frozenset[str]) -> None:
    """``moe.experts_kernel: liger`` (Triton, CUDA only) on trials that run on the CPU
    (``resources.gpus`` 0, or ``auto`` resolved to 0 on a machine without GPUs): refused before
    anything starts instead of in every trial (``kernels``: :func:`experts_kernels`)."""
    if spec.resources.gpus == 0 and "liger" in kernels and \
            os.environ.get("TRITON_INTERPRET") != "1":
        raise SearchSpaceError(
            "moe.experts_kernel=liger needs a CUDA device, and these trials run on the CPU "
            "(resources.gpus=0 or no GPU here); set moe.experts_kernel: auto")

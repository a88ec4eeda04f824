"""How a results row reads in W&B: which columns are the run's config (nested by their dotted
path, as W&B addresses config) and under which key each metric is logged (the per-layer MoE
health as ``health/<layer>/<stat>``: docs/looking-at-a-sweep.md). Shared by the logger
(``sweeps.run.wandb_logging``) and the workspace (``analysis.wandb_workspace``, whose panels
name the logged keys). Pure: no wandb, no Ray.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from sweeps.store.results import EFFECTIVE_PREFIX, KNOB_PREFIX, ROUTER_PREFIX

PROJECT = "upcycle-sweeps"
"""The W&B project of a sweep's runs unless its spec says (``logging.wandb.project``)."""
HEALTH = "health"
"""The W&B namespace of the per-layer MoE health metrics."""
_LAYER = re.compile(r"^router\.(?P<stat>[^.]+)\.(?P<where>layer\d+|worst)$")


def health_stats(columns: Iterable[str]) -> set[str]:
    """The health statistics among ``columns``: those with a worst-layer column."""
    return {m["stat"] for c in columns if (m := _LAYER.match(c)) and m["where"] == "worst"}


def metric_key(column: str, stats: Collection[str]) -> str:
    """W&B's key of the metric column ``column`` (``stats``: :func:`health_stats`)."""
    if m := _LAYER.match(column):
        return f"{HEALTH}/{m['where']}/{m['stat']}"
    if column.startswith(ROUTER_PREFIX) and column[len(ROUTER_PREFIX):] in stats:
        return f"{HEALTH}/all/{column[len(ROUTER_PREFIX):]}"
    return column


def is_config(column: str, static: Collection[str]) -> bool:
    """``column`` goes to the run config (``static``: the sweep's static columns)."""
    return column in static or column.startswith((KNOB_PREFIX, EFFECTIVE_PREFIX))


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``flat`` nested by its dotted keys; a dict value merges with its children's keys and a
    null gives way to them. A key that is a leaf where another key needs a folder stays flat,
    under its own name."""
    out: dict[str, Any] = {}
    for key in sorted(flat, key=lambda k: k.count(".")):  # parents before their children
        value = copy.deepcopy(flat[key])
        *folders, leaf = key.split(".")
        node: Any = out
        for f in folders:
            if node.get(f) is None:
                node[f] = {}
            node = node[f]
            if not isinstance(node, dict):
                break
        if not isinstance(node, dict):
            out[key] = value
        elif not isinstance(node.get(leaf), dict):
            node[leaf] = value
        elif isinstance(value, Mapping):
            node[leaf] = {**value, **node[leaf]}
        elif value is not None:
            out[key] = value
    return out


def lookup(config: Mapping[str, Any], column: str) -> Any:
    """The value of ``column`` in a config nested by :func:`nest` (KeyError when absent)."""
    if column in config:
        return config[column]
    node: Any = config
    for part in column.split("."):
        node = node[part]
    return node


def wandb_result(result: Mapping[str, Any], static: Collection[str]) -> dict[str, Any]:
    """A Tune result as the W&B logger should receive it: its config columns (with the trial's
    Tune config) nested under ``config``, which Ray's logger writes to the run config; the
    metrics under their W&B keys. ``result`` is left as it is (other callbacks read it)."""
    stats = health_stats(result)
    config = {k: v for k, v in result.items() if k != "config" and is_config(k, static)}
    out = {metric_key(k, stats): v for k, v in result.items()
           if k != "config" and k not in config}
    out["config"] = nest({**dict(result.get("config") or {}), **config})
    return out


def merged(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """``new`` over ``old``, nested dicts merged key by key: a run's config as it accumulates
    over its results (W&B replaces a whole top-level key that an update names, and a trial
    restored from a checkpoint may report fewer effective values than it did at step 0)."""
    out = dict(old)
    for k, v in new.items():
        out[k] = merged(out[k], v) if isinstance(v, Mapping) and isinstance(
            out.get(k), Mapping) else v
    return out


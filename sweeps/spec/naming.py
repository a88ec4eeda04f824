"""Readable, filesystem-safe Tune trial folder names (``trial_dirname_creator``):
``<trial_id>_lr=3e-05_top_k=2_seed=0``, where Ray's default rounds small values (``peak=0.0000``);
docs/results-and-export.md gives the rules.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

MAX_LEN = 120
"""Folder names stay well under the 255 bytes of common filesystems."""
_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")


def compact(v: Any) -> str:
    """A knob value in a few characters: floats to 3 significant digits (``3e-05``,
    ``0.001``), mappings as ``key-value`` pairs joined by ``+``."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return format(v, ".3g") if math.isfinite(v) else str(v)
    if isinstance(v, Mapping):
        return "+".join(f"{k}-{compact(x)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return "+".join(compact(x) for x in v)
    return str(v)


def short_keys(keys: Sequence[str]) -> dict[str, str]:
    """Each dotted key's shortest tail that no other key ends with (``lr`` for ``optim.lr``
    unless ``parent.lr`` is there too: then ``optim.lr`` and ``parent.lr``)."""
    out = {}
    for k in keys:
        parts = k.split(".")
        n = 1
        while n < len(parts) and sum(o.split(".")[-n:] == parts[-n:] for o in keys) > 1:
            n += 1
        out[k] = ".".join(parts[-n:])
    return out


def trial_folder_name(trial_id: str, config: Mapping[str, Any], max_len: int = MAX_LEN) -> str:
    """``<trial_id>_<knob>=<value>_…`` (seed last), unsafe characters replaced by ``-``; past
    ``max_len`` the knob part is cut and ends in a hash of the whole, so it stays unique."""
    keys = [k for k in config if k != "seed"]  # the spec's order
    if "seed" in config:
        keys.append("seed")
    names = short_keys(keys)
    body = "_".join(f"{names[k]}={compact(config[k])}" for k in keys)
    body = _UNSAFE.sub("-", body).strip("-")
    name = f"{_UNSAFE.sub('-', str(trial_id))}_{body}" if body else _UNSAFE.sub("-", trial_id)
    if len(name) > max_len:
        digest = hashlib.sha1(name.encode()).hexdigest()[:8]
        name = name[:max_len - 10].rstrip("_=+-.") + "_h" + digest
    return name


def trial_dirname(trial: Any) -> str:
    """Tune's ``trial_dirname_creator``: :func:`trial_folder_name` of the trial."""
    return trial_folder_name(trial.trial_id, trial.config or {})

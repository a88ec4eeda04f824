"""Cache keys of parents, without torch: a sweep's dry run plans its parents with them."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from moe_core.data.files import data_fingerprint
from moe_core.hf_config import checkpoint_hash, weight_files
from moe_core.train.config import TrainConfig


def _stable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return _stable(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {k: _stable(v) for k, v in sorted(obj.items())}
    if isinstance(obj, (list, tuple)):
        return [_stable(v) for v in obj]
    return obj


def parent_key(cfg: TrainConfig) -> str:
    """Content hash of what determines a trial's parent (16 hex chars): its config and a
    fingerprint of the data on disk (a corpus changed under the same path is another parent);
    for ``parent.from_pretrained``, a hash of the checkpoint's files."""
    if cfg.parent is not None and cfg.parent.from_pretrained is not None:
        return pretrained_key(cfg.parent.from_pretrained)
    p = cfg.parent_run()
    ident = {
        "model": p.model.identity(),
        "moe": p.moe.identity() if p.moe is not None else None, "data": p.data, "optim": p.optim,
        "schedule": p.schedule, "batch": p.batch, "seed": p.seed, "tokens": p.tokens,
        "decay": cfg.parent.decay, "data_fingerprint": data_fingerprint(p.data),
    }
    blob = json.dumps(_stable(ident), sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def pretrained_key(path: str | Path) -> str:
    """Cache key of a pretrained parent: config.json and weight files' content (16 hex chars),
    memoised per (path, sizes, mtimes) so a plan of many trials hashes the files once."""
    files = [Path(path) / "config.json", *weight_files(path)]
    stamp = tuple((str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    if stamp not in _PRETRAINED_KEYS:
        _PRETRAINED_KEYS[stamp] = "hf-" + checkpoint_hash(path)[:13]
    return _PRETRAINED_KEYS[stamp]


_PRETRAINED_KEYS: dict[tuple, str] = {}

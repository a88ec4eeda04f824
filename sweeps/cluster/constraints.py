"""``python -m sweeps.cluster constraints > constraints.txt``: the versions this environment runs
as a pip constraints file the cluster configs install with (docs/cluster.md, "Pinned versions"):
local version labels dropped (``+cpu``), the project itself and pip's own tools left out.
"""

from __future__ import annotations

import importlib.metadata as md
import re

LEFT_OUT = frozenset({"upcycle-sweeps", "pip", "setuptools", "wheel"})


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def constraints() -> list[str]:
    """``name==version`` of every installed distribution, sorted, one per name."""
    pins: dict[str, str] = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if not name or _canonical(name) in LEFT_OUT:
            continue
        pins[_canonical(name)] = dist.version.split("+", 1)[0]
    return [f"{n}=={v}" for n, v in sorted(pins.items())]


def render() -> str:
    return ("# written by `python -m sweeps.cluster constraints`: the versions the head runs\n"
            + "\n".join(constraints()) + "\n")

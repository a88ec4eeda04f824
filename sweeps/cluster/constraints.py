"""``python -m sweeps.cluster constraints > constraints.txt``: the versions this environment runs
(``importlib.metadata``), as a pip constraints file the cluster configs install with
(``pip install -c constraints.txt '.[gpu]'``), so every node runs the versions the head runs.

Local version labels are dropped (``torch==2.7.1+cpu`` → ``torch==2.7.1``: a GPU node takes the
CUDA build of the same release); the project itself and pip's own tools are left out.
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

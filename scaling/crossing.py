"""Where two loss curves cross: 000 Eq. 13's D* as every sign change of the gap
L_scratch − L_upcycled on a log range, or the path that wins on all of it (pure math, shared by
``analysis.decide`` and the law-driven searcher of ``sweeps``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq


@dataclass(frozen=True)
class Crossing:
    D: float
    """Tokens where the loss gap L_scratch − L_upcycled changes sign."""
    to: str
    """Which path leads after the crossing: "scratch" (the gap goes + → −, 000's D*) or
    "upcycled" (− → +)."""


@dataclass(frozen=True)
class DStar:
    """Every solution of 000 Eq. 13 in [lo, hi], or, without one, the path that wins everywhere
    there. ``value`` is D*: the first crossing after which from-scratch training leads (None
    when there is none: never +∞, which is not JSON)."""

    crossings: tuple[Crossing, ...]
    lo: float
    hi: float
    winner_everywhere: str | None
    """"upcycled" or "scratch" when the gap keeps one sign on [lo, hi]; None otherwise."""

    @property
    def value(self) -> float | None:
        return next((c.D for c in self.crossings if c.to == "scratch"), None)

    def to_dict(self) -> dict:
        return {"d_star": self.value, "crossings": [c.__dict__ for c in self.crossings],
                "range": [self.lo, self.hi], "winner_everywhere": self.winner_everywhere}


def sign_changes(gap: Callable[[float], float], lo: float, hi: float, n: int = 400,
                 vectorized: Callable[[np.ndarray], np.ndarray] | None = None) -> DStar:
    """All sign changes of ``gap(ln D)`` = L_scratch − L_upcycled on a log grid over [lo, hi],
    each refined by Brent's method; with none, which path wins on the whole range (a gap of
    exactly 0 everywhere counts as "scratch": upcycling is then no better). ``vectorized``, when
    given, evaluates the gap on the whole grid at once (the same function on an array)."""
    grid = np.linspace(math.log(lo), math.log(hi), n)
    vals = np.asarray(vectorized(grid), dtype=float) if vectorized is not None \
        else np.array([gap(g) for g in grid])
    pos = vals > 0
    out = []
    for i in np.flatnonzero(pos[:-1] != pos[1:]):
        root = brentq(gap, grid[i], grid[i + 1], xtol=1e-12)
        out.append(Crossing(math.exp(root), "scratch" if pos[i] else "upcycled"))
    winner = None if out else ("upcycled" if pos[0] else "scratch")
    return DStar(tuple(out), lo, hi, winner)

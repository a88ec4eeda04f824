"""Bounds on what a spec's ``law:`` block may ask for, checked before anything is planned: caps
that keep planning and refits bounded in time and memory, and values a law search can compute
with (positive, known, finite). Each refusal is one line naming the ``law.`` key, the value and
the cap or the fix.
"""

from __future__ import annotations

import math
from typing import Any

from moe_core.errors import SearchSpaceError, shown
from scaling.laws import get_law

MAX_LAW_CANDIDATES = 2_000
"""Candidates a law search may weigh (``points`` ** box axes, or the grid's points)."""
MAX_BOOTSTRAP = 10_000
"""Bootstrap resamples of one refit (``law.bootstrap``, ``--bootstrap`` of analysis)."""
SCRATCH_NAMES = ("A", "alpha", "B", "beta", "E", "N1")
"""``law.scratch``: the from-scratch law's parameters (000 Eq. 3) and the sweep's N1."""
_err = SearchSpaceError  # the one-line refusals below


def check_bootstrap(n: Any, key: str) -> None:
    if n is not None and not isinstance(n, bool) and isinstance(n, (int, float)) and \
            n > MAX_BOOTSTRAP:
        raise _err(f"{key}={shown(n)} is more than the cap of {MAX_BOOTSTRAP:,} resamples; "
                   f"use at most {MAX_BOOTSTRAP:,} (200 to 1,000 give stable intervals)")


def finite_range(lo: float, hi: float) -> None:
    """``law.dstar_range``'s bounds must be finite."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise _err(f"law.dstar_range=[{lo:g}, {hi:g}] must be finite, e.g. [1e3, 1e17]")


def check_law(cfg: Any) -> None:
    """Values of a :class:`sweeps.law.config.LawSearchConfig` beyond its types: positive targets
    and from-scratch parameters, known names, finite bounds, capped sizes."""
    for k, v in cfg.loss_at:
        if not v > 0:
            raise _err(f"law.loss_at.{k}={v:g} must be > 0 (tokens or parameters)")
    for k, v in cfg.scratch:
        if k not in SCRATCH_NAMES:
            raise _err(f"law.scratch.{k} is not known; give {', '.join(SCRATCH_NAMES)} (the "
                       "from-scratch law A·D^−alpha [+ B·N^−beta] + E, 000 Eq. 3)")
        if not (v >= 0 if k == "E" else v > 0):
            raise _err(f"law.scratch.{k}={v:g} must be {'>= 0' if k == 'E' else '> 0'}")
    names = get_law(cfg.law).param_names
    for k, _ in cfg.fix:
        if k not in names:
            raise _err(f"law.fix.{k} is not a parameter of law {cfg.law}; fix one of "
                       f"{', '.join(names)}")
    finite_range(*cfg.dstar_range)
    for k, lo, hi in cfg.box:
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise _err(f"law.box.{k}=[{lo:g}, {hi:g}] must be finite")
    check_bootstrap(cfg.bootstrap, "law.bootstrap")
    if cfg.candidates == "box" and isinstance(cfg.points, int) and cfg.box:
        n = cfg.points ** len(cfg.box) if cfg.points <= MAX_LAW_CANDIDATES else math.inf
        if n > MAX_LAW_CANDIDATES:
            raise _err(f"law.points={cfg.points} over {len(cfg.box)} box axes "
                       f"makes {shown(n)} candidates, more than the cap of "
                       f"{MAX_LAW_CANDIDATES:,}; lower points")

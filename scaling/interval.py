"""The calibrated widening of a bootstrap interval (issue #30, docs/intervals.md).

Where simulated studies with a known truth show an interval's coverage below nominal,
``studies/law_search.py`` finds the smallest factor F by which moving both ends F times as far
from the estimate in ln(target) brings it to nominal (``calibration.factor``). The same
function applies F in ``algorithm: law`` (``law.widen``), in ``python -m analysis.decide
--widen F`` and in the study itself, so that the three widen alike.
"""

from __future__ import annotations

import math

from moe_core.errors import FitError

AUTO = "auto"
"""``law.widen: auto`` / ``--widen auto`` (the default): the calibrated factor for the noise
model the interval is bootstrapped under (:data:`CALIBRATED`)."""
CALIBRATED = {"fading": 1.35, "equicorrelated": 1.55, "independent": 1.0}
"""The smallest factor that brought the searcher's 90 % D* interval to nominal on the committed
simulated studies (studies/law_search.py, docs/intervals.md; ``studies_out/summary_*.json``):
fading noise ×1.35 (out of sample, studies 60–119: 0.88 ± 0.04,
``summary_fading_widen135_oos.json``), equicorrelated ×1.55, independent 1.0 (0.90 unwidened).
A fixed parent (``parent_fixed``) has no searcher interval to calibrate."""
MAX_WIDEN = 100.0
"""Largest widening factor accepted: a calibrated factor is a few (docs/intervals.md); a larger
one overflows ``(end/value)**F`` and means a typo."""


def widen(value: float | None, lo: float | None, hi: float | None,
          factor: float) -> tuple[float | None, float | None]:
    """The interval [lo, hi] about the estimate ``value`` with each end moved ``factor`` times
    as far in ln: end ↦ value·(end/value)^F, i.e. ln end ↦ ln value + F·(ln end − ln value).
    An end that is None (unbounded), ±inf or ≤ 0 (no crossing in that resample, on a scale of
    tokens) stays where it is; so does the whole interval when ``value`` is None or ≤ 0 (no
    estimate to widen about). F = 1 returns the interval unchanged."""
    if not 1 <= factor <= MAX_WIDEN:
        raise FitError(f"widen factor {factor} must be >= 1 and at most {MAX_WIDEN:g} (a "
                       "calibrated widening)")
    if factor == 1 or value is None or not math.isfinite(value) or not value > 0:
        return lo, hi

    def move(end: float | None) -> float | None:
        if end is None or not math.isfinite(end) or not end > 0:
            return end
        return value * (end / value) ** factor

    return move(lo), move(hi)


def noise_model_name(noise: str, length: float | None = None) -> str:
    """The calibrated noise model a bootstrap assumes: ``trials`` → independent, ``groups`` →
    equicorrelated, ``groups`` with a fading ``length`` (or ``fading``) → fading."""
    if noise == "trials":
        return "independent"
    return "fading" if noise == "fading" or length is not None else "equicorrelated"


def resolve_widen(widen: float | str | None, model: str) -> tuple[float, str]:
    """The factor to widen by and where it comes from: an explicit number wins ("given");
    ``auto`` (or None) is :data:`CALIBRATED`'s factor for ``model``."""
    if widen is None or widen == AUTO:
        f = CALIBRATED[model]
        return f, (f"auto: calibrated for {model} noise (studies_out/summary_{model}.json, "
                   "docs/intervals.md)")
    return float(widen), "given"

"""How far outside the data an input lies, said as a factor (``40x the largest fitted D1``),
for ``analysis.decide`` and its ``--plan``: an interval from a law evaluated there says so in
the interval itself."""

from __future__ import annotations

from collections.abc import Sequence

TOL = 1e-9


def outside_factor(value: float, lo: float, hi: float) -> float:
    """1 inside [lo, hi]; value/hi above it; lo/value below it (always ≥ 1)."""
    if value > hi * (1 + TOL):
        return value / hi
    if value < lo * (1 - TOL):
        return lo / value if value > 0 else float("inf")
    return 1.0


def describe_outside(name: str, value: float, lo: float, hi: float,
                     what: str = "fitted") -> str | None:
    """``"D1 = 2e+12 is 40x the largest fitted D1 (5e+10)"``; None inside the range."""
    f = outside_factor(value, lo, hi)
    if f <= 1.0:
        return None
    side, edge = ("largest", hi) if value > hi else ("smallest", lo)
    rel = f"{f:.3g}x the {side}" if value > hi else f"1/{f:.3g} of the {side}"
    return f"{name} = {value:.4g} is {rel} {what} {name} ({edge:.4g})".replace("  ", " ")


def interval_note(factors: Sequence[float]) -> str:
    """The suffix an interval carries when a law is evaluated outside its data:
    ``" (extrapolated 40x)"``; empty inside."""
    f = max(factors, default=1.0)
    return f" (extrapolated {f:.3g}x)" if f > 1.0 else ""

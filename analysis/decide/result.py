"""The decision of :func:`analysis.decide.decide` as a typed, frozen value, and its text.

:class:`Decision` holds what ``python -m analysis.decide`` prints; :meth:`Decision.to_dict` is
its ``--json`` output and the report's ``report.json`` entry, with the keys, their order and
their JSON-safe values (NaN and ±inf as null) those always had.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from analysis.decide.extrapolation import interval_note

Verdict = Literal["upcycle", "from_scratch", "uncertain"]


@dataclass(frozen=True)
class Inputs:
    """Where the laws are evaluated, and the cost model's throughput and price."""

    N1: float
    N2: float
    D1: float
    D2: float
    budget_flops: float
    """C2 = 6·N2·D2 (000 App. A)."""
    gpu_tflops: float
    gpu: str
    gpu_tflops_source: str
    price_per_gpu_hour: float | None


@dataclass(frozen=True)
class Estimate:
    """A prediction and its bootstrap percentile interval (None: unbounded or absent)."""

    value: float | None
    ci: list[float | None]


@dataclass(frozen=True)
class Decision:
    """Should I upcycle? (000 §5; see :mod:`analysis.decide`). The nested entries that vary in
    shape with the data (the D* crossings, the noise groups, the fitted parameters) stay
    JSON-safe mappings."""

    verdict: Verdict
    p_upcycle_wins: float
    """The share of bootstrap fits in which upcycling wins."""
    ci_level: float
    bootstrap: Mapping[str, Any]
    """How many fits, and what was resampled (trials, or noise groups with their sigma/ICC)."""
    noise_model: Mapping[str, Any]
    """What the intervals assume about the noise, and why (``analysis.decide.noise_model``)."""
    inputs: Inputs
    loss: Mapping[str, Estimate]
    """``upcycled`` and ``scratch``: the predicted loss of each path."""
    d_star: Mapping[str, Any]
    """D* (000 Eq. 13): value, interval, crossings, or the path that wins everywhere."""
    widen: Mapping[str, Any]
    compute_optimal: Mapping[str, Any]
    """000 Eq. 14's split of C2 (``available`` False with a ``reason`` on one dense size)."""
    cost: Mapping[str, Mapping[str, Any]]
    """Tokens, FLOPs, GPU-hours and cost of ``upcycled``, ``scratch``, ``scratch_to_match`` and
    ``sunk_dense``."""
    laws: Mapping[str, Any]
    extrapolated: list[str]
    """One line per input outside the data."""
    extrapolation_factor: Mapping[str, float]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Decision:
        """The decision from its JSON-safe dict (``decide``'s, after NaN → None)."""
        return cls(**{**d, "inputs": Inputs(**d["inputs"]),
                      "loss": {k: Estimate(**v) for k, v in d["loss"].items()}})

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` output (keys and order unchanged: a contract)."""
        return dataclasses.asdict(self)

    def lines(self) -> list[str]:
        """The decision as text lines (the CLI's and the report's)."""
        i, lvl, xf = self.inputs, f"{self.ci_level:.0%}", self.extrapolation_factor
        boot = self.bootstrap
        lines = [
            f"Should I upcycle? N1 = {i.N1:.4g} dense parameters trained on D1 = {i.D1:.4g} "
            f"tokens, D2 = {i.D2:.4g} more tokens (MoE N2 = {i.N2:.4g} active)",
            f"verdict: {self.verdict}   P(upcycling wins) = {self.p_upcycle_wins:.2f} "
            f"({boot['n']} bootstrap fits "
            f"{'by trial' if 'noise' not in boot else 'with noise groups'})",
            *([] if "noise" not in boot else [
                "noise (parametric, by group): " + "; ".join(
                    f"{k} sigma {v['sigma']:.3g} in ln L, ICC {v['icc']:.2f}"
                    f"{' (given)' if v['icc_given'] is not None else ''}"
                    for k, v in boot["noise"].items())]),
            f"intervals assume: {self.noise_model['assumes']}",
            f"  why: {self.noise_model['why']}",
            *([] if self.widen.get("factor", 1) == 1 else [
                f"D* interval widened ×{self.widen['factor']:g}: {self.widen['how']}"]),
            f"predicted loss, upcycled:     {_ci(self.loss['upcycled'], xf.get('upcycled'))}"
            f"   ({lvl} interval)",
            f"predicted loss, from scratch: {_ci(self.loss['scratch'], xf.get('scratch'))}",
            self._dstar_line(),
        ]
        co = self.compute_optimal
        lines.append(f"compute-optimal split of C2 = {i.budget_flops:.3g} FLOPs: "
                     + (f"D2 = {co['D2_opt']:.3g} tokens, N1 = {co['N1_opt']:.3g}"
                        if co["available"] else f"n/a ({co['reason']})"))
        for name in ("upcycled", "scratch", "scratch_to_match"):
            k = self.cost[name]
            lines.append(f"cost, {name.replace('_', ' ')}: {_g(k['tokens'], '.3g')} tokens, "
                         f"{_g(k['flops'], '.3g')} FLOPs, {_g(k['gpu_hours'], '.3g')} GPU-h at "
                         f"{i.gpu_tflops:.4g} TFLOP/s"
                         + (f", ${k['cost']:.3g}" if k["cost"] is not None else ""))
        lines.append(f"GPU throughput: {i.gpu_tflops:.4g} TFLOP/s sustained per "
                     f"{i.gpu}, {i.gpu_tflops_source}")
        lines.append("extrapolated: " + ("; ".join(self.extrapolated) or
                                         "nothing (every input lies within the data)"))
        return lines

    def _dstar_line(self) -> str:
        ds = self.d_star
        if ds["value"] is not None:
            line = f"D* (000 Eq. 13): {_ci(Estimate(ds['value'], ds['ci']), None, '.3g')} tokens"
        elif ds["winner_everywhere"]:
            line = (f"D* (000 Eq. 13): no crossing in {ds['range'][0]:.0e} … "
                    f"{ds['range'][1]:.0e} tokens: {ds['winner_everywhere']} wins everywhere")
        else:
            line = f"D* (000 Eq. 13): none; crossings {ds['crossings']}"
        if len(ds["crossings"]) > 1:
            cross = ", ".join(f"{c['D']:.3g} → {c['to']}" for c in ds["crossings"])
            line += f" (crossings: {cross})"
        return line


def _g(v: Any, fmt: str = ".4g") -> str:
    return "—" if v is None else format(v, fmt)


def _ci(e: Estimate, factor: float | None = None, fmt: str = ".4g") -> str:
    """``value  [lo, hi]``, and ``(extrapolated 40x)`` inside it when the law was evaluated
    that far outside its data."""
    lo, hi = e.ci
    return f"{_g(e.value, fmt)}  [{_g(lo, fmt)}, {_g(hi, fmt)}]{interval_note([factor or 1.0])}"

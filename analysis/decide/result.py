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

from analysis.decide.labels import format_decision

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
    limits: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Which predictions lie beyond ``MAX_EXTRAPOLATION`` times the data, and the model size
    the costs are priced at (``analysis.decide._limits``)."""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Decision:
        """The decision from its JSON-safe dict (``decide``'s, after NaN → None)."""
        return cls(**{**d, "inputs": Inputs(**d["inputs"]),
                      "loss": {k: Estimate(**v) for k, v in d["loss"].items()}})

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` output (keys and order unchanged: a contract)."""
        return dataclasses.asdict(self)

    def lines(self) -> list[str]:
        """The decision as text lines (the CLI's and the report's: ``labels.format_decision``)."""
        return format_decision(self.to_dict())

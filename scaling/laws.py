"""Scaling laws of the seeds as a registry of pure functions of named variables.

Every law is a sum of positive terms, ``L = Σ_k exp(t_k)``, and declares the *log* of each term
(``t_k``) so that the fitter can work on ``ln L = LogSumExp(t_1, …, t_K)`` (000 §4.1: "fitting the
logarithm of the loss via the LogSumExp trick"). Scale parameters (A, B, F, E) are positive and
enter through their natural logs, under the key ``ln_<name>``; exponents enter as they are.

Units: D (tokens) and N (parameters) are raw counts; logs are natural. 000 Table 2's published
parameters use the same units (they give D* ≈ 4e9 tokens at N1 = 1e9, as 000 Eq. 2 says).

Register your own law with :func:`register`::

    register(Law(name="my_law", variables=("D",), params=(Param("A", "scale"), ...),
                 log_terms=lambda p, x: [p["ln_A"] - p["alpha"] * np.log(x["D"]), p["ln_E"]]))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from moe_core.errors import FitError

Array = np.ndarray
LogTerms = Callable[[Mapping[str, Array | float], Mapping[str, Array]], list[Array | float]]


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter of a law.

    ``kind="scale"`` parameters are positive and fitted as ``ln_<name>``; ``bounds`` are then on
    the log. ``init`` lists starting values (in the fitting parameterisation) for the grid.
    """

    name: str
    kind: Literal["scale", "exponent"] = "exponent"
    bounds: tuple[float | None, float | None] = (None, None)
    init: tuple[float, ...] = (0.0,)

    @property
    def key(self) -> str:
        """The name the law's ``log_terms`` and the optimizer see (``ln_A`` for scale ``A``)."""
        return f"ln_{self.name}" if self.kind == "scale" else self.name

    def to_natural(self, v: float) -> float:
        return float(np.exp(v)) if self.kind == "scale" else float(v)

    def to_fit(self, v: float) -> float:
        if self.kind == "scale":
            if not v > 0:
                raise FitError(f"parameter {self.name}={v} must be > 0 (it is a scale)")
            return float(np.log(v))
        return float(v)


@dataclass(frozen=True, slots=True)
class Law:
    """A scaling law ``L(variables; params) = Σ exp(log_terms)``."""

    name: str
    variables: tuple[str, ...]
    params: tuple[Param, ...]
    log_terms: LogTerms
    equation: str = ""
    source: str = ""
    aliases: dict[str, str] = field(default_factory=dict)

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise FitError(f"law {self.name!r} has no parameter {name!r}; it has "
                       f"{', '.join(self.param_names)}")

    def _fit_dict(self, params: Mapping[str, float]) -> dict[str, float]:
        missing = [p.name for p in self.params if p.name not in params]
        if missing:
            raise FitError(f"law {self.name!r} needs parameters {missing}")
        return {p.key: p.to_fit(params[p.name]) for p in self.params}

    def _check_vars(self, x: Mapping[str, Array]) -> dict[str, Array]:
        missing = [v for v in self.variables if v not in x]
        if missing:
            raise FitError(f"law {self.name!r} needs variables {missing}; got {sorted(x)}")
        return {v: np.asarray(x[v], dtype=np.float64) for v in self.variables}

    def log_predict(self, params: Mapping[str, float], x: Mapping[str, Array]) -> Array:
        """ln L at the points ``x`` for natural parameters ``params`` (LogSumExp of the terms)."""
        return log_predict_fit(self, self._fit_dict(params), self._check_vars(x))

    def predict(self, params: Mapping[str, float], x: Mapping[str, Array]) -> Array:
        """L at the points ``x`` for natural parameters ``params``."""
        return np.exp(self.log_predict(params, x))


def log_predict_fit(law: Law, theta: Mapping[str, float], x: Mapping[str, Array]) -> Array:
    """ln L from fit-space parameters (``ln_A``, ``alpha`` …) via a stable LogSumExp."""
    n = len(next(iter(x.values()))) if x else 1
    terms = np.stack([np.broadcast_to(np.asarray(t, dtype=np.float64), (n,))
                      for t in law.log_terms(theta, x)])
    m = terms.max(axis=0)
    return m + np.log(np.exp(terms - m).sum(axis=0))


@dataclass(frozen=True)
class Points:
    """The points one law is fitted to: variables (raw counts) and the loss L (nats).

    Read from results by :func:`analysis.data.load_points`, fitted by
    :func:`scaling.fit.fit`.
    """

    x: dict[str, np.ndarray]
    L: np.ndarray
    labels: tuple[str, ...] = ()
    """The trial of each point (its ``trial_id``)."""
    groups: tuple[str, ...] = ()
    """The bootstrap unit of each point: points of one unit are resampled together (a trial's
    evals in ``--curves`` mode, or the trials that share a parent). Empty: ``labels``, or
    each point on its own when there are no labels either."""

    def __post_init__(self) -> None:
        n = len(self.L)
        for k, v in self.x.items():
            if len(v) != n:
                raise FitError(f"variable {k} has {len(v)} values but L has {n}")
        for name in ("labels", "groups"):
            got = getattr(self, name)
            if got and len(got) != n:
                raise FitError(f"{name} has {len(got)} entries but L has {n}")

    def __len__(self) -> int:
        return len(self.L)

    def take(self, idx: np.ndarray) -> Points:
        return Points({k: v[idx] for k, v in self.x.items()}, self.L[idx],
                      tuple(self.labels[i] for i in idx) if self.labels else (),
                      tuple(self.groups[i] for i in idx) if self.groups else ())

    def units(self) -> list[np.ndarray]:
        """Row indices of each bootstrap unit (``groups``, else ``labels``, else rows), in
        order of first appearance."""
        keys = self.groups or self.labels
        if not keys:
            return [np.array([i]) for i in range(len(self))]
        order: dict[str, list[int]] = {}
        for i, k in enumerate(keys):
            order.setdefault(k, []).append(i)
        return [np.array(v) for v in order.values()]


# ---- the seeds' laws -----------------------------------------------------------------------------

_LN = np.log


def _scale(name: str) -> Param:
    return Param(name, "scale", (None, None), (0.0, 3.0, 6.0))


def _exp(name: str, init: tuple[float, ...] = (0.1, 0.4)) -> Param:
    return Param(name, "exponent", (0.0, 5.0), init)


def _inter(name: str) -> Param:
    # interaction coefficient: small and of either sign (000 §4.1 finds α3 ≪ α1, α2)
    return Param(name, "exponent", (-0.5, 0.5), (0.0, 5e-3))


def _E() -> Param:
    return Param("E", "scale", (np.log(1e-4), np.log(20.0)), (np.log(0.5), np.log(1.5)))


def _chinchilla(p, x):
    # 000 Eq. 3: L = A·D^−α + B·N^−β + E
    return [p["ln_A"] - p["alpha"] * _LN(x["D"]), p["ln_B"] - p["beta"] * _LN(x["N"]), p["ln_E"]]


def _chinchilla_d(p, x):
    # 000 Eq. 3 at one N: L = A·D^−α + E' (E' = B·N^−β + E)
    return [p["ln_A"] - p["alpha"] * _LN(x["D"]), p["ln_E"]]


@dataclass(frozen=True, slots=True)
class _TwoStage:
    """ln-terms of the two-variable forms with an interaction in the exponent of ``v``:
    multiplicative  L = A·u^−k1 · v^(−k2 + k3·ln u) + E   (000 Eq. 8 in D1, D2; Eq. 17 in P, N2)
    additive        L = A·u^−k1 + F·v^(−k2 + k3·ln u) + E (000 Eq. 9; Eq. 18, Eq. 11 if k3 = 0).
    A class, not a closure, so that laws pickle into bootstrap worker processes."""

    u: str
    v: str
    k: str
    """exponent name stem: alpha → alpha1, alpha2, alpha3."""
    additive: bool

    def __call__(self, p, x):
        lu, lv = _LN(x[self.u]), _LN(x[self.v])
        k1, k2, k3 = (p[f"{self.k}1"], p[f"{self.k}2"], p.get(f"{self.k}3", 0.0))
        first = p["ln_A"] - k1 * lu
        second = (-k2 + k3 * lu) * lv
        if self.additive:
            return [first, p["ln_F"] + second, p["ln_E"]]
        return [first + second, p["ln_E"]]


_upc_mul = _TwoStage("D1", "D2", "alpha", additive=False)
_upc_add = _TwoStage("D1", "D2", "alpha", additive=True)
_cfg_mul = _TwoStage("P", "N2", "beta", additive=False)
_cfg_add = _TwoStage("P", "N2", "beta", additive=True)


def _joint(p, x):
    # 000 Eq. 12: L = A·D1^−α1 · D2^(−α2 + α3·ln D1) + B·N1^−β + E
    upcycled, ln_e = _upc_mul(p, x)
    return [upcycled, p["ln_B"] - p["beta"] * _LN(x["N1"]), ln_e]


LAWS: dict[str, Law] = {}


def register(law: Law, *, replace: bool = False) -> Law:
    """Add ``law`` to the registry (``replace=True`` to overwrite a law of the same name)."""
    if law.name in LAWS and not replace:
        raise FitError(f"a law named {law.name!r} is already registered; pass replace=True")
    keys = [p.key for p in law.params]
    if len(set(keys)) != len(keys):
        raise FitError(f"law {law.name!r} has duplicate parameter names")
    LAWS[law.name] = law
    return law


SHORT_NAMES = {"eq8": "upcycled_mul", "eq9": "upcycled_add", "eq12": "joint_upcycled",
               "chinchilla": "chinchilla"}
"""The names a spec's ``law:`` block uses (000 Eq. 8, 9, 12, 3) → registry names."""


def get_law(name: str) -> Law:
    name = SHORT_NAMES.get(name, name)
    if name not in LAWS:
        raise FitError(f"unknown law {name!r}; registered: {', '.join(sorted(LAWS))}")
    return LAWS[name]


register(Law("chinchilla", ("N", "D"),
             (_scale("A"), _exp("alpha"), _scale("B"), _exp("beta"), _E()),
             _chinchilla, "L = A·D^−α + B·N^−β + E", "000 Eq. 3"))
register(Law("chinchilla_d", ("D",), (_scale("A"), _exp("alpha"), _E()),
             _chinchilla_d,
             "L = A·D^−α + E", "000 Eq. 3 at one model size (B·N^−β folded into E)"))
register(Law("upcycled_mul", ("D1", "D2"),
             (_scale("A"), _exp("alpha1"), _exp("alpha2"), _inter("alpha3"), _E()),
             _upc_mul, "L = A·D1^−α1·D2^(−α2+α3·ln D1) + E", "000 Eq. 8"))
register(Law("upcycled_mul_noint", ("D1", "D2"),
             (_scale("A"), _exp("alpha1"), _exp("alpha2"), _E()),
             _upc_mul, "L = A·D1^−α1·D2^−α2 + E", "000 Eq. 8, α3 = 0"))
register(Law("upcycled_add", ("D1", "D2"),
             (_scale("A"), _exp("alpha1"), _scale("F"), _exp("alpha2"), _inter("alpha3"), _E()),
             _upc_add, "L = A·D1^−α1 + F·D2^(−α2+α3·ln D1) + E", "000 Eq. 9"))
register(Law("upcycled_add_noint", ("D1", "D2"),
             (_scale("A"), _exp("alpha1"), _scale("F"), _exp("alpha2"), _E()),
             _upc_add, "L = A·D1^−α1 + F·D2^−α2 + E", "000 Eq. 9, α3 = 0"))
register(Law("model_config_mul", ("P", "N2"),
             (_scale("A"), _exp("beta1"), _exp("beta2"), _inter("beta3"), _E()),
             _cfg_mul, "L = A·P^−β1·N2^(−β2+β3·ln P) + E", "000 Eq. 17"))
register(Law("model_config_mul_noint", ("P", "N2"),
             (_scale("A"), _exp("beta1"), _exp("beta2"), _E()),
             _cfg_mul, "L = A·P^−β1·N2^−β2 + E", "000 Eq. 17, β3 = 0"))
register(Law("model_config_add", ("P", "N2"),
             (_scale("A"), _exp("beta1"), _scale("F"), _exp("beta2"), _E()),
             _cfg_add, "L = A·P^−β1 + F·N2^−β2 + E", "000 Eq. 11 (Eq. 18, β3 = 0)"))
register(Law("model_config_add_int", ("P", "N2"),
             (_scale("A"), _exp("beta1"), _scale("F"), _exp("beta2"), _inter("beta3"), _E()),
             _cfg_add, "L = A·P^−β1 + F·N2^(−β2+β3·ln P) + E", "000 Eq. 18"))
register(Law("joint_upcycled", ("D1", "D2", "N1"),
             (_scale("A"), _exp("alpha1"), _exp("alpha2"), _inter("alpha3"), _scale("B"),
              _exp("beta"), _E()),
             _joint, "L = A·D1^−α1·D2^(−α2+α3·ln D1) + B·N1^−β + E", "000 Eq. 12"))

# 000 Table 2 (E = 0.165 shared; the MoE row is fitted against N1, not N2).
TABLE2 = {
    "dense": {"A": 8.83, "B": 12.3, "alpha": 0.088, "beta": 0.116, "E": 0.165},
    "moe": {"A": 32.0, "B": 7.05, "alpha": 0.161, "beta": 0.080, "E": 0.165},
    "upcycled": {"A": 16.3, "B": 8.53, "alpha1": 0.043, "alpha2": 0.085, "alpha3": 7.98e-4,
                 "beta": 0.112, "E": 0.165},
}

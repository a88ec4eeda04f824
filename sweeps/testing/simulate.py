"""A simulated trainable: a trial's final loss drawn from a known law plus noise of a stated size,
without training — for honest, fast tests and benchmarks of the law-driven searcher
(docs/law-search.md).

The truth is 000 Table 2 at one dense size N1 (:func:`table2_at`). A trial at (D1, D2) reports
L = L_true(D1, D2)·exp(σ·ε + σ_g·η): ε ~ N(0, 1) its own (σ = 0.01 is 1 % of the loss), η ~ N(0, 1)
shared by its *group* (``group=``: the WSD stable run or the parent it shares with others, whose
data order and initialisation correlate their errors). With ``group_length`` ℓ, η is a Gaussian
process over log2 D2 with correlation exp(−d²/2ℓ²) (findings §10 measured a parent's effect
fading so; :func:`_smooth` draws it, so any budget can be asked for in any order).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from ray import tune

from scaling.crossing import sign_changes
from scaling.laws import TABLE2, get_law


def table2_at(N1: float) -> tuple[dict[str, float], dict[str, float]]:
    """(upcycled Eq. 8 parameters, from-scratch chinchilla_d parameters) at dense size N1 from
    000 Table 2 (E' and E'' fold each row's B·N1^−β into E)."""
    u, m = TABLE2["upcycled"], TABLE2["moe"]
    upc = {"A": u["A"], "alpha1": u["alpha1"], "alpha2": u["alpha2"], "alpha3": u["alpha3"],
           "E": u["B"] * N1 ** -u["beta"] + u["E"]}
    scratch = {"A": m["A"], "alpha": m["alpha"], "E": m["B"] * N1 ** -m["beta"] + m["E"]}
    return upc, scratch


@dataclass(frozen=True)
class SimulatedStudy:
    """A known law and a noise level; :meth:`loss` is one trial's final loss."""

    N1: float = 1e9
    sigma: float = 0.01
    """Standard deviation of the noise in ln L."""
    seed: int = 0
    sigma_group: float = 0.0
    """Standard deviation in ln L of the noise shared by the trials of one group (see the module's
    docstring); 0: every trial's noise is its own."""
    group_length: float | None = None
    """Octaves of D2 over which the shared noise fades (module docstring); None: the same for
    every trial of the group."""

    def __post_init__(self) -> None:
        if self.group_length is not None and not self.group_length > 0:
            raise ValueError(f"group_length={self.group_length} must be > 0 octaves (or None)")

    @property
    def upcycled(self) -> dict[str, float]:
        return table2_at(self.N1)[0]

    @property
    def scratch(self) -> dict[str, float]:
        return table2_at(self.N1)[1]

    def true_loss(self, x: Mapping[str, float]) -> float:
        return float(get_law("upcycled_mul").predict(
            self.upcycled, {"D1": np.array([x["D1"]]), "D2": np.array([x["D2"]])})[0])

    def loss(self, x: Mapping[str, float], rep: int = 0, group: str | None = None) -> float:
        """The trial's final loss: the truth times exp(σ·ε + σ_g·η), ε fixed by (seed, point,
        rep), η by (seed, group)."""
        eps = _normal([self.seed, rep, sorted((k, float(v)) for k, v in x.items())])
        shared = 0.0
        if self.sigma_group and group is not None:
            key = [self.seed, "group", group]
            shared = self.sigma_group * (_normal(key) if self.group_length is None else
                                         _smooth(key, math.log2(x["D2"]), self.group_length))
        return self.true_loss(x) * math.exp(self.sigma * eps + shared)

    def loss_of(self, candidate) -> float:
        """:meth:`loss` of a :class:`sweeps.law.design.Candidate` (``run_design``'s evaluate);
        its WSD branch group is its noise group."""
        return self.loss(candidate.x, group=candidate.branch)

    def true_d_star(self, lo: float = 1e3, hi: float = 1e17) -> float | None:
        """000 Eq. 13 under the true laws."""
        sc, up = get_law("chinchilla_d"), get_law("upcycled_mul")

        def gaps(lnd):
            d = np.exp(np.atleast_1d(lnd))
            return sc.predict(self.scratch, {"D": d}) - up.predict(self.upcycled,
                                                                   {"D1": d, "D2": d})

        return sign_changes(lambda g: float(gaps(np.array([g]))[0]), lo, hi,
                            vectorized=gaps).value


FEATURES = 512
"""Random Fourier features of :func:`_smooth` (its correlations are within ~0.05 of the kernel)."""


def _smooth(key: Any, t: float, length: float) -> float:
    """A draw at ``t`` of a unit-variance Gaussian process with correlation exp(−d²/2ℓ²), fixed
    by ``key``: √(2/M)·Σ cos(ω_m t + b_m), ω ~ N(0, 1/ℓ²), b ~ U(0, 2π) (Rahimi & Recht 2007;
    E cos(ω d) = exp(−d²/2ℓ²))."""
    rng = _rng(key)
    w = rng.standard_normal(FEATURES) / length
    b = rng.uniform(0.0, 2 * math.pi, FEATURES)
    return float(math.sqrt(2.0 / FEATURES) * np.cos(w * t + b).sum())


def _rng(key: Any) -> np.random.Generator:
    """A generator fixed by a JSON-able key (the same key, the same draws)."""
    return np.random.default_rng(int(hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16],
                                     16))


def _normal(key: Any) -> float:
    """One standard normal draw fixed by a JSON-able key (the same key, the same draw)."""
    return float(_rng(key).standard_normal())


def simulated_trainable(study: SimulatedStudy, variables: Mapping[str, str],
                        metric: str = "val_loss"):
    """A Ray Tune function trainable that reports one simulated final loss: the law's variables
    are read from the trial config's keys in ``variables`` (e.g. D1 ← parent.tokens)."""
    def trainable(config: dict[str, Any]) -> None:
        x = {v: float(_dotted(config, k)) for v, k in variables.items()}
        tune.report({metric: study.loss(x, int(config.get("seed", 0) or 0)), **x})

    return trainable


def _dotted(config: Mapping[str, Any], key: str) -> Any:
    if key in config:
        return config[key]
    node: Any = config
    for part in key.split("."):
        node = node[part]
    return node

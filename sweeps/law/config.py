"""The spec's ``law:`` block (``algorithm: law``): a frozen :class:`LawSearchConfig`, decoded by the
project's one decoder (``moe_core.configio.decode``) like every other section. The block's old
shape is still read, with a one-line warning (:data:`OLD_SHAPE`; docs/law-search.md).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BeforeValidator

from moe_core.configio import coerce_number, decode
from moe_core.errors import SearchSpaceError, shown
from scaling.interval import AUTO, MAX_WIDEN, noise_model_name, resolve_widen
from sweeps.law.limits import check_law, finite_range

_err = SearchSpaceError  # the one-line refusals below


def _finite_range(v: Any) -> Any:
    """``law.dstar_range`` refused in the words of :func:`sweeps.law.limits.finite_range` before
    the decoder's generic 'not finite' (its bounds shown as written)."""
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        finite_range(*v)
    return v


Pairs = dict[str, Any] | tuple[tuple[str, float], ...]
"""A mapping of names to numbers in YAML; held as (name, value) pairs."""
Names = dict[str, Any] | tuple[tuple[str, str], ...]
"""A mapping of law variables to config keys in YAML; held as (variable, key) pairs."""
Box = dict[str, Any] | tuple[tuple[str, float, float], ...]
"""A mapping of config keys to [low, high] in YAML; held as (key, low, high) triples."""


def _numbers(raw: Any, key: str) -> tuple[tuple[str, float], ...]:
    """``{name: number}`` (or pairs) as (name, float) pairs, each a finite number."""
    out = []
    for k, v in (raw.items() if isinstance(raw, dict) else raw):
        v = coerce_number(v, f"{key}.{k}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise _err(f"{key}.{k}={shown(v)} must be a finite number")
        out.append((str(k), float(v)))
    return tuple(out)


def _names(raw: Any) -> tuple[tuple[str, str], ...]:
    return tuple((str(k), str(v)) for k, v in (raw.items() if isinstance(raw, dict) else raw))


def _box(raw: Any) -> tuple[tuple[str, float, float], ...]:
    if not isinstance(raw, dict):
        return tuple((str(k), float(lo), float(hi)) for k, lo, hi in raw)
    box = []
    for k, v in raw.items():
        v = [coerce_number(x) for x in v] if isinstance(v, (list, tuple)) else v
        if not isinstance(v, list) or len(v) != 2 or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            raise _err(f"law.box.{k}={shown(v)} must be [low, high], two numbers")
        box.append((str(k), float(v[0]), float(v[1])))
    return tuple(box)


LAW_NAMES = ("eq8", "eq9", "eq12", "chinchilla")
LAW_TARGETS = ("dstar", "alpha3", "loss_at")
LAW_VARIABLES = {"eq8": ("D1", "D2"), "eq9": ("D1", "D2"), "eq12": ("D1", "D2", "N1"),
                 "chinchilla": ("N", "D")}
"""The law's variables; D1 and D2 read the parent's and the trial's tokens by default."""
DEFAULT_VARIABLE_KEYS = {"D1": "parent.tokens", "D2": "tokens", "D": "tokens"}


def _widen_value(v: Any) -> Any:
    """``auto`` as is; anything else a number (``"1.35"`` from ``--set`` included)."""
    return v if v == AUTO else coerce_number(v)


@dataclass(frozen=True, slots=True)
class LawSearchConfig:
    """``algorithm: law``'s ``law:`` block (:mod:`sweeps.law`): which law to fit after
    every batch, the quantity whose bootstrap interval to shrink, the candidates and when to
    stop."""

    law: str = "eq8"
    """eq8 | eq9 | eq12 | chinchilla (000 Eq. 8, 9, 12, 3)."""
    target: str = "dstar"
    """dstar (000 Eq. 13) | alpha3 | loss_at (the predicted loss at ``loss_at``)."""
    loss_at: Pairs = ()
    """target loss_at: the point (law variable → value), e.g. ``loss_at: {D1: 2.0e9, D2:
    4.0e9}``."""
    variables: Names = ()
    """Law variable → the config key that sets it (D1: parent.tokens, D2: tokens, D: tokens by
    default; N, N1 must be given)."""
    candidates: str = "grid"
    """grid (the spec's grid points) | box (a log-spaced grid over ``box``)."""
    box: Box = ()
    """candidates box: each variable's config key → [low, high], e.g. ``box: {parent.tokens:
    [1.0e8, 1.0e10], tokens: [1.0e8, 1.0e10]}``."""
    points: int = 7
    """Candidates per axis of a box."""
    ci_width: float | None = 0.1
    """Stop when the target's interval is at most this wide, relative to its estimate."""
    max_trials: int | None = None
    """Stop after this many trials (default: as many as there are candidates)."""
    ci: float = 0.9
    """Level of the target's bootstrap interval."""
    bootstrap: int = 100
    """Bootstrap fits per refit."""
    noise: str = "groups"
    """groups: parametric bootstrap with noise shared by the trials of one parent, or of one WSD
    stable run where there is no parent (``scaling.bootstrap.group_noise_bootstrap``) |
    trials: resample trials as if independent (intervals too narrow when branches share a
    stable run)."""
    icc: float | None = None
    """Share of a trial's noise variance common to its group (``python -m analysis.noise`` on a
    replicated sweep measures it); None: estimated from each refit's residuals."""
    length: float | None = None
    """With noise groups: octaves of D2 over which a group's shared noise fades, correlation
    exp(−d²/2ℓ²) (``python -m analysis.noise`` fits it); None: the same for the whole group."""
    seed_trials: int | None = None
    """Size of the space-filling start (default: the law's free parameters + 2)."""
    batch: int = 2
    """Trials proposed per refit."""
    fix: Pairs = ()
    """Parameters held fixed, e.g. E from the from-scratch/dense joint fit (000 §5)."""
    scratch: Pairs = ()
    """From-scratch MoE law for ``dstar``: chinchilla_d's A, alpha, E at the sweep's N1
    (000 Eq. 3 at one size), or chinchilla's A, alpha, B, beta, E with eq12."""
    dstar_range: Annotated[tuple[float, float], BeforeValidator(_finite_range)] = (1e3, 1e17)
    """Token range searched for D* crossings (000 Eq. 13)."""
    widen: Annotated[float | str, BeforeValidator(_widen_value)] = AUTO
    """Calibrated widening of the target's interval: its ends moved this many times as far from
    the estimate in ln(target), before the stopping rule and in every report (the ``calibration``
    factor ``studies/law_search.py`` prints for the noise model; 1: as bootstrapped). ``auto``
    (default): the committed studies' factor for this search's noise model
    (``scaling.interval.CALIBRATED``: fading ×1.35, equicorrelated ×1.55, independent 1)."""

    @property
    def widen_factor(self) -> float:
        """The factor ``widen`` resolves to (``auto``: calibrated for the noise model)."""
        return resolve_widen(self.widen, noise_model_name(self.noise, self.length))[0]

    @property
    def widen_source(self) -> str:
        """Where the factor comes from: "given", or "auto: calibrated for ... noise"."""
        return resolve_widen(self.widen, noise_model_name(self.noise, self.length))[1]

    def __post_init__(self) -> None:
        for name in ("loss_at", "fix", "scratch"):
            object.__setattr__(self, name, _numbers(getattr(self, name), f"law.{name}"))
        object.__setattr__(self, "variables", _names(self.variables))
        if isinstance(self.widen, str) and self.widen != AUTO:  # "1e308" from --set
            object.__setattr__(self, "widen", _widen_value(self.widen))
        object.__setattr__(self, "box", _box(self.box))
        self._check()

    def _check(self) -> None:
        if self.law not in LAW_NAMES:
            raise _err(f"law.law={self.law!r} is not known; use one of {', '.join(LAW_NAMES)}")
        if self.target not in LAW_TARGETS:
            raise _err(f"law.target={self.target!r} is not known; use dstar, alpha3 or "
                       "loss_at (with loss_at: {D1: ..., D2: ...})")
        if self.target in ("dstar", "alpha3") and self.law == "chinchilla":
            raise _err(f"law.target={self.target} needs an upcycled law (eq8, eq9, eq12); "
                       "chinchilla has no D1 × D2 interaction")
        need = LAW_VARIABLES[self.law]
        if self.target == "loss_at" and sorted(k for k, _ in self.loss_at) != sorted(need):
            raise _err(f"law.loss_at must give {', '.join(need)} (the law's variables),"
                       f" got {', '.join(k for k, _ in self.loss_at) or 'nothing'}")
        if self.target == "dstar" and not self.scratch:
            raise _err("law.target=dstar needs law.scratch: the from-scratch MoE law's "
                       "parameters (A, alpha, E at this N1; fit them on baseline runs with "
                       "python -m analysis.fit BASELINE --law chinchilla_d)")
        keys = dict(self.variables)
        unknown = [v for v in keys if v not in need]
        if unknown:
            raise _err(f"law.variables.{unknown[0]}: {self.law} has no variable {unknown[0]}; "
                       f"its variables are {', '.join(need)}")
        missing = [v for v in need if v not in keys and v not in DEFAULT_VARIABLE_KEYS]
        if missing:
            raise _err(f"law.variables must say which config key sets {missing[0]}, e.g. "
                       f"law.variables: {{{missing[0]}: model.d_model}}")
        if self.noise not in ("groups", "trials"):
            raise _err(f"law.noise={self.noise!r}: use groups (noise shared by a stable run's "
                       "trials, the default) or trials (independent trials)")
        if self.icc is not None and not 0 <= self.icc <= 1:
            raise _err(f"law.icc={self.icc!r} must lie in [0, 1] (python -m analysis.noise "
                       "measures it), or be left out to estimate it from the residuals")
        if self.length is not None and not (self.length > 0 and self.noise == "groups"):
            raise _err(f"law.length={self.length!r} must be > 0 octaves of D2, with noise: "
                       "groups (python -m analysis.noise fits it), or be left out")
        if self.candidates not in ("grid", "box"):
            raise _err(f"law.candidates={self.candidates!r}: use grid, or box "
                       "(with box: {KEY: [low, high], ...} and points: 7)")
        if self.candidates == "box":
            for k, lo, hi in self.box:
                if not 0 < lo < hi:
                    raise _err(f"law.box.{k}=[{lo}, {hi}] needs 0 < low < high")
            if not isinstance(self.points, int) or self.points < 2:
                raise _err(f"law.points={self.points!r} must be an integer >= 2")
        if self.ci_width is None and self.max_trials is None:
            raise _err("law needs a stopping rule: ci_width (relative, e.g. 0.1), max_trials, "
                       "or both")
        if self.ci_width is not None and not self.ci_width > 0:
            raise _err(f"law.ci_width={self.ci_width} must be > 0 (relative to the estimate)")
        for name in ("max_trials", "seed_trials", "batch", "bootstrap"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise _err(f"law.{name}={v!r} must be an integer >= 1")
        if not 0 < self.ci < 1:
            raise _err(f"law.ci={self.ci} must lie in (0, 1), e.g. 0.9")
        if not 0 < self.dstar_range[0] < self.dstar_range[1]:
            raise _err(f"law.dstar_range={list(self.dstar_range)} needs 0 < low < high")
        if isinstance(self.widen, str):
            if self.widen != AUTO:
                raise _err(f"law.widen={self.widen!r}: use auto (the calibrated factor for "
                           "the noise model, the default) or a number >= 1")
        elif not self.widen >= 1:
            raise _err(f"law.widen={self.widen} must be >= 1 (a calibrated widening of the "
                       "target's interval)")
        elif not self.widen <= MAX_WIDEN:
            raise _err(f"law.widen={self.widen:g} must be at most {MAX_WIDEN:g} (a calibrated "
                       "widening is a few)")
        check_law(self)  # values, names, finite bounds, caps (sweeps.law.limits)

    def variable_keys(self) -> dict[str, str]:
        """Law variable → config key, defaults filled in."""
        keys = dict(self.variables)
        return {v: keys.get(v, DEFAULT_VARIABLE_KEYS.get(v, "")) for v in
                LAW_VARIABLES[self.law]}


OLD_SHAPE = ("warning: law.target: {loss_at: ...} and law.candidates: {box: ..., points: ...} "
             "are the old shape of the law block; write target: loss_at with loss_at: {...}, "
             "and candidates: box with box: {...} and points: N")


def _new_shape(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``law:`` mapping in the new shape: the old ``target: {loss_at: {...}}`` and
    ``candidates: {box: {...}, points: N}`` become plain keys (with :data:`OLD_SHAPE` on
    stderr); the bounds of ``dstar_range`` become floats, as they were always held."""
    raw, old = dict(raw), False
    target = raw.get("target")
    if isinstance(target, dict):
        if set(target) != {"loss_at"} or "loss_at" in raw:
            raise _err("law.target must be dstar, alpha3 or loss_at (with loss_at: {D1: ..., "
                       "D2: ...}); the old shape {loss_at: {D1: ..., D2: ...}} is also read")
        raw.update(target="loss_at", loss_at=target["loss_at"])
        old = True
    cands = raw.get("candidates")
    if isinstance(cands, dict):
        if set(cands) - {"box", "points"} or "box" not in cands or "box" in raw or \
                "points" in raw:
            raise _err("law.candidates must be grid or box (with box: {KEY: [low, high], ...} "
                       "and points: 7); the old shape {box: {...}, points: 7} is also read")
        raw.update(candidates="box", **cands)
        old = True
    if old:
        print(OLD_SHAPE, file=sys.stderr)
    r = raw.get("dstar_range")
    if isinstance(r, list) and all(isinstance(coerce_number(x), (int, float)) and
                                   not isinstance(x, bool) for x in r):
        raw["dstar_range"] = [float(coerce_number(x)) for x in r]
    return raw


def parse_law_block(raw: Any) -> LawSearchConfig:
    """The spec's ``law:`` mapping as a validated :class:`LawSearchConfig` (``decode``)."""
    if not isinstance(raw, dict):
        raise _err("law must be a mapping, e.g. {law: eq8, target: dstar, ci_width: 0.1}")
    return decode(LawSearchConfig, _new_shape(raw), "law", SearchSpaceError)

"""Sweep specs: YAML → validated frozen dataclasses, before Ray starts.

A spec has a ``base`` trial config (the ``moe_core.train`` format), a ``search`` space over dotted
keys of it, and how to search (algorithm, scheduler, samples, resources, logging, results).
Every rule raises ``SearchSpaceError`` naming the YAML key and the fix.
"""

from __future__ import annotations

import ast
import copy
import itertools
import math
import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from moe_core.config import decode_value, from_mapping, unknown_key
from moe_core.errors import ConfigError, SearchSpaceError, shown
from moe_core.train.config import (
    TrainConfig,
    apply_overrides,
    coerce_number,
    load_yaml,
    parse_override_value,
    train_config_from_dict,
)
from scaling.predict import METHODS as PREDICTORS
from sweeps.limits import check_law
from sweeps.prune import PruneConfig, parse_prune
from sweeps.storage import check_uri, is_url, join_uri

DISTRIBUTIONS = ("grid", "choice", "uniform", "loguniform", "int", "expr")
ALGORITHMS = ("grid", "random", "optuna", "law")
SCHEDULERS = ("fifo", "asha")
TOP_KEYS = {
    "sweep", "description", "base", "search", "algorithm", "scheduler", "num_samples",
    "metric", "mode", "resources", "max_concurrent", "logging", "results", "failure", "seeds",
    "wsd_branches", "storage", "checkpoint", "export", "prune", "law",
}
EXPORTS = ("hf",)
"""``export: hf``: each trial writes its final model as a Hugging Face checkpoint
(``moe_core.hf.save_moe``) under ``<results>/<sweep>/export/<trial_id>/``."""

MAX_TRIALS = 10_000
"""Most trials a spec may define (grid points × seeds × num_samples), and most trial configs
validation builds (grid points × every value or bound of the sampled knobs)."""
MAX_EXPR_CHARS = 500
EXPR_MAX_VALUE = 1e18
"""Largest magnitude an ``expr`` operand or result may have."""
EXPR_MAX_EXPONENT = 64
"""Largest magnitude of an exponent in ``expr`` (``9**9**9**9`` would never finish)."""


def _err(msg: str) -> SearchSpaceError:
    return SearchSpaceError(msg)


@dataclass(frozen=True, slots=True)
class Param:
    """One searched knob: a dotted key into the base config and its distribution."""

    key: str
    """Dotted key into the trial config (``base``) the knob sets."""
    kind: str
    """grid | choice | uniform | loguniform | int | expr"""
    values: tuple[Any, ...] = ()
    """grid/choice values; (low, high) for uniform/loguniform/int."""
    expr: str | None = None
    """expr: arithmetic over other knobs, e.g. ``2 * moe.granularity``."""
    when: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    """Conditional: the knob applies only when every (key, allowed values) holds."""

    def applies(self, config: dict[str, Any]) -> bool:
        return all(get_dotted(config, k) in allowed for k, allowed in self.when)


@dataclass(frozen=True, slots=True)
class AshaConfig:
    grace_period: int = 2
    """Evaluations a trial gets before it can be stopped."""
    reduction_factor: float = 3.0
    """ASHA keeps 1/reduction_factor of the trials at each rung."""
    max_t: int | None = None
    """Evaluations of the longest trial; None = derived from the base config."""
    rung_metric: str | None = None
    """What ASHA compares at its rungs: None = the spec's ``metric``; ``predicted_final`` = the
    loss each trial is predicted to reach after its WSD decay (``scaling.predict``)."""
    predictor: str = "multi_power"
    """rung_metric predicted_final: ``multi_power`` | ``branch_gain`` | ``ratio``."""
    calibration: str | None = None
    """rung_metric predicted_final: results (a ``results.parquet`` or a sweep directory) of
    finished WSD runs the predictor's shared parameters are fitted on before the sweep."""

    def __post_init__(self) -> None:
        if self.rung_metric not in (None, "predicted_final"):
            raise SearchSpaceError(
                f"scheduler.rung_metric={self.rung_metric!r} is not known; use predicted_final "
                "(or leave it out to compare trials on the spec's metric)")
        if self.predictor not in PREDICTORS:
            raise SearchSpaceError(f"scheduler.predictor={self.predictor!r} is not known; use "
                                   f"one of {', '.join(PREDICTORS)}")
        if self.rung_metric == "predicted_final" and not self.calibration:
            raise SearchSpaceError(
                "scheduler.rung_metric=predicted_final needs scheduler.calibration: the results "
                "of finished WSD runs (e.g. results/upcycle_lr) to fit the predictor on")
        if self.grace_period < 1:
            raise SearchSpaceError(f"scheduler.grace_period={self.grace_period} must be >= 1")
        if not self.reduction_factor > 1:
            raise SearchSpaceError(
                f"scheduler.reduction_factor={self.reduction_factor} must be > 1 (ASHA keeps "
                "1/reduction_factor of the trials at each rung)")
        if self.max_t is not None and self.max_t < 1:
            raise SearchSpaceError(f"scheduler.max_t={self.max_t} must be >= 1, or null")


@dataclass(frozen=True, slots=True)
class FailureConfig:
    max_failures: int = 2
    """Retries of a failed trial."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_failures, int) or self.max_failures < 0:
            raise SearchSpaceError(
                f"failure.max_failures={self.max_failures!r} must be an integer >= 0")


@dataclass(frozen=True, slots=True)
class Resources:
    cpus: float = 1.0
    """CPUs each trial (each rank of a multi-rank trial) reserves."""
    gpus: float | Literal["auto"] = "auto"
    """GPUs each trial rank, parent task and stable-run task reserves; ``auto``: 1 when the Ray
    cluster has GPUs, else 0 (``sweeps.resources``); fractions share a GPU (0.5: two trials per
    GPU)."""
    ranks: int = 1
    """>1: the trial runs as a multi-rank DeepSpeed job (Ray Train TorchTrainer)."""
    trial_driver: float = 0.0
    """> 0: each trial's driver bundle also asks for this much of the custom resource
    ``trial_driver`` (only on-demand nodes have it in sweeps/cluster/*.yaml), keeping trial
    drivers off spot nodes (``sweeps.preflight.custom_resources``); 0: off."""


@dataclass(frozen=True, slots=True)
class CheckpointSpec:
    """When a trial attaches a checkpoint (model + optimizer + RNG) to an eval report. Every
    eval is reported; a checkpoint is written only when one of these says so, and always at
    the trial's last step. A failed trial restarts from its last checkpoint and replays the
    evals after it (bit for bit on CPU: its rows are overwritten with equal values)."""

    every_evals: int | None = None
    """Every n-th eval of the trial (by step: at multiples of n·``eval.every_steps``)."""
    every_minutes: float | None = 10.0
    """At the first eval ``every_minutes`` after the trial's start or its last checkpoint: the
    default bounds the work a failure loses to about 10 minutes per trial, whatever the eval
    period, while a large model does not write (model + 2 Adam moments, 12-14 bytes per
    parameter) at every eval."""
    keep: int = 1
    """Checkpoints Tune keeps per trial (``CheckpointConfig(num_to_keep=keep)``)."""
    at_end: bool = True
    """Also at the last step: the final weights of every trial are kept (one checkpoint per
    trial stays on disk after the sweep; ``--dry-run`` prints how much)."""

    def __post_init__(self) -> None:
        if self.every_evals is not None and (not isinstance(self.every_evals, int) or
                                             self.every_evals < 1):
            raise SearchSpaceError(
                f"checkpoint.every_evals={self.every_evals!r} must be an integer >= 1 or null")
        if self.every_minutes is not None and not self.every_minutes > 0:
            raise SearchSpaceError(
                f"checkpoint.every_minutes={self.every_minutes!r} must be > 0 or null")
        if not isinstance(self.keep, int) or self.keep < 1:
            raise SearchSpaceError(f"checkpoint.keep={self.keep!r} must be an integer >= 1")


@dataclass(frozen=True, slots=True)
class StorageConfig:
    """Where a sweep keeps what it trains besides the results, and how often it writes."""

    parent_cache: str | None = None
    """Directory of cached parents (content-hashed); None = ``<results>/<sweep>/parents``.
    Point several sweeps at one directory to share parents across them."""
    flush_s: float = 10.0
    """Seconds between rewrites of ``results.parquet`` while trials report (a trial's end
    always flushes)."""

    def __post_init__(self) -> None:
        if not self.flush_s >= 0:
            raise SearchSpaceError(f"storage.flush_s={self.flush_s} must be >= 0")
        if self.parent_cache is not None:
            check_uri(self.parent_cache, "storage.parent_cache")


@dataclass(frozen=True, slots=True)
class WandbConfig:
    enabled: bool = True
    """false: no W&B logging at all."""
    project: str = "upcycle-sweeps"
    """W&B project of the sweep's runs."""
    group: str | None = None
    """Default: the sweep name."""
    mode: str = "offline"
    """offline (default; ``wandb sync`` later), online, disabled."""
    entity: str | None = None
    """W&B entity (team or user); None = wandb's default."""


LAW_NAMES = ("eq8", "eq9", "eq12", "chinchilla")
LAW_TARGETS = ("dstar", "alpha3", "loss_at")
LAW_VARIABLES = {"eq8": ("D1", "D2"), "eq9": ("D1", "D2"), "eq12": ("D1", "D2", "N1"),
                 "chinchilla": ("N", "D")}
"""The law's variables; D1 and D2 read the parent's and the trial's tokens by default."""
DEFAULT_VARIABLE_KEYS = {"D1": "parent.tokens", "D2": "tokens", "D": "tokens"}


@dataclass(frozen=True, slots=True)
class LawSearchConfig:
    """``algorithm: law``'s ``law:`` block (:mod:`sweeps.law`): which law to fit after
    every batch, the quantity whose bootstrap interval to shrink, the candidates and when to
    stop."""

    law: str = "eq8"
    """eq8 | eq9 | eq12 | chinchilla (000 Eq. 8, 9, 12, 3)."""
    target: str = "dstar"
    """dstar (000 Eq. 13) | alpha3 | loss_at (the predicted loss at ``loss_at``)."""
    loss_at: tuple[tuple[str, float], ...] = ()
    """target loss_at: the point (law variable → value), YAML ``target: {loss_at: {D1: ..., D2:
    ...}}``."""
    variables: tuple[tuple[str, str], ...] = ()
    """Law variable → the config key that sets it (D1: parent.tokens, D2: tokens, D: tokens by
    default; N, N1 must be given)."""
    candidates: str = "grid"
    """grid (the spec's grid points) | box (a log-spaced grid over ``box``)."""
    box: tuple[tuple[str, float, float], ...] = ()
    """candidates box: each variable's key → [low, high], YAML ``candidates: {box: {parent.tokens:
    [lo, hi], tokens: [lo, hi]}, points: 7}``."""
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
    stable run where there is no parent (``scaling.fit.group_noise_bootstrap``) |
    trials: resample trials as if independent (intervals too narrow when branches share a
    stable run)."""
    icc: float | None = None
    """Share of a trial's noise variance common to its group (``python -m analysis.noise`` on a
    replicated sweep measures it); None: estimated from each refit's residuals."""
    length: float | None = None
    """With noise groups: octaves of D2 over which a group's shared noise fades, correlation
    exp(−d²/2ℓ²) (``python -m analysis.noise`` fits it); None: the same for the whole group."""
    widen: float = 1.0
    """Calibrated widening of the target's interval: its ends moved this many times as far from
    the estimate in ln(target), before the stopping rule and in every report (the ``calibration``
    factor ``studies/law_search.py`` prints for the noise model; 1: as bootstrapped)."""
    seed_trials: int | None = None
    """Size of the space-filling start (default: the law's free parameters + 2)."""
    batch: int = 2
    """Trials proposed per refit."""
    fix: tuple[tuple[str, float], ...] = ()
    """Parameters held fixed, e.g. E from the from-scratch/dense joint fit (000 §5)."""
    scratch: tuple[tuple[str, float], ...] = ()
    """From-scratch MoE law for ``dstar``: chinchilla_d's A, alpha, E at the sweep's N1
    (000 Eq. 3 at one size), or chinchilla's A, alpha, B, beta, E with eq12."""
    dstar_range: tuple[float, float] = (1e3, 1e17)
    """Token range searched for D* crossings (000 Eq. 13)."""

    def __post_init__(self) -> None:
        if self.law not in LAW_NAMES:
            raise _err(f"law.law={self.law!r} is not known; use one of {', '.join(LAW_NAMES)}")
        if self.target not in LAW_TARGETS:
            raise _err(f"law.target={self.target!r} is not known; use dstar, alpha3 or "
                       "{loss_at: {D1: ..., D2: ...}}")
        if self.target in ("dstar", "alpha3") and self.law == "chinchilla":
            raise _err(f"law.target={self.target} needs an upcycled law (eq8, eq9, eq12); "
                       "chinchilla has no D1 × D2 interaction")
        need = LAW_VARIABLES[self.law]
        if self.target == "loss_at" and sorted(k for k, _ in self.loss_at) != sorted(need):
            raise _err(f"law.target.loss_at must give {', '.join(need)} (the law's variables),"
                       f" got {', '.join(k for k, _ in self.loss_at) or 'nothing'}")
        if self.target == "dstar" and not self.scratch:
            raise _err("law.target=dstar needs law.scratch: the from-scratch MoE law's "
                       "parameters (A, alpha, E at this N1; fit them on baseline runs with "
                       "python -m analysis.fit BASELINE --law chinchilla_d)")
        keys = dict(self.variables)
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
        if isinstance(self.widen, bool) or not isinstance(self.widen, (int, float)) or \
                not self.widen >= 1:
            raise _err(f"law.widen={self.widen!r} must be >= 1 (a calibrated widening of the "
                       "target's interval)")
        if self.candidates not in ("grid", "box"):
            raise _err(f"law.candidates={self.candidates!r}: use grid, or "
                       "{box: {KEY: [low, high], ...}, points: 7}")
        if self.candidates == "box":
            for k, lo, hi in self.box:
                if not 0 < lo < hi:
                    raise _err(f"law.candidates.box.{k}=[{lo}, {hi}] needs 0 < low < high")
            if not isinstance(self.points, int) or self.points < 2:
                raise _err(f"law.candidates.points={self.points!r} must be an integer >= 2")
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
        check_law(self)  # values, names, finite bounds, caps (sweeps.limits)

    def variable_keys(self) -> dict[str, str]:
        """Law variable → config key, defaults filled in."""
        keys = dict(self.variables)
        return {v: keys.get(v, DEFAULT_VARIABLE_KEYS.get(v, "")) for v in
                LAW_VARIABLES[self.law]}


def _numbers(raw: Any, key: str) -> tuple[tuple[str, float], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise _err(f"{key} must map names to numbers")
    out = []
    for k, v in raw.items():
        v = coerce_number(v, f"{key}.{k}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise _err(f"{key}.{k}={shown(v)} must be a finite number")
        out.append((str(k), float(v)))
    return tuple(out)


def parse_law_block(raw: Any) -> LawSearchConfig:
    """The spec's ``law:`` mapping as a validated :class:`LawSearchConfig`."""
    if not isinstance(raw, dict):
        raise _err("law must be a mapping, e.g. {law: eq8, target: dstar, ci_width: 0.1}")
    known = {"law", "target", "variables", "candidates", "ci_width", "max_trials", "ci",
             "bootstrap", "seed_trials", "batch", "fix", "scratch", "dstar_range", "noise",
             "icc", "length", "widen"}
    unknown = sorted(set(raw) - known, key=str)
    if unknown:
        raise _err(f"unknown key law.{unknown[0]}; known: {', '.join(sorted(known))}")
    kw: dict[str, Any] = {}
    target = raw.get("target", "dstar")
    if isinstance(target, dict):
        if set(target) != {"loss_at"}:
            raise _err("law.target as a mapping must be {loss_at: {D1: ..., D2: ...}}")
        kw["target"], kw["loss_at"] = "loss_at", _numbers(target["loss_at"], "law.target.loss_at")
    else:
        kw["target"] = str(target)
    cands = raw.get("candidates", "grid")
    if isinstance(cands, dict):
        extra = sorted(set(cands) - {"box", "points"})
        if extra or "box" not in cands or not isinstance(cands["box"], dict):
            raise _err("law.candidates must be grid, or {box: {KEY: [low, high], ...}, "
                       "points: 7}")
        box = []
        for k, v in cands["box"].items():
            if not isinstance(v, list) or len(v) != 2:
                raise _err(f"law.candidates.box.{k} must be [low, high]")
            lo, hi = (float(coerce_number(x, f"law.candidates.box.{k}")) for x in v)
            box.append((str(k), lo, hi))
        kw.update(candidates="box", box=tuple(box), points=cands.get("points", 7))
    else:
        kw["candidates"] = str(cands)
    variables = raw.get("variables") or {}
    if not isinstance(variables, dict):
        raise _err("law.variables must map law variables to config keys, e.g. {D1: "
                   "parent.tokens}")
    kw["variables"] = tuple((str(k), str(v)) for k, v in variables.items())
    kw["fix"] = _numbers(raw.get("fix"), "law.fix")
    kw["scratch"] = _numbers(raw.get("scratch"), "law.scratch")
    for k in ("law", "ci_width", "max_trials", "ci", "bootstrap", "seed_trials", "batch", "noise",
              "icc", "length", "widen"):
        if k in raw:
            v = raw[k]
            kw[k] = str(v) if k in ("law", "noise") else (
                None if v is None else coerce_number(v, f"law.{k}"))
    if "dstar_range" in raw:
        r = raw["dstar_range"]
        if not isinstance(r, list) or len(r) != 2:
            raise _err("law.dstar_range must be [low, high] in tokens")
        kw["dstar_range"] = tuple(float(coerce_number(x, "law.dstar_range")) for x in r)
    for k in ("ci", "ci_width", "icc", "length"):
        if kw.get(k) is not None and not isinstance(kw[k], (int, float)):
            raise _err(f"law.{k}={shown(kw[k])} must be a number")
    return LawSearchConfig(**kw)


@dataclass(frozen=True, slots=True)
class SweepSpec:
    name: str
    """YAML ``sweep:`` (required): the sweep's name, letters, digits, - and _: the results
    directory ``<results>/<name>/`` and the W&B group."""
    base: dict[str, Any]
    """The trial config, a full training config (the ``base`` keys below); every knob of ``search``
    is a dotted key into it."""
    search: tuple[Param, ...]
    """Knobs: dotted key into ``base`` → one distribution (``grid``, ``choice``, ``uniform``,
    ``loguniform``, ``int``, ``expr``), optionally with ``when: {key: value}``."""
    algorithm: str = "grid"
    """``grid`` (every grid point), ``random``, ``optuna`` (TPE; GridSampler if every knob is a
    grid) or ``law`` (``law:`` block: trials picked from the fitted scaling law)."""
    scheduler: str = "fifo"
    """``fifo`` or ``asha``; the mapping form ``{kind: asha, grace_period: ..., ...}`` also sets
    the ASHA keys below."""
    asha: AshaConfig = field(default_factory=AshaConfig)
    """ASHA's settings, the keys of the ``scheduler:`` mapping besides ``kind``."""
    num_samples: int = 1
    """Samples per grid point (random, optuna)."""
    metric: str = "val_loss"
    """The reported column trials are ranked by (and ASHA compares, unless ``rung_metric``)."""
    mode: str = "min"
    """``min`` or ``max``: whether a lower or a higher ``metric`` is better."""
    resources: Resources = field(default_factory=Resources)
    """What each trial reserves on the cluster."""
    max_concurrent: int | None = None
    """Trials running at once; null = cluster CPUs (and GPUs) / what one trial reserves."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """YAML ``logging: {wandb: ...}``: one W&B run per trial, grouped by the sweep."""
    results: str = "results"
    """Results root: the sweep writes ``<results>/<sweep>/`` (shared storage on a cluster)."""
    max_failures: int = 2
    """YAML ``failure: {max_failures: n}``: retries of a failed trial, each from its last
    checkpoint."""
    seeds: tuple[int, ...] = ()
    """Repeat every configuration with each of these seeds (a grid over ``seed``)."""
    description: str = ""
    """Free text, shown by ``--dry-run``."""
    path: str = ""
    """The spec file it was read from (set by the loader, not a YAML key)."""
    storage: StorageConfig = field(default_factory=StorageConfig)
    """Parent cache location and results write cadence."""
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    """Which eval reports carry a checkpoint."""
    wsd_branches: bool = True
    """Trials differing only in ``tokens`` share one WSD stable run and branch off it (000
    §3.1); results are identical to training each budget on its own."""
    export: str | None = None
    """``hf``: each finished trial exports its final model next to the results
    (``export/<trial_id>/``, Mixtral / Qwen2-MoE / Llama; see ``moe_core.hf``). None = off."""
    prune: PruneConfig = field(default_factory=PruneConfig)
    """Health rules (``sweeps.prune``): a trial is stopped and recorded as pruned when one
    fires."""
    law: LawSearchConfig | None = None
    """``algorithm: law``'s settings (:class:`LawSearchConfig`)."""

    @property
    def base_config(self) -> TrainConfig:
        return train_config_from_dict(self.base)

    @property
    def results_uri(self) -> str:
        """``<results>/<sweep>``: a local path or an object-storage URL (``sweeps.storage``)."""
        return join_uri(self.results, self.name)

    @property
    def results_dir(self) -> Path:
        """The local results folder; object storage has none (use ``results_uri``)."""
        if is_url(self.results):
            raise ConfigError(f"results={self.results} is object storage, not a local folder: "
                              "this code path must use spec.results_uri (sweeps.storage)")
        return Path(self.results) / self.name

    def grid_params(self) -> list[Param]:
        return [p for p in self.search if p.kind == "grid"]

    def sampled_params(self) -> list[Param]:
        return [p for p in self.search if p.kind in ("choice", "uniform", "loguniform", "int")]


# ---- dotted keys -------------------------------------------------------------------------------


def get_dotted(config: dict[str, Any], key: str, default: Any = None) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def set_dotted(config: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = config
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = value


# ---- safe arithmetic for expr knobs -------------------------------------------------------------

_OPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow,
    ast.Mod: operator.mod, ast.USub: operator.neg,
}


def eval_expr(expr: str, config: dict[str, Any], key: str) -> Any:
    """Evaluate ``expr`` (numbers, + - * / // % **, min, max, round, int and dotted config keys).

    Bounded: every operand and result is a finite number of magnitude at most
    ``EXPR_MAX_VALUE``, exponents at most ``EXPR_MAX_EXPONENT``; any error (division by zero,
    ``min()``, a key that holds text) is one ``SearchSpaceError`` naming ``search.<key>.expr``.
    """
    where = f"search.{key}.expr={shown(expr, 100)}"
    if not isinstance(expr, str) or len(expr) > MAX_EXPR_CHARS:
        raise _err(f"{where} must be a string of at most {MAX_EXPR_CHARS} characters")
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise _err(f"{where} is not an arithmetic expression") from None

    def name_of(node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            inner = name_of(node.value)
            return f"{inner}.{node.attr}" if inner else None
        return None

    def number(v: Any, what: str) -> Any:
        v = coerce_number(v)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _err(f"{where}: {what}={shown(v, 60)} is not a number")
        if not (math.isfinite(v) and abs(v) <= EXPR_MAX_VALUE):
            raise _err(f"{where}: {what} is {shown(v, 60)}, beyond ±{EXPR_MAX_VALUE:g}")
        return v

    def power(a: Any, b: Any) -> Any:
        if abs(b) > EXPR_MAX_EXPONENT:
            raise _err(f"{where}: the exponent {b} is beyond ±{EXPR_MAX_EXPONENT}")
        return a ** b

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return number(node.value, "a constant")
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            op = power if isinstance(node.op, ast.Pow) else _OPS[type(node.op)]
            return number(op(ev(node.left), ev(node.right)), "a result")
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return number(_OPS[type(node.op)](ev(node.operand)), "a result")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("min", "max", "round", "int") and not node.keywords:
            args = [ev(a) for a in node.args]
            if node.func.id == "round" and len(args) == 2 and abs(args[1]) > EXPR_MAX_EXPONENT:
                raise _err(f"{where}: round to {args[1]} digits is beyond ±{EXPR_MAX_EXPONENT}")
            fn = {"min": min, "max": max, "round": round, "int": int}[node.func.id]
            return number(fn(*args), "a result")
        dotted = name_of(node)
        if dotted is not None:
            v = get_dotted(config, dotted)
            if v is None:
                raise _err(f"{where} refers to {dotted}, which is not set")
            return number(v, dotted)
        raise _err(f"{where}: only arithmetic on numbers and config keys")

    try:
        return ev(tree)
    except (ArithmeticError, TypeError, ValueError, RecursionError) as e:
        if isinstance(e, SearchSpaceError):
            raise
        raise _err(f"{where} cannot be evaluated: {type(e).__name__}: {shown(str(e), 80)[1:-1]}; "
                   "fix the expression") from None


# ---- parsing ------------------------------------------------------------------------------------


def _parse_param(key: str, raw: Any) -> Param:
    if not isinstance(key, str) or not all(key.split(".")) or key != key.strip():
        raise _err(f"search key {shown(key, 100)} must be a dotted key of the trial config, "
                   "such as optim.lr")
    problem = unknown_key(TrainConfig, key)
    if problem is not None:
        raise _err(f"search.{key}: {problem}")
    if not isinstance(raw, dict):
        # shorthand: a list is a grid
        if isinstance(raw, list):
            raw = {"grid": raw}
        else:
            raise _err(f"search.{key} must be a mapping like {{grid: [...]}} or a list")
    when_raw = raw.get("when", {})
    kinds = [k for k in raw if k in DISTRIBUTIONS]
    unknown = [k for k in raw if k not in DISTRIBUTIONS and k != "when"]
    if unknown:
        raise _err(
            f"search.{key}.{unknown[0]} is not known; use one of {', '.join(DISTRIBUTIONS)} "
            "(and optionally when)"
        )
    if len(kinds) != 1:
        raise _err(f"search.{key} needs exactly one of {', '.join(DISTRIBUTIONS)}")
    kind = kinds[0]
    v = raw[kind]
    if not isinstance(when_raw, dict):
        raise _err(f"search.{key}.when must map config keys to allowed values")
    for wk, wv in when_raw.items():
        problem = unknown_key(TrainConfig, wk) if isinstance(wk, str) and all(wk.split(".")) \
            else f"{shown(wk, 100)} is not a dotted key"
        if problem is not None:
            raise _err(f"search.{key}.when: {problem}; a condition names a key of the trial "
                       "config (or another knob)")
        if not all(x is None or isinstance(x, (str, int, float))
                   for x in (wv if isinstance(wv, list) else [wv])):
            raise _err(f"search.{key}.when.{wk}={shown(wv, 100)} must be a value or a list of "
                       "values (numbers, strings, true/false, null)")
    when = tuple(
        (wk, tuple(coerce_number(x, wk) for x in (wv if isinstance(wv, list) else [wv])))
        for wk, wv in when_raw.items()
    )
    if kind == "expr":
        if not isinstance(v, str):
            raise _err(f"search.{key}.expr must be a string such as '2 * moe.granularity'")
        return Param(key=key, kind=kind, expr=v, when=when)
    if kind in ("grid", "choice"):
        if not isinstance(v, list) or not v:
            raise _err(f"search.{key}.{kind} must be a non-empty list of values")
        return Param(key=key, kind=kind, values=tuple(coerce_number(x, key) for x in v),
                     when=when)
    if not isinstance(v, list) or len(v) != 2:
        raise _err(f"search.{key}.{kind} must be [low, high]")
    lo, hi = (coerce_number(x, key) for x in v)
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (lo, hi)):
        raise _err(f"search.{key}.{kind}={v} must be two numbers")
    if not lo < hi:
        raise _err(f"search.{key}.{kind}: low={lo} must be < high={hi}")
    if kind == "loguniform" and lo <= 0:
        raise _err(f"search.{key}.loguniform needs low > 0, got {lo}")
    if kind == "int" and not (float(lo).is_integer() and float(hi).is_integer()):
        raise _err(f"search.{key}.int bounds must be integers, got {v}")
    return Param(key=key, kind=kind, values=(lo, hi), when=when)


def _choice(raw: dict, key: str, allowed: tuple[str, ...], default: str) -> str:
    v = raw.get(key, default)
    if isinstance(v, dict):
        v = v.get("kind", default)
    if v not in allowed:
        raise _err(f"{key}={v!r} is not known; use one of {', '.join(allowed)}")
    return v


def _sub(cls: type, raw: Any, key: str) -> Any:
    """A spec section (``resources``, ``logging.wandb``, the ``scheduler`` mapping) decoded by
    ``moe_core.config.from_mapping``; null means the defaults. A ``kind`` key is dropped (the
    ``scheduler: {kind: asha, ...}`` form; ``_choice`` reads it)."""
    if raw is None:
        return cls()
    if isinstance(raw, dict):
        raw = {k: v for k, v in raw.items() if k != "kind"}
    try:
        return from_mapping(cls, raw, key)
    except ConfigError as e:
        raise _err(str(e)) from None


def _value(raw: dict, key: str, tp: Any, default: Any) -> Any:
    """Top-level ``key`` decoded as a field of type ``tp`` (``moe_core.config.decode_value``);
    missing or null means ``default``. Text keys keep their ``str()`` form as before."""
    v = raw.get(key)
    if v is None:
        return default
    try:
        out = decode_value(tp, v, key)
    except ConfigError as e:
        raise _err(str(e)) from None
    return str(out) if tp is str else out


def parse_spec(raw: dict[str, Any], *, path: str = "") -> SweepSpec:
    """Validate a spec mapping (after overrides) into a SweepSpec; see :func:`validate`."""
    unknown = sorted(set(raw) - TOP_KEYS, key=str)
    if unknown:
        raise _err(f"unknown top-level key {shown(unknown[0], 100)}; known: "
                   f"{', '.join(sorted(TOP_KEYS))}")
    name = raw.get("sweep")
    if not isinstance(name, str) or not name.replace("-", "_").isidentifier() or len(name) > 100:
        raise _err(f"sweep={shown(name, 100)} must be a name of letters, digits, - and _, at most "
                   "100 characters (the results directory and W&B group use it)")
    base = raw.get("base")
    if not isinstance(base, dict):
        raise _err("base must be a mapping: the trial config (see configs/train_debug.yaml)")
    search_raw = raw.get("search") or {}
    if not isinstance(search_raw, dict):
        raise _err("search must map dotted config keys to distributions")
    search = tuple(_parse_param(k, v) for k, v in search_raw.items())
    algorithm = _choice(raw, "algorithm", ALGORITHMS, "grid")
    scheduler = _choice(raw, "scheduler", SCHEDULERS, "fifo")
    asha = _sub(AshaConfig, raw.get("scheduler") if isinstance(raw.get("scheduler"), dict)
                else None, "scheduler")
    num_samples = coerce_number(raw.get("num_samples", 1), "num_samples")
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise _err(f"num_samples={shown(num_samples)} must be an integer >= 1")
    mode = raw.get("mode", "min")
    if mode not in ("min", "max"):
        raise _err(f"mode={shown(mode)} must be 'min' or 'max'")
    log = raw.get("logging") or {}
    if not isinstance(log, dict):
        raise _err("logging must be a mapping")
    unknown_log = sorted(set(log) - {"wandb"})
    if unknown_log:
        raise _err(f"unknown key logging.{unknown_log[0]}; known: wandb")
    wandb = _sub(WandbConfig, log.get("wandb"), "logging.wandb")
    if wandb.mode not in ("offline", "online", "disabled"):
        raise _err(f"logging.wandb.mode={wandb.mode!r} must be offline, online or disabled")
    max_failures = _sub(FailureConfig, raw.get("failure"), "failure").max_failures
    seeds = _value(raw, "seeds", tuple[int, ...], ())
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise _err(f"seeds={shown(list(seeds))} repeats {repeated[0]}; list each seed once")
    max_conc = raw.get("max_concurrent")
    if max_conc is not None and (isinstance(max_conc, bool) or not isinstance(max_conc, int)
                                 or max_conc < 1):
        raise _err(f"max_concurrent={shown(max_conc)} must be an integer >= 1 or null")
    spec = SweepSpec(
        name=name, base=base, search=search, algorithm=algorithm, scheduler=scheduler,
        asha=asha, num_samples=num_samples, metric=_value(raw, "metric", str, "val_loss"),
        mode=mode, resources=_sub(Resources, raw.get("resources"), "resources"),
        max_concurrent=max_conc, wandb=wandb, results=_value(raw, "results", str, "results"),
        max_failures=max_failures, seeds=seeds, description=_value(raw, "description", str, ""),
        path=path, wsd_branches=_value(raw, "wsd_branches", bool, True),
        storage=_sub(StorageConfig, raw.get("storage"), "storage"),
        checkpoint=_sub(CheckpointSpec, raw.get("checkpoint"), "checkpoint"),
        export=_export(raw),
        prune=parse_prune(raw.get("prune")),
        law=_law(raw, algorithm),
    )
    check_uri(spec.results, "results")
    validate(spec)
    return spec


def _export(raw: dict[str, Any]) -> str | None:
    v = raw.get("export")
    if v is not None and v not in EXPORTS:
        raise _err(f"export={shown(v)} is not known; use hf, or leave it out")
    return v


def _law(raw: dict[str, Any], algorithm: str) -> LawSearchConfig | None:
    if algorithm != "law":
        if raw.get("law") is not None:
            raise _err("law: is set but algorithm is not law; set algorithm: law or drop it")
        return None
    if raw.get("law") is None:
        raise _err("algorithm=law needs a law: block, e.g. law: {law: eq8, target: alpha3, "
                   "ci_width: 0.1}")
    return parse_law_block(raw["law"])


def load_spec(path: str, overrides: list[str] = (), results: str | None = None) -> SweepSpec:
    """Read, override (``--set key.path=value``, e.g. ``base.optim.lr=1e-3``) and validate."""
    raw = load_yaml(path)
    plain = []
    for item in overrides:
        # search.<dotted knob>.<distribution>=value: the knob itself contains dots
        key, _, value = item.partition("=")
        parts = key.split(".")
        if parts[0] == "search" and len(parts) >= 3 and parts[-1] in DISTRIBUTIONS + ("when",):
            knob = ".".join(parts[1:-1])
            if raw.get("search") is None:
                raw["search"] = {}
            if not isinstance(raw["search"], dict):
                raise _err("search must map dotted config keys to distributions")
            raw["search"].setdefault(knob, {})
            if not isinstance(raw["search"][knob], dict):
                raw["search"][knob] = {"grid": raw["search"][knob]}
            dist = {k: v for k, v in raw["search"][knob].items() if k == "when"}
            try:
                dist[parts[-1]] = parse_override_value(key, value)
            except ConfigError as e:
                raise _err(str(e)) from None
            raw["search"][knob] = dist
        else:
            plain.append(item)
    overrides = plain
    try:
        raw = apply_overrides(raw, list(overrides))
    except ConfigError as e:
        raise _err(str(e)) from None
    if results is not None:
        raw["results"] = results
    return parse_spec(raw, path=path)


# ---- validation ---------------------------------------------------------------------------------


def validate(spec: SweepSpec) -> None:
    """Refuse impossible sweeps before any work: every grid point (and the corners of every
    sampled range) must make a valid trial config."""
    keys = [p.key for p in spec.search]
    dup = {k for k in keys if keys.count(k) > 1}
    if dup:
        raise _err(f"search.{sorted(dup)[0]} appears twice")
    _check_counts(spec)
    if spec.algorithm == "grid" and spec.sampled_params():
        p = spec.sampled_params()[0]
        raise _err(
            f"search.{p.key} uses {p.kind}, but algorithm=grid only enumerates grid values; "
            "use algorithm: random or optuna, or turn it into a grid"
        )
    if spec.law is not None:
        _validate_law(spec)
    if spec.scheduler == "asha" and spec.algorithm == "grid" and spec.num_samples == 1 and \
            len(list(iter_grid(spec))) < 2:
        raise _err("scheduler=asha needs several trials to compare; raise num_samples")
    if spec.resources.ranks < 1:
        raise _err(f"resources.ranks={spec.resources.ranks} must be >= 1")
    if spec.resources.cpus <= 0:
        raise _err(f"resources.cpus={spec.resources.cpus} must be > 0")
    if spec.resources.gpus != "auto" and spec.resources.gpus < 0:
        raise _err(f"resources.gpus={spec.resources.gpus} must be >= 0")
    if not 0 <= spec.resources.trial_driver < math.inf:
        raise _err(f"resources.trial_driver={spec.resources.trial_driver} must be >= 0 (e.g. "
                   "0.01: a share of a node's trial_driver slots; 0 turns it off)")
    try:
        base = spec.base_config
    except ConfigError as e:
        raise _err(f"base: {e}") from None
    if spec.metric not in METRICS:
        raise _err(f"metric={spec.metric!r} is not reported by trials; use one of "
                   f"{', '.join(sorted(METRICS))}")
    del base
    for point in validation_points(spec):
        try:
            trial_config(spec, point).batch.accumulation_steps(spec.resources.ranks)
        except SearchSpaceError:
            raise
        except ConfigError as e:
            shown = ", ".join(f"{k}={v}" for k, v in point.items())
            raise _err(f"{e} (at search point {shown})") from None


def _validate_law(spec: SweepSpec) -> None:
    law = spec.law
    if spec.sampled_params():
        raise _err(f"search.{spec.sampled_params()[0].key}: algorithm=law picks its trials from "
                   "candidates (the grid, or law.candidates.box); make the knob a grid")
    if spec.scheduler != "fifo":
        raise _err("algorithm=law needs every trial's final loss: use scheduler: fifo")
    if spec.num_samples != 1:
        raise _err("algorithm=law decides how many trials to run: leave num_samples at 1 "
                   "(bound it with law.max_trials)")
    keys = law.variable_keys()
    if law.candidates == "grid":
        grid = {p.key for p in spec.grid_params()}
        if not grid:
            raise _err("law.candidates=grid needs grid knobs under search:")
    for var, key in keys.items():
        problem = unknown_key(TrainConfig, key)
        if problem is not None:
            raise _err(f"law.variables.{var}={key}: {problem}")
    if law.candidates == "box":
        for k, _, _ in law.box:
            problem = unknown_key(TrainConfig, k)
            if problem is not None:
                raise _err(f"law.candidates.box.{k}: {problem}")


def _check_counts(spec: SweepSpec) -> None:
    """At most ``MAX_TRIALS`` trials, and at most as many trial configs to validate, counted
    before anything is enumerated."""
    grid = math.prod(len(p.values) for p in spec.grid_params()) * max(1, len(spec.seeds))
    if grid * spec.num_samples > MAX_TRIALS:
        raise _err(f"num_samples={spec.num_samples:,} × {grid:,} grid point(s) (search.*.grid "
                   f"× seeds) = {grid * spec.num_samples:,} trials, more than {MAX_TRIALS:,}; "
                   "lower num_samples or shrink the grid")
    corners = math.prod(len(p.values) for p in spec.sampled_params())
    if grid * corners > MAX_TRIALS:
        raise _err(f"validating the search builds {grid:,} grid point(s) × {corners:,} "
                   f"combinations of the sampled knobs' values and bounds, more than "
                   f"{MAX_TRIALS:,} trial configs; list fewer choice values or shrink the grid")


METRICS = {"val_loss", "train_loss", "aux_loss", "router.max_load", "router.entropy",
           "router.max1_max2", "router.expert_similarity", "router.dead_experts"}


def iter_grid(spec: SweepSpec) -> itertools.product:
    grid = spec.grid_params()
    values = [p.values for p in grid]
    if spec.seeds:
        values.append(spec.seeds)
    keys = [p.key for p in grid] + (["seed"] if spec.seeds else [])
    for combo in itertools.product(*values):
        yield dict(zip(keys, combo))


def validation_points(spec: SweepSpec) -> list[dict[str, Any]]:
    """Grid points combined with every value (choice) or bound (ranges) of sampled knobs."""
    sampled = spec.sampled_params()
    corner_values = []
    for p in sampled:
        if p.kind == "choice":
            corner_values.append(p.values)
        elif p.kind == "int":
            corner_values.append((int(p.values[0]), int(p.values[1])))
        else:
            corner_values.append(p.values)
    points = []
    for g in iter_grid(spec):
        for combo in itertools.product(*corner_values) if sampled else [()]:
            pt = dict(g)
            pt.update({p.key: v for p, v in zip(sampled, combo)})
            points.append(pt)
    return points


def knob_values(spec: SweepSpec, point: dict[str, Any]) -> dict[str, Any]:
    """The value each searched knob (and each expr knob) has in the trial's config: a
    conditional knob whose ``when`` does not hold shows the base value the trial really ran."""
    cfg = trial_dict(spec, point)
    keys = list(point) + [p.key for p in spec.search if p.kind == "expr" and p.key not in point]
    return {k: cfg.get("seed") if k == "seed" else get_dotted(cfg, k, point.get(k))
            for k in keys}


def trial_dict(spec: SweepSpec, point: dict[str, Any]) -> dict[str, Any]:
    """The base config with a search point applied (conditions and expr knobs resolved)."""
    cfg = copy.deepcopy(spec.base)
    for k, v in point.items():
        if k == "seed":
            cfg["seed"] = v
            continue
        param = next((p for p in spec.search if p.key == k), None)
        if param is not None and not param.applies(_merged(cfg, point)):
            continue
        set_dotted(cfg, k, v)
    for p in spec.search:
        if p.kind == "expr" and p.applies(cfg):
            val = eval_expr(p.expr, cfg, p.key)
            if isinstance(val, float) and val.is_integer():
                val = int(val)
            set_dotted(cfg, p.key, val)
    return cfg


def _merged(cfg: dict[str, Any], point: dict[str, Any]) -> dict[str, Any]:
    m = copy.deepcopy(cfg)
    for k, v in point.items():
        set_dotted(m, k, v)
    return m


def trial_config(spec: SweepSpec, point: dict[str, Any]) -> TrainConfig:
    return train_config_from_dict(trial_dict(spec, point))

"""Sweep specs: YAML → validated frozen dataclasses, before Ray starts.

The YAML is decoded once (``moe_core.configio.decode``) into ``_SpecFile``, its mirror key for
key, and moved into a :class:`SweepSpec` (docs/design.md). Building the plan
(``sweeps.plan.build``) builds and so validates every trial config. Every rule raises
``SearchSpaceError`` naming the YAML key and the fix.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator

from moe_core.configio import coerce_number, decode
from moe_core.errors import ConfigError, SearchSpaceError, shown
from moe_core.train.config import TrainConfig, train_config_from_dict
from moe_core.yamlio import apply_overrides, load_yaml, override_key, parse_override_value
from scaling.predict import METHODS as PREDICTORS
from sweeps.run.prune import PruneConfig, parse_prune
from sweeps.spec import algorithm as algorithm_plugins
from sweeps.spec.algorithm import AlgorithmName, SchedulerName
from sweeps.spec.budget import BudgetConfig
from sweeps.spec.space import DISTRIBUTIONS, Distribution, SearchSpace
from sweeps.store.storage import check_uri, is_url, join_uri, local_form
from sweeps.store.wandb_keys import PROJECT

ALGORITHMS = typing.get_args(AlgorithmName)
SCHEDULERS = typing.get_args(SchedulerName)
MAX_TRIALS = 10_000
"""Most trials a spec may define (grid points × seeds × num_samples), and most trial configs
validation builds (grid points × every value or bound of the sampled knobs)."""
METRICS = {"val_loss", "train_loss", "aux_loss", "router.max_load", "router.entropy",
           "router.max1_max2", "router.expert_similarity", "router.dead_experts"}
"""What trials report, and so what ``metric`` may name."""
MAX_CPUS = 1024.0
"""CPUs one trial rank may reserve (the largest machines have a few hundred)."""
MAX_GPUS = 64.0
"""GPUs one trial rank may reserve (a node has at most 16; fractions share one)."""
MAX_RANKS = 4096
EXPORTS = ("hf",)
_err = SearchSpaceError  # the one-line refusals below


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
            raise _err(f"scheduler.rung_metric={self.rung_metric!r} is not known; use "
                       "predicted_final (or leave it out to compare trials on the spec's metric)")
        if self.predictor not in PREDICTORS:
            raise _err(f"scheduler.predictor={self.predictor!r} is not known; use one of "
                       f"{', '.join(PREDICTORS)}")
        if self.rung_metric == "predicted_final" and not self.calibration:
            raise _err("scheduler.rung_metric=predicted_final needs scheduler.calibration: the "
                       "results of finished WSD runs (e.g. results/upcycle_lr) to fit the "
                       "predictor on")
        if self.grace_period < 1:
            raise _err(f"scheduler.grace_period={self.grace_period} must be >= 1")
        if not self.reduction_factor > 1:
            raise _err(f"scheduler.reduction_factor={self.reduction_factor} must be > 1 (ASHA "
                       "keeps 1/reduction_factor of the trials at each rung)")
        if self.max_t is not None and self.max_t < 1:
            raise _err(f"scheduler.max_t={self.max_t} must be >= 1, or null")


@dataclass(frozen=True, slots=True)
class FailureConfig:
    max_failures: int = 2
    """Retries of a failed trial."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_failures, int) or self.max_failures < 0:
            raise _err(f"failure.max_failures={self.max_failures!r} must be an integer >= 0")


@dataclass(frozen=True, slots=True)
class Resources:
    cpus: float = 1.0
    """CPUs each trial (each rank of a multi-rank trial) reserves."""
    gpus: float | Literal["auto"] = "auto"
    """GPUs each trial rank, parent task and stable-run task reserves; ``auto``: 1 when the Ray
    cluster has GPUs, else 0 (``sweeps.plan.resources``); fractions share a GPU (0.5: two trials per
    GPU)."""
    ranks: int = 1
    """>1: the trial runs as a multi-rank DeepSpeed job (Ray Train TorchTrainer)."""
    parent_ranks: int | Literal["auto"] = 1
    """Ranks each trained parent runs on, data-parallel with the same global batch (a Ray Train
    TorchTrainer, each rank holding one trial rank's CPUs and GPUs); ``auto``: the GPUs its
    waiting trials would hold, at most 8 (one node) and a divisor the parent's batch allows,
    1 on the CPU (``sweeps.plan.resources.parent_ranks``). Dense parents only."""
    trial_driver: float = 0.0
    """> 0: each trial's driver bundle also asks for this much of the custom resource
    ``trial_driver`` (only on-demand nodes have it in sweeps/cluster/*.yaml), keeping trial
    drivers off spot nodes (``sweeps.plan.preflight.custom_resources``); 0: off."""

    def __post_init__(self) -> None:
        if isinstance(self.ranks, bool) or not 1 <= self.ranks <= MAX_RANKS:
            raise _err(f"resources.ranks={self.ranks} must be >= 1 (an integer, at most "
                       f"{MAX_RANKS:,})")
        if self.parent_ranks != "auto" and (isinstance(self.parent_ranks, bool) or not
                                            isinstance(self.parent_ranks, int) or
                                            not 1 <= self.parent_ranks <= MAX_RANKS):
            raise _err(f"resources.parent_ranks={self.parent_ranks!r} must be an integer >= 1 "
                       f"(at most {MAX_RANKS:,}) or auto")
        if not 0 < self.cpus <= MAX_CPUS:
            raise _err(f"resources.cpus={self.cpus} must be > 0 and at most {MAX_CPUS:g} (CPUs "
                       "each trial rank reserves)")
        if self.gpus != "auto" and not 0 <= self.gpus <= MAX_GPUS:
            raise _err(f"resources.gpus={self.gpus} must lie in [0, {MAX_GPUS:g}] (GPUs each "
                       "trial rank reserves; fractions share one), or be auto")
        if not 0 <= self.trial_driver < math.inf:
            raise _err(f"resources.trial_driver={self.trial_driver} must be >= 0 (e.g. 0.01: a "
                       "share of a node's trial_driver slots; 0 turns it off)")


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
    on_preemption: bool = True
    """Act on a preemption notice (a node drained with reason preemption and a deadline, as the
    autoscaler does for a spot reclaim): a single-rank trial on that node checkpoints at once
    and Tune restarts it from there on another node (``sweeps.run.preemption``)."""
    preemption_poll_s: float = 2.0
    """Seconds between a trial's polls of the GCS for its node's drain (from a thread of its
    own; the trial stops at the next step boundary after a drain is seen)."""

    def __post_init__(self) -> None:
        if not 0.05 <= self.preemption_poll_s <= 600:  # NaN too
            raise _err(f"checkpoint.preemption_poll_s={self.preemption_poll_s!r} must lie in "
                       "[0.05, 600] seconds")
        if self.every_evals is not None and (not isinstance(self.every_evals, int) or
                                             self.every_evals < 1):
            raise _err(f"checkpoint.every_evals={self.every_evals!r} must be an integer >= 1 or "
                       "null")
        if self.every_minutes is not None and not self.every_minutes > 0:
            raise _err(f"checkpoint.every_minutes={self.every_minutes!r} must be > 0 or null")
        if not isinstance(self.keep, int) or self.keep < 1:
            raise _err(f"checkpoint.keep={self.keep!r} must be an integer >= 1")


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
            raise _err(f"storage.flush_s={self.flush_s} must be >= 0")
        if self.parent_cache is not None:
            check_uri(self.parent_cache, "storage.parent_cache")


@dataclass(frozen=True, slots=True)
class WandbConfig:
    enabled: bool = True
    """false: no W&B logging at all."""
    project: str = PROJECT
    """W&B project of the sweep's runs."""
    group: str | None = None
    """Default: the sweep name."""
    mode: str = "offline"
    """offline (default; ``wandb sync`` later), online, disabled."""
    entity: str | None = None
    """W&B entity (team or user); None = wandb's default."""

    def __post_init__(self) -> None:
        if self.mode not in ("offline", "online", "disabled"):
            raise _err(f"logging.wandb.mode={self.mode!r} must be offline, online or disabled")


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    wandb: WandbConfig | None = None
    """W&B logging; null = the defaults."""


@dataclass(frozen=True, slots=True)
class SweepSpec:
    name: str
    """YAML ``sweep:`` (required): the sweep's name, letters, digits, - and _: the results
    directory ``<results>/<name>/`` and the W&B group."""
    base: dict[str, Any]
    """The trial config, a full training config (the ``base`` keys below); every knob of ``search``
    is a dotted key into it."""
    search: tuple[Distribution, ...]
    """Knobs: dotted key into ``base`` → one distribution (``grid``, ``choice``, ``uniform``,
    ``loguniform``, ``int``, ``expr``; :mod:`sweeps.spec.space`), optionally with ``when: {key:
    value}``."""
    algorithm: AlgorithmName = "grid"
    """``grid`` (every grid point), ``random``, ``optuna`` (TPE; GridSampler if every knob is a
    grid) or ``law`` (``law:`` block: trials picked from the fitted scaling law)."""
    scheduler: SchedulerName = "fifo"
    """``fifo`` or ``asha``; the mapping form ``{kind: asha, grace_period: ..., ...}`` also sets
    the ASHA keys below."""
    asha: AshaConfig = field(default_factory=AshaConfig)
    """ASHA's settings, the keys of the ``scheduler:`` mapping besides ``kind``."""
    num_samples: int = 1
    """Samples per grid point (random, optuna)."""
    metric: str = "val_loss"
    """The reported column trials are ranked by (and ASHA compares, unless ``rung_metric``)."""
    mode: Literal["min", "max"] = "min"
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
    """Health rules (``sweeps.run.prune``): a trial is stopped and recorded as pruned when one
    fires."""
    settings: Any = None
    """The algorithm's own settings block, decoded by its plug-in (``Algorithm.settings_key``
    names the YAML key; None for an algorithm without one)."""
    budget: BudgetConfig | None = None
    """Limits the driver enforces (:class:`sweeps.spec.budget.BudgetConfig`): at 100 % of one
    it stops the sweep, resumable with a raised budget; None = no limit."""

    @property
    def base_config(self) -> TrainConfig:
        return train_config_from_dict(self.base)

    @property
    def results_uri(self) -> str:
        """``<results>/<sweep>``: a local path or an object-storage URL
        (``sweeps.store.storage``)."""
        return join_uri(self.results, self.name)

    @property
    def results_dir(self) -> Path:
        """The local results folder; object storage has none (use ``results_uri``)."""
        if is_url(self.results):
            raise ConfigError(f"results={self.results} is object storage, not a local folder: "
                              "this code path must use spec.results_uri (sweeps.store.storage)")
        return Path(self.results) / self.name

    @property
    def space(self) -> SearchSpace:
        return SearchSpace(self.search, self.seeds)

    def grid_params(self) -> list[Distribution]:
        return self.space.grid()

    def sampled_params(self) -> list[Distribution]:
        return self.space.sampled()


# ---- the YAML, key for key ---------------------------------------------------------------------


def _count(v: Any) -> Any:
    """``num_samples``: a positive integer (any size: the trial cap's message says more)."""
    n = coerce_number(v, "num_samples")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise _err(f"num_samples={shown(n)} must be an integer >= 1")
    return n


def _concurrency(v: Any) -> Any:
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
        raise _err(f"max_concurrent={shown(v)} must be an integer >= 1 or null")
    return v


def _search(raw: Any) -> tuple[Distribution, ...]:
    return SearchSpace.parse(raw, TrainConfig).params


def _scheduler(raw: Any) -> tuple[str, AshaConfig]:
    """``scheduler: asha``, or ``{kind: asha, ...}`` with ASHA's settings: (kind, settings)."""
    kind = raw.get("kind", "fifo") if isinstance(raw, dict) else raw
    if kind not in SCHEDULERS:
        raise _err(f"scheduler={kind!r} is not known; use one of {', '.join(SCHEDULERS)}")
    rest = {k: v for k, v in raw.items() if k != "kind"} if isinstance(raw, dict) else {}
    return kind, decode(AshaConfig, rest, "scheduler")


@dataclass(frozen=True, slots=True)
class _SpecFile:
    """A spec file as written (but the algorithms' settings blocks), decoded by
    ``moe_core.configio.decode``: ``search``, ``scheduler``, ``prune``, ``num_samples`` and
    ``max_concurrent`` through validators that keep their messages."""

    sweep: Any = None
    description: str = ""
    base: Any = None
    search: Annotated[Any, BeforeValidator(_search)] = ()
    algorithm: str = "grid"
    scheduler: Annotated[Any, BeforeValidator(_scheduler)] = ("fifo", AshaConfig())
    num_samples: Annotated[Any, BeforeValidator(_count)] = 1
    metric: str = "val_loss"
    mode: str = "min"
    resources: Resources = field(default_factory=Resources)
    max_concurrent: Annotated[Any, BeforeValidator(_concurrency)] = None
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    results: str = "results"
    failure: FailureConfig = field(default_factory=FailureConfig)
    seeds: tuple[int, ...] = ()
    wsd_branches: bool = True
    storage: StorageConfig = field(default_factory=StorageConfig)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    export: str | None = None
    prune: Annotated[Any, BeforeValidator(parse_prune)] = PruneConfig()
    budget: BudgetConfig | None = None

    def __post_init__(self) -> None:
        name = self.sweep
        if not isinstance(name, str) or not name.replace("-", "_").isidentifier() or \
                len(name) > 100:
            raise _err(f"sweep={shown(name, 100)} must be a name of letters, digits, - and _, at "
                       "most 100 characters (the results directory and W&B group use it)")
        if not isinstance(self.base, dict):
            raise _err("base must be a mapping: the trial config (see configs/train_debug.yaml)")
        if self.algorithm not in ALGORITHMS:
            raise _err(f"algorithm={self.algorithm!r} is not known; use one of "
                       f"{', '.join(ALGORITHMS)}")
        if self.mode not in ("min", "max"):
            raise _err(f"mode={shown(self.mode)} must be 'min' or 'max'")
        repeated = sorted({s for s in self.seeds if self.seeds.count(s) > 1})
        if repeated:
            raise _err(f"seeds={shown(list(self.seeds))} repeats {repeated[0]}; list each seed "
                       "once")
        if self.export is not None and self.export not in EXPORTS:
            raise _err(f"export={shown(self.export)} is not known; use hf, or leave it out")


def top_keys() -> set[str]:
    """The top-level keys of a spec: the file's, and each algorithm's settings block."""
    return set(_SpecFile.__dataclass_fields__) | set(algorithm_plugins.settings_keys())


_NULL_IS_DEFAULT = ("description", "search", "metric", "resources", "logging", "results",
                    "failure", "seeds", "wsd_branches", "storage", "checkpoint")
"""Keys whose null means their default."""
_SECTIONS = ("resources", "failure", "storage", "checkpoint")
"""Mappings whose ``kind`` key is ignored (as in the ``scheduler: {kind: asha, ...}`` form)."""


def _as_file(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` without the settings blocks, nulls that mean the defaults and sections' ``kind``
    keys."""
    own = algorithm_plugins.settings_keys()
    out = {k: v for k, v in raw.items()
           if k not in own and not (v is None and k in _NULL_IS_DEFAULT)}
    for k in _SECTIONS:
        if isinstance(out.get(k), dict):
            out[k] = {a: b for a, b in out[k].items() if a != "kind"}
    log = out.get("logging")
    if isinstance(log, dict) and isinstance(log.get("wandb"), dict):
        out["logging"] = {**log, "wandb": {a: b for a, b in log["wandb"].items() if a != "kind"}}
    return out


def parse_spec(raw: dict[str, Any], *, path: str = "") -> SweepSpec:
    """A spec mapping (after overrides) as a SweepSpec, each rule that needs no trial config
    checked; ``sweeps.plan.build.build_plan`` builds (and so checks) the trial configs."""
    unknown = sorted(set(raw) - top_keys(), key=str)
    if unknown:
        raise _err(f"unknown top-level key {shown(unknown[0], 100)}; known: "
                   f"{', '.join(sorted(top_keys()))}")
    f = decode(_SpecFile, _as_file(raw), "", SearchSpaceError)
    check_uri(f.results, "results")
    spec = SweepSpec(
        name=f.sweep, base=f.base, search=f.search, algorithm=f.algorithm,
        scheduler=f.scheduler[0], asha=f.scheduler[1], num_samples=f.num_samples,
        metric=f.metric, mode=f.mode, resources=f.resources, max_concurrent=f.max_concurrent,
        wandb=f.logging.wandb or WandbConfig(), results=local_form(f.results, "results"),
        max_failures=f.failure.max_failures, seeds=f.seeds, description=f.description,
        path=path, wsd_branches=f.wsd_branches, storage=f.storage, checkpoint=f.checkpoint,
        export=f.export, prune=f.prune, budget=f.budget,
        settings=algorithm_plugins.decode_settings(f.algorithm, raw))
    _check(spec)
    return spec


def _check(spec: SweepSpec) -> None:
    """The rules across keys: the trial cap, the algorithm's and the scheduler's own checks,
    the base config, the metric (each knob is a key of the ``search:`` mapping: once)."""
    _check_counts(spec)
    for algorithm in algorithm_plugins.plugins(spec):
        algorithm.validate(spec)
    try:
        _ = spec.base_config
    except ConfigError as e:
        raise _err(f"base: {e}") from None
    if spec.metric not in METRICS:
        raise _err(f"metric={spec.metric!r} is not reported by trials; use one of "
                   f"{', '.join(sorted(METRICS))}")


def _check_counts(spec: SweepSpec) -> None:
    """At most ``MAX_TRIALS`` trials, and at most as many trial configs to validate, counted
    before anything is enumerated."""
    grid = math.prod(len(p.values) for p in spec.grid_params()) * max(1, len(spec.seeds))
    if grid * spec.num_samples > MAX_TRIALS:
        raise _err(f"num_samples={spec.num_samples:,} × {grid:,} grid point(s) (search.*.grid "
                   f"× seeds) = {grid * spec.num_samples:,} trials, more than {MAX_TRIALS:,}; "
                   "lower num_samples or shrink the grid")
    corners = math.prod(len(p.corners()) for p in spec.sampled_params())
    if grid * corners > MAX_TRIALS:
        raise _err(f"validating the search builds {grid:,} grid point(s) × {corners:,} "
                   f"combinations of the sampled knobs' values and bounds, more than "
                   f"{MAX_TRIALS:,} trial configs; list fewer choice values or shrink the grid")


def _search_override(raw: dict[str, Any], key: str, value: str) -> None:
    """``--set search.<dotted knob>.<distribution>=value``: the knob itself contains dots."""
    parts = key.split(".")
    knob = ".".join(parts[1:-1])
    if raw.get("search") is None:
        raw["search"] = {}
    if not isinstance(raw["search"], dict):
        raise _err("search must map dotted config keys to distributions")
    raw["search"].setdefault(knob, {})
    if not isinstance(raw["search"][knob], dict):
        raw["search"][knob] = {"grid": raw["search"][knob]}
    dist = {k: v for k, v in raw["search"][knob].items() if k == "when"}
    dist[parts[-1]] = parse_override_value(key, value)
    raw["search"][knob] = dist


def load_spec(path: str, overrides: list[str] = (), results: str | None = None) -> SweepSpec:
    """Read, override (``--set key.path=value``, e.g. ``base.optim.lr=1e-3``) and validate."""
    raw = load_yaml(path)
    plain = []
    try:  # the overrides' errors (ConfigError) as the spec's
        for item in overrides:
            key, _, value = item.partition("=")
            parts = override_key(key)
            if parts[0] == "search" and len(parts) >= 3 and parts[-1] in DISTRIBUTIONS + ("when",):
                _search_override(raw, key, value)
            else:
                plain.append(item)
        raw = apply_overrides(raw, plain)
    except ConfigError as e:
        raise _err(str(e)) from None
    if results is not None:
        raw["results"] = results
    return parse_spec(raw, path=path)

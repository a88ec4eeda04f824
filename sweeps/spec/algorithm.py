"""The search algorithm and the trial scheduler as plug-ins: one interface, :class:`Algorithm`,
and a registry keyed by the spec's ``algorithm`` and ``scheduler`` names (docs/design.md, "Search
algorithms and schedulers are plug-ins"). A plug-in's module is imported on first use and builds
Ray's objects only when asked: ``--dry-run`` imports neither torch nor Ray.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from moe_core.errors import SearchSpaceError

AlgorithmName = Literal["grid", "random", "optuna", "law"]
"""The spec's ``algorithm:`` (one registry entry each, below)."""
SchedulerName = Literal["fifo", "asha"]
"""The spec's ``scheduler:``."""

SEARCHERS: Mapping[str, str] = {
    "grid": "sweeps.spec.searchers:Grid", "random": "sweeps.spec.searchers:Random",
    "optuna": "sweeps.spec.searchers:TPE", "law": "sweeps.law.algorithm:LawSearch"}
SCHEDULERS: Mapping[str, str] = {
    "fifo": "sweeps.spec.searchers:FIFO", "asha": "sweeps.spec.searchers:ASHA"}


class Algorithm:
    """One search algorithm or trial scheduler. Every hook has the default of a plain Tune
    run (grid search, FIFO): a plug-in overrides what it changes. ``spec`` is a
    :class:`sweeps.spec.sweep.SweepSpec`, ``plan`` a :class:`sweeps.plan.build.SweepPlan`,
    ``results_dir`` the sweep's results folder (a Path or a ``Location``)."""

    name: ClassVar[str] = ""
    settings_key: ClassVar[str | None] = None
    """The spec key holding this algorithm's own settings (``SweepSpec.settings``; recorded for
    ``--resume``)."""
    settings_type: ClassVar[type | None] = None
    """The frozen dataclass of those settings (the spec reference documents its keys)."""
    trains_up_front: ClassVar[bool] = True
    """Parents and WSD stable runs are trained before the trials (else each trial trains its
    own on demand)."""
    keeps_state: ClassVar[bool] = False
    """Its searcher keeps its state in the results folder: a ``--resume`` hands Tune a fresh
    one, which reads it back, instead of the one unpickled with the experiment."""
    plan_title: ClassVar[str] = "trials (grid points × num_samples)"
    """The title of ``--dry-run``'s trial table."""

    # ---- before anything runs (pure: also for --dry-run) ---------------------------------

    def parse_settings(self, raw: Any) -> Any:
        """The spec's ``settings_key`` block as this algorithm's frozen ``settings_type``."""
        return None

    def settings_missing(self) -> None:
        """Raise the one-line refusal of a spec that names this algorithm without its block."""
        raise SearchSpaceError(f"algorithm={self.name} needs a {self.settings_key}: block")

    def validate(self, spec: Any) -> None:
        """Refuse a spec this algorithm cannot run (a ``SearchSpaceError`` naming the key)."""

    def describe_plan(self, spec: Any, plan: Any) -> list[str]:
        """Lines ``--dry-run`` prints above the trial table."""
        return []

    def record(self, spec: Any) -> Any:
        """This algorithm's settings as JSON (``spec.json``: what a ``--resume`` must match)."""
        return None

    def trial_cap(self, spec: Any, plan: Any) -> tuple[int, bool]:
        """(trials the sweep runs, whether that is only an upper bound)."""
        return plan.num_trials, False

    # ---- the Tune run ------------------------------------------------------------------

    def param_space(self, spec: Any) -> dict[str, Any]:
        return spec.space.tune_space()

    def searcher(self, spec: Any, plan: Any, results_dir: Any) -> Any:
        """Tune's ``search_alg`` (None: Tune's variant generator)."""
        return None

    def num_samples(self, spec: Any, searcher: Any) -> int:
        return spec.num_samples

    def scheduler(self, spec: Any) -> Any:
        """Tune's ``scheduler`` (None: FIFO)."""
        return None

    def predictor(self, spec: Any) -> Any:
        """(method, calibration) when trials add ``predicted_final`` to their rows."""
        return None

    def trial_options(self, spec: Any, plan: Any, results_dir: Any) -> dict[str, Any]:
        """Extra fields of the trials' :class:`sweeps.run.trial.TrialContext`."""
        return {}

    def stopped_early(self, spec: Any, rows: Mapping[int, Mapping[str, Any]],
                      steps: int) -> dict[str, Any] | None:
        """The pruned-trial columns of a trial the scheduler stopped before its last step
        (``rows``: its rows by step; ``steps``: its config's), or None."""
        return None

    # ---- saved state and the after-run report -------------------------------------------

    def state(self, results_dir: Any) -> dict[str, Any] | None:
        """The searcher's saved state in the results folder (None: it keeps none)."""
        return None

    def planned(self, spec: Any, plan: Any, results_dir: Any) -> dict[str, Any]:
        """The summary's compute estimates (``SweepPlan.estimates``)."""
        return plan.estimates()

    def after_run(self, spec: Any, plan: Any, results_dir: Any) -> dict[str, Any]:
        """Entries this algorithm adds to the sweep's summary once Tune is done."""
        return {}

    def closing_line(self, spec: Any, summary: Mapping[str, Any]) -> str | None:
        """A last console line after the ranking (None: nothing)."""
        return None


def load(target: str) -> Any:
    """The object at ``module:name``, imported on first use (Ray's classes stay unloaded
    until a sweep really starts, as in ``moe_core.lazy``)."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def plugin(name: str) -> Algorithm:
    """The plug-in registered under a spec's ``algorithm`` or ``scheduler`` name."""
    return load({**SEARCHERS, **SCHEDULERS}[name])()


def plugins(spec: Any) -> tuple[Algorithm, Algorithm]:
    """The spec's (search algorithm, scheduler)."""
    return plugin(spec.algorithm), plugin(spec.scheduler)


def settings_records(spec: Any) -> dict[str, Any]:
    """``{settings_key: record}`` of every algorithm that has settings (None unless it is the
    spec's): the part of ``spec.json`` the algorithms own."""
    return {p.settings_key: p.record(spec) if p.name == spec.algorithm else None
            for p in _with_settings()}


def _with_settings() -> list[Algorithm]:
    return [p for p in map(plugin, SEARCHERS) if p.settings_key is not None]


def settings_keys() -> tuple[str, ...]:
    """The spec keys of the algorithms' own settings blocks (top-level keys of a spec)."""
    return tuple(p.settings_key for p in _with_settings())


def decode_settings(algorithm: str, raw: Mapping[str, Any]) -> Any:
    """The spec's algorithm's settings, decoded by its plug-in from its block of the spec
    mapping ``raw`` (None when it has none); a block given for another algorithm, or missing
    for its own, is refused."""
    settings = None
    for p in _with_settings():
        key = p.settings_key
        if p.name != algorithm and raw.get(key) is not None:
            raise SearchSpaceError(f"{key}: is set but algorithm is not {p.name}; set "
                                   f"algorithm: {p.name} or drop it")
        if p.name == algorithm:
            if raw.get(key) is None:
                p.settings_missing()
            settings = p.parse_settings(raw[key])
    return settings

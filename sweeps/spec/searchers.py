"""The built-in :class:`sweeps.spec.algorithm.Algorithm` plug-ins: ``grid``, ``random`` and
``optuna`` (TPE, or Optuna's GridSampler when every knob is a grid) search, and the ``fifo`` and
``asha`` schedulers. Ray, Optuna and the ASHA classes load only when a sweep builds them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from moe_core.errors import SearchSpaceError
from sweeps.spec.algorithm import Algorithm, load
from sweeps.spec.trials import iter_grid


class Grid(Algorithm):
    """Every grid point (× ``num_samples``): Tune's variant generator."""

    name = "grid"

    def validate(self, spec: Any) -> None:
        if spec.sampled_params():
            p = spec.sampled_params()[0]
            raise SearchSpaceError(
                f"search.{p.key} uses {p.kind}, but algorithm=grid only enumerates grid values; "
                "use algorithm: random or optuna, or turn it into a grid")


class Random(Algorithm):
    """Sampled knobs drawn at random, grid knobs enumerated: Tune's variant generator."""

    name = "random"


class TPE(Algorithm):
    """Optuna's TPE sampler through Ray's ``OptunaSearch``; Optuna's ``GridSampler`` when every
    knob is a grid (Ray's OptunaSearch refuses ``grid_search``: the space goes to the sampler,
    and Tune's ``param_space`` holds none of it)."""

    name = "optuna"

    def validate(self, spec: Any) -> None:
        grid = spec.grid_params()
        if grid and spec.sampled_params():
            raise SearchSpaceError(
                f"search.{grid[0].key} is a grid, but algorithm=optuna (TPE) cannot mix grids "
                "with sampled knobs (Ray's OptunaSearch refuses grid_search); use choice for it, "
                "or make every knob a grid to use Optuna's GridSampler")
        if spec.seeds and not grid:
            raise SearchSpaceError(
                f"seeds={list(spec.seeds)} with algorithm=optuna (TPE): TPE draws every knob of "
                "a trial, and Ray's OptunaSearch cannot repeat each draw per seed; drop seeds: "
                "(each trial keeps base seed), use algorithm: random, or make every knob a grid")
        if grid and spec.num_samples > 1:
            raise SearchSpaceError(
                f"num_samples={spec.num_samples} with algorithm=optuna and every knob a grid: "
                "Optuna's GridSampler runs each point once; use seeds: to repeat them, or "
                "algorithm: grid")

    @staticmethod
    def _grid(spec: Any) -> dict[str, list[Any]]:
        gs = {p.key: list(p.values) for p in spec.grid_params()}
        if gs and spec.seeds:
            gs["seed"] = list(spec.seeds)
        return gs

    def param_space(self, spec: Any) -> dict[str, Any]:
        return {} if spec.grid_params() else spec.space.tune_space()

    def num_samples(self, spec: Any, searcher: Any) -> int:
        """Every grid point once (GridSampler), else ``num_samples`` TPE draws."""
        gs = self._grid(spec)
        return math.prod(len(v) for v in gs.values()) if gs else spec.num_samples

    def searcher(self, spec: Any, plan: Any, results_dir: Any) -> Any:
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        gs = self._grid(spec)
        if gs:
            space = {k: optuna.distributions.CategoricalDistribution(v) for k, v in gs.items()}
            return OptunaSearch(space=space, sampler=optuna.samplers.GridSampler(gs, seed=0),
                                metric=spec.metric, mode=spec.mode)
        return OptunaSearch(sampler=optuna.samplers.TPESampler(seed=0), metric=spec.metric,
                            mode=spec.mode)


class FIFO(Algorithm):
    """Every trial runs to its end."""

    name = "fifo"


class ASHA(Algorithm):
    """Ray's ASHA, its rungs kept across ``--resume`` (``sweeps.run.health.ResumableASHA``),
    optionally comparing a rung metric of its own (``RungMetricASHA``)."""

    name = "asha"

    def validate(self, spec: Any) -> None:
        if spec.algorithm == "grid" and spec.num_samples == 1 and len(list(iter_grid(spec))) < 2:
            raise SearchSpaceError("scheduler=asha needs several trials to compare; raise "
                                   "num_samples")

    def describe_plan(self, spec: Any, plan: Any) -> list[str]:
        a = spec.asha
        return [f"ASHA rungs compare {a.rung_metric} ({a.predictor}, calibrated on "
                f"{a.calibration})"] if a.rung_metric else []

    def scheduler(self, spec: Any) -> Any:
        base = spec.base_config
        max_t = spec.asha.max_t or (base.steps // base.eval.every_steps + 2)
        kw = dict(time_attr="training_iteration", max_t=max_t,
                  grace_period=spec.asha.grace_period,
                  reduction_factor=spec.asha.reduction_factor)
        if spec.asha.rung_metric is not None:  # rungs compare the prediction, not the metric
            return load("sweeps.run.health:RungMetricASHA")(
                metric=spec.asha.rung_metric, mode=spec.mode, **kw)
        return load("sweeps.run.health:ResumableASHA")(**kw)

    def predictor(self, spec: Any) -> Any:
        """Fitted before any training: a bad calibration fails in seconds."""
        if spec.asha.rung_metric != "predicted_final":
            return None
        return spec.asha.predictor, load("sweeps.run.curves:load_calibration")(
            spec.asha.calibration)

    def stopped_early(self, spec: Any, rows: Mapping[int, Mapping[str, Any]],
                      steps: int) -> dict[str, Any] | None:
        """ASHA stopped the trial before its last step (Tune reports that as a completion):
        its last row gets the columns of a pruned trial (rule ``asha``, the rung metric and its
        value there), so its pre-decay curve is not taken for a finished run's. None if the
        trial ran to its last step, or diverged."""
        if not rows or any(r.get("status") == "diverged" for r in rows.values()):
            return None
        step = max(rows)
        if step >= steps:
            return None
        metric = spec.asha.rung_metric or spec.metric
        value = rows[step].get(metric)
        return {"prune_rule": "asha", "prune_metric": metric, "prune_value": value,
                "prune_threshold": None, "prune_step": step,
                "reason": f"stopped by ASHA at step {step} of {steps} ({metric}="
                          f"{value if value is None else format(value, '.4g')} at its rung)"}

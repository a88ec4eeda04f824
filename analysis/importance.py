"""Which knob matters most: parameter importance of a sweep's final evals through
``optuna.importance`` (PED-ANOVA by default, as in Optuna 5; fANOVA on request), with its spread
over seeds.

    python -m analysis.importance results/upcycle_lr                 # PED-ANOVA
    python -m analysis.importance results/upcycle_lr --evaluator fanova

It reads the Parquet rows only (no torch, no Ray): ``analysis.report`` and ``analysis.compare``
call :func:`importance` on a sweep's rows.

The finished trials' final evals become completed Optuna trials (each varied knob a
distribution: a number with five or more distinct values as a float/int range, on a log scale
when they span a factor of 10 or more; a short grid and anything else, dicts included, as a
categorical of its label). PED-ANOVA's top set is Optuna's default top 10 % of the trials, but
never fewer than two trials. ``importance`` is computed on
every seed's trials together; the spread is **per seed**: the same evaluator on each seed's trials
alone (one trial per configuration), then the mean and sample standard deviation over seeds.
A seed with fewer than two trials is skipped. Importances are normalised to sum to 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from moe_core.errors import FitError, UpcycleError, cli_boundary
from sweeps.store import results as schema
from sweeps.store.results import final_rows, format_knob
from sweeps.store.storage import Location

EVALUATORS = ("ped_anova", "fanova")


@dataclass(frozen=True, slots=True)
class KnobImportance:
    knob: str
    importance: float
    """On every seed's trials together (normalised: the knobs sum to 1)."""
    seed_mean: float
    """Mean over seeds of the importance on each seed's trials alone (NaN: no seed had two)."""
    seed_std: float
    """Sample standard deviation over seeds (NaN below two seeds)."""
    per_seed: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class ImportanceTable:
    metric: str
    evaluator: str
    spread: str
    """How the spread was computed ("per seed: ...")."""
    trials: int
    seeds: tuple[int, ...]
    knobs: tuple[KnobImportance, ...]
    """Most important first."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def markdown(self) -> list[str]:
        if not self.knobs:
            return []
        out = [f"Parameter importance of the final `{self.metric}` ({self.evaluator}, "
               f"`optuna.importance`; {self.trials} trials, seeds "
               f"{', '.join(map(str, self.seeds)) or '—'}; {self.spread}).", "",
               "| knob | importance | over seeds (mean ± std) | per seed |",
               "| --- | --- | --- | --- |"]
        for k in self.knobs:
            per = ", ".join(f"{v:.3f}" for v in k.per_seed) or "—"
            spread = (f"{k.seed_mean:.3f} ± {k.seed_std:.3f}" if math.isfinite(k.seed_std)
                      else f"{k.seed_mean:.3f}" if math.isfinite(k.seed_mean) else "—")
            out.append(f"| `{k.knob}` | {k.importance:.3f} | {spread} | {per} |")
        return out + [""]


NUMERIC_LEAST = 5
"""A numeric knob with at least this many distinct values is a range; fewer (a short grid) are
categories: nothing is known between two grid points, and PED-ANOVA's density over a range
of two or three points misranks (measured on a 2 × 2 sweep, docs/looking-at-a-sweep.md)."""
TOP_LEAST = 2
"""PED-ANOVA's top set holds at least this many trials: its quantile is
``max(0.1, TOP_LEAST / trials)`` (0.1 is Optuna's default; one trial is not a distribution)."""


def _distribution(values: Sequence[Any]) -> Any:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if numeric and all(math.isfinite(v) for v in values) and len(set(values)) >= NUMERIC_LEAST:
        lo, hi = min(values), max(values)
        log = lo > 0 and hi / lo >= 10
        if all(isinstance(v, int) for v in values):
            return IntDistribution(int(lo), int(hi), log=log)
        return FloatDistribution(float(lo), float(hi), log=log)
    return CategoricalDistribution(sorted({format_knob(v) for v in values}))


def _param(v: Any, dist: Any) -> Any:
    from optuna.distributions import CategoricalDistribution
    return format_knob(v) if isinstance(dist, CategoricalDistribution) else v


def _evaluate(records: list[dict[str, Any]], knobs: Sequence[str], metric: str, mode: str,
              evaluator: str) -> dict[str, float]:
    """Importance of ``knobs`` for ``metric`` over ``records`` (knob path → value, metric)."""
    import optuna
    from optuna.importance import (
        FanovaImportanceEvaluator,
        PedAnovaImportanceEvaluator,
        get_param_importances,
    )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists = {k: _distribution([r[k] for r in records]) for k in knobs}
    dists = {k: d for k, d in dists.items() if not d.single()}
    if len(records) < 3 or not dists:  # PED-ANOVA needs a top set smaller than all trials
        return {}
    study = optuna.create_study(direction="minimize" if mode == "min" else "maximize")
    study.add_trials([optuna.trial.create_trial(
        params={k: _param(r[k], d) for k, d in dists.items()}, distributions=dists,
        value=r[metric]) for r in records])
    ev = (FanovaImportanceEvaluator(seed=0) if evaluator == "fanova"
          else PedAnovaImportanceEvaluator(
              target_quantile=max(0.1, min(0.9, TOP_LEAST / len(records)))))
    try:
        got = get_param_importances(study, evaluator=ev, normalize=True)
    except ImportError as e:
        raise FitError(f"--evaluator fanova needs scikit-learn ({e}); pip install "
                       "'upcycle-sweeps[fanova]', or use the default ped_anova") from None
    return {k: float(v) for k, v in got.items()}


def _knob_value(v: Any) -> Any:
    v = schema.decode_value(v)
    return None if isinstance(v, float) and math.isnan(v) else v


def _records(rows: Sequence[Mapping[str, Any]], metric: str
             ) -> tuple[list[dict[str, Any]], list[str]]:
    """Each finished trial's final eval (its knobs' values, seed and metric), and the knobs
    (YAML paths, the seed left out) that take more than one value among them."""
    out = []
    knobs = sorted({k for r in rows for k in r if k.startswith(schema.KNOB_PREFIX)
                    and k != schema.KNOB_PREFIX + "seed"})
    for r in final_rows(rows):
        v = r.get(metric)
        if r.get("status") != "ok" or isinstance(v, bool) or not isinstance(v, (int, float)) \
                or not math.isfinite(float(v)):
            continue
        rec = {k[len(schema.KNOB_PREFIX):]: _knob_value(r.get(k)) for k in knobs}
        rec[metric] = float(v)
        sd = r.get("seed")
        rec["_seed"] = int(sd) if isinstance(sd, (int, float)) and math.isfinite(sd) else None
        out.append(rec)
    paths = [k[len(schema.KNOB_PREFIX):] for k in knobs]
    varied = [k for k in paths if len({format_knob(x[k]) for x in out}) > 1]
    return out, varied


def importance(rows: Sequence[Mapping[str, Any]], metric: str = "val_loss", mode: str = "min",
               evaluator: str = "ped_anova") -> ImportanceTable:
    """Parameter importance of a sweep's varied knobs for the final ``metric`` from its
    results rows (module docstring); an empty table when no knob varies or fewer than two
    trials finished."""
    if evaluator not in EVALUATORS:
        raise FitError(f"evaluator {evaluator!r} is not known; use one of {', '.join(EVALUATORS)}")
    recs, knobs = _records(rows, metric)
    pooled = _evaluate(recs, knobs, metric, mode, evaluator)
    seeds = sorted({r["_seed"] for r in recs if r["_seed"] is not None})
    per: dict[int, dict[str, float]] = {}
    for sd in seeds:
        got = _evaluate([r for r in recs if r["_seed"] == sd], knobs, metric, mode, evaluator)
        if got:
            per[sd] = got
    out = []
    for k in pooled:
        vals = [per[sd].get(k, 0.0) for sd in per]
        out.append(KnobImportance(
            k, pooled[k], float(np.mean(vals)) if vals else math.nan,
            float(np.std(vals, ddof=1)) if len(vals) > 1 else math.nan, tuple(vals)))
    out.sort(key=lambda x: -x.importance)
    spread = (f"spread per seed: the evaluator on each seed's trials alone, over "
              f"{len(per)} seed(s)")
    return ImportanceTable(metric, evaluator, spread, len(recs), tuple(per), tuple(out))


def _load(path: str) -> list[dict[str, Any]]:
    p = Location.of(path)
    f = p / schema.RESULTS_FILE if p.is_dir() else p
    if not f.exists():
        raise UpcycleError(f"{path}: no {schema.RESULTS_FILE} (run python -m sweeps.run first)")
    return schema.read_rows(f)


@cli_boundary(kept="the inputs are unchanged")
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.importance",
                                 description="Parameter importance of a sweep's knobs.")
    ap.add_argument("results", help="a sweep's results directory")
    ap.add_argument("--evaluator", choices=EVALUATORS, default="ped_anova")
    ap.add_argument("--metric", default="val_loss")
    ap.add_argument("--mode", choices=("min", "max"), default="min")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    args = ap.parse_args(argv)
    logging.getLogger("optuna").setLevel(logging.WARNING)
    t = importance(_load(args.results), args.metric, args.mode, args.evaluator)
    print(json.dumps(t.to_json(), indent=1) if args.json else
          "\n".join(t.markdown() or [f"{args.results}: no knob varies; nothing to rank"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How noisy is one trial, and how much of that noise do trials that share a parent or a WSD
stable run share? Measured from a sweep run with several seeds.

A scaling-law interval is only as honest as its noise model. Every bootstrap here resamples
trials, which treats the trials of one WSD stable run (and one parent) as independent draws;
``sweeps.testing.simulate`` draws them independently unless ``sigma_group`` says otherwise.
Branches of
one stable run share its initialisation, data order and trajectory up to their decay, so their
errors may be correlated. This module measures that from seed replicates:

- each *point* (the configuration without its seed, by default (D1, D2)) is run with several
  seeds; a trial's deviation is its ln L minus the mean ln L of its point over those seeds;
- ``sigma``: the per-trial standard deviation of ln L from seed to seed (pooled over points,
  unbiased: Σ dev² / Σ (n − 1));
- ``sigma_group`` and ``icc``: the covariance of the deviations of two trials at *different*
  points that share a group (by default ``parent_key``: in a D1 × D2 sweep, the parent and the
  WSD stable run of one D1 and seed), pooled over pairs the same way (Σ dev_a·dev_b / (n − 1)
  over the seeds present at both, means over those seeds), and its share of sigma²: the
  intra-class correlation. ICC 0 means branches are independent evidence; ICC 1 means a group
  measures one number however many branches it has;
- ``by_distance``: that correlation by the distance of the two points along ``axis`` (octaves
  of D2 by default): nearby budgets decay off nearly the same stable checkpoint;
- ``length`` and ``share``: the fading of that correlation fitted as share·exp(−d²/2ℓ²) (the
  kernel ``sweeps.testing.simulate`` draws a group's effect from, and ``law.length`` /
  ``analysis.decide --noise fading`` bootstrap with), weighted least squares over the
  distances, each weighted by its pairs (:func:`fading_fit`);
- ``group_fixed``: every replicated point has the same group in all its seeds (e.g. a sweep with
  ``parent.seed`` set: one parent for every seed). The group's own effect then does not vary
  between seeds and is *not* in ``sigma``: the figures are the noise given the group, and pairs
  of one group and seed measure what the trials below it share (the stable run).

These are moment estimates: with few seeds they are rough (three seeds give each point two
degrees of freedom), and the report says how many points, pairs and seeds they rest on.

``python -m analysis.noise RESULTS [--point D1,D2] [--group parent_key] [--axis D2] [--json]``
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from analysis.data import final_evals, read_table
from moe_core.errors import FitError
from sweeps.store.results import json_safe


@dataclass(frozen=True)
class NoiseStructure:
    """Seed-to-seed noise of ln L and its share common to a group (module docstring)."""

    sigma: float
    """Per-trial standard deviation of ln L from seed to seed."""
    sigma_group: float
    """Standard deviation of the part shared by two trials of one group (0 when the pooled
    covariance is negative)."""
    sigma_own: float
    """Standard deviation of the rest, each trial's own."""
    icc: float
    """Shared covariance / sigma² (may be slightly negative by chance)."""
    by_distance: list[dict[str, float]]
    """[{"distance": octaves along ``axis``, "corr": …, "pairs": …}], nearest first."""
    points: int
    seeds: int
    groups: int
    pairs: int
    point: tuple[str, ...]
    group: str
    axis: str | None
    group_fixed: bool = False
    """The group is the same in every seed at every replicated point (module docstring)."""
    length: float | None = None
    """Octaves of ``axis`` over which the shared correlation fades (:func:`fading_fit`); None:
    fewer than two distances with a positive correlation."""
    share: float | None = None
    """The fitted correlation at distance 0 (the ICC to give with ``length``)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (a NaN, e.g. no measurable shared part, is None)."""
        d = json_safe(asdict(self))
        d["by_distance"] = [json_safe(r) for r in d["by_distance"]]
        return d


def noise_structure(df, *, point: Sequence[str] = ("D1", "D2"), group: str = "parent_key",
                    axis: str | None = "D2", metric: str = "val_loss") -> NoiseStructure:
    """The noise structure of ``metric`` (natural log) in a results frame's final evals (see the
    module's docstring). Needs a ``seed`` column with at least two seeds at some point."""
    df = final_evals(df)
    need = [*point, "seed", metric, *([group] if group else [])]
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise FitError(f"no column {missing[0]!r} in the results (columns: "
                       f"{', '.join(map(str, df.columns[:15]))}, …)")
    n0 = len(df)
    df = df.dropna(subset=[*point, "seed", metric])
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.log(df[metric].astype(float).to_numpy())
    ok = np.isfinite(y)
    df, y = df[ok], y[ok]
    if len(df) < n0:  # said, never silent
        logging.getLogger("analysis").warning(
            "analysis.noise: left out %d of %d final evals (a missing %s, seed or %s, or a "
            "non-positive or non-finite %s)", n0 - len(df), n0, "/".join(point), metric, metric)
    keys = [tuple(r) for r in df[list(point)].itertuples(index=False, name=None)]
    seeds = df["seed"].astype(int).to_numpy()
    groups = df[group].astype(str).to_numpy() if group else np.array([""] * len(df))
    at: dict[tuple, dict[int, tuple[float, str]]] = defaultdict(dict)
    for k, s, v, g in zip(keys, seeds, y, groups):
        at[k][int(s)] = (float(v), g)  # one trial per (point, seed): the final eval
    reps = {k: v for k, v in at.items() if len(v) >= 2}
    if not reps:
        raise FitError("no point was run with two or more seeds: run the sweep with "
                       "seeds: [0, 1, 2] (or --set 'seeds=[0,1,2]') to measure its noise")
    ss = sum(_ss(v) for v in reps.values())
    dof = sum(len(v) - 1 for v in reps.values())
    var = ss / dof
    # pairs of distinct points whose trials of one seed share a group
    pts = sorted(reps)
    cov_sum, cov_dof, n_pairs = 0.0, 0, 0
    by_d: dict[float, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    ai = list(point).index(axis) if axis in point else None
    for i, a in enumerate(pts):
        for b in pts[i + 1:]:
            common = [s for s in reps[a] if s in reps[b] and group and
                      reps[a][s][1] == reps[b][s][1] and reps[a][s][1] not in ("", "nan")]
            if len(common) < 2:
                continue
            ya = np.array([reps[a][s][0] for s in common])
            yb = np.array([reps[b][s][0] for s in common])
            c = float(np.sum((ya - ya.mean()) * (yb - yb.mean())))
            cov_sum, cov_dof, n_pairs = cov_sum + c, cov_dof + len(common) - 1, n_pairs + 1
            if ai is not None and a[ai] > 0 and b[ai] > 0:
                dist = round(abs(math.log2(float(b[ai]) / float(a[ai]))), 3)
                acc = by_d[dist]
                acc[0] += c
                acc[1] += len(common) - 1
                acc[2] += 1
    cov = cov_sum / cov_dof if cov_dof else 0.0
    by_distance = [{"distance": d, "corr": (v[0] / v[1]) / var if var > 0 else float("nan"),
                    "pairs": int(v[2])} for d, v in sorted(by_d.items())]
    fade = fading_fit(by_distance)
    n_groups = len({g for v in reps.values() for _, g in v.values()})
    fixed = bool(group) and all(len({g for _, g in v.values()}) == 1 for v in reps.values())
    return NoiseStructure(
        sigma=math.sqrt(var), sigma_group=math.sqrt(max(cov, 0.0)),
        sigma_own=math.sqrt(max(var - max(cov, 0.0), 0.0)),
        icc=cov / var if var > 0 and cov_dof else float("nan"),
        by_distance=by_distance,
        points=len(reps), seeds=len({s for v in reps.values() for s in v}), groups=n_groups,
        pairs=n_pairs, point=tuple(point), group=group, axis=axis if ai is not None else None,
        group_fixed=fixed, length=None if fade is None else fade[1],
        share=None if fade is None else fade[0])


def fading_fit(by_distance: Sequence[dict[str, float]], share: float | None = None
               ) -> tuple[float, float] | None:
    """(share, ℓ) minimising Σ pairs_d·(corr_d − share·exp(−d²/2ℓ²))² over the measured
    distances d (share in [0, 1], or held at ``share``): the squared-exponential kernel of a
    group's fading effect (sweeps.testing.simulate; Rahimi & Recht's features draw it). None when
    fewer than two distances (one with ``share`` given) have a positive correlation."""
    from scipy.optimize import least_squares

    rows = [r for r in by_distance if r["distance"] > 0 and math.isfinite(r["corr"])]
    if sum(r["corr"] > 0 for r in rows) < (1 if share is not None else 2):
        return None
    d = np.array([r["distance"] for r in rows], dtype=float)
    c = np.array([r["corr"] for r in rows], dtype=float)
    w = np.sqrt(np.array([r["pairs"] for r in rows], dtype=float))

    def resid(p):
        s0, ell = (share, p[0]) if share is not None else p
        return w * (c - s0 * np.exp(-d ** 2 / (2 * ell ** 2)))

    start = [float(np.median(d))] if share is not None else [min(1.0, c.max()), float(np.median(d))]
    lo, hi = ([0.01], [1e3]) if share is not None else ([0.0, 0.01], [1.0, 1e3])
    p = least_squares(resid, start, bounds=(lo, hi)).x
    return (float(share), float(p[0])) if share is not None else (float(p[0]), float(p[1]))


def _ss(v: dict[int, tuple[float, str]]) -> float:
    x = np.array([y for y, _ in v.values()])
    return float(np.sum((x - x.mean()) ** 2))


def read_noise(results, **kw) -> NoiseStructure:
    """:func:`noise_structure` of a results path (directory, Parquet or CSV)."""
    return noise_structure(read_table(results), **kw)


def format_noise(n: NoiseStructure) -> list[str]:
    """The report's lines."""
    out = [f"seed-to-seed noise of ln L: sigma = {n.sigma:.4g} per trial "
           f"({n.points} points × up to {n.seeds} seeds)"]
    if n.group_fixed:
        out.append(f"note: each point has one {n.group} in all its seeds (e.g. parent.seed set), "
                   f"so its effect does not vary between seeds and is not in these figures: "
                   f"they are the noise given the {n.group}; vary its seed to measure it")
    if n.pairs:
        out.append(f"shared by trials of one {n.group} (different {', '.join(n.point)}): "
                   f"ICC = {n.icc:.2f} (sigma_group = {n.sigma_group:.4g}, own = "
                   f"{n.sigma_own:.4g}; {n.pairs} pairs of points in {n.groups} groups)")
        for d in n.by_distance:
            out.append(f"  {d['distance']:g} octaves of {n.axis} apart: correlation "
                       f"{d['corr']:.2f} ({d['pairs']} pairs)")
        if n.length is not None:
            out.append(f"  fitted fading: correlation {n.share:.2f}·exp(-d²/2·{n.length:.2f}²) "
                       f"at d octaves of {n.axis} (law: {{noise: groups, icc: {n.share:.2f}, "
                       f"length: {n.length:.2f}}}; analysis.decide --noise fading --icc "
                       f"{n.share:.2f} --length {n.length:.2f})")
        out.append("for sweeps.testing.simulate / studies/law_search.py: "
                   f"sigma = {n.sigma_own:.4g}, sigma_group = {n.sigma_group:.4g}"
                   if n.icc > 0 else
                   f"no shared component: given the {n.group}, trials are independent evidence"
                   if n.group_fixed else
                   "no shared component: trials are independent evidence")
    else:
        out.append(f"no two points share a {n.group} in the same seed: the shared part is "
                   "not measurable from these data")
    return out

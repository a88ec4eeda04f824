"""One sweep's results as typed data: its trials grouped by configuration.

A :class:`Group` is one configuration (the knob values without the seed) with its seeds' final
evals and the mean/std/n of each final metric (:class:`Stat`); a :class:`Sweep` holds every row,
each trial's final eval, and the groups, best first. Knobs are keyed by their YAML path
(``moe.router.order``), values decoded (``upcycle.lr_policy`` → a dict, null → None).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from analysis.data import final_evals, ok_trials, read_summary, read_table
from moe_core.errors import FitError
from sweeps.store import results as schema
from sweeps.store.storage import is_url

STATS = ["router.cos_to_parent", "router.max1_max2", "router.max2_max3",
         "router.expert_similarity", "router.max_load", "router.drop_rate", "aux_loss"]
"""Router statistics (and the aux loss) summarised per configuration."""
METRICS = ("val_loss", "train_loss", *STATS)
"""Final metrics every group summarises up front (others on demand, :meth:`Group.stat`)."""

# What each router statistic means, one line each (``moe_core.train.evaluate``,
# ``moe_core.moe.stats``): measured on an eval's validation batches, averaged over MoE layers
# unless said otherwise. The report prints the lines of the columns it shows.
ROUTER_METRICS: dict[str, str] = {
    "router.max_load": "share of the token-to-expert assignments the busiest expert receives "
                       "(1/E is perfect balance, 1 is every token on one expert)",
    "router.min_load": "share the least-used expert receives (0: an expert no token reached)",
    "router.dead_experts": "experts no validation token reached, summed over the MoE layers "
                           "(002 §4)",
    "router.entropy": "mean entropy of each token's router distribution in nats (ln E: "
                      "uniform, 0: one expert gets all the probability)",
    "router.max1_max2": "mean ratio of each token's largest to second-largest router "
                        "probability (002 §4.1; near 1: the router hesitates between experts)",
    "router.max2_max3": "the same for the second- and third-largest probabilities",
    "router.expert_similarity": "mean cosine similarity of the experts' flattened weights "
                                "within a layer (002 Fig. 1; 1: the experts are still "
                                "identical copies)",
    "router.cos_to_parent": "mean cosine similarity of each expert's weights to the dense "
                            "parent's MLP (004 Fig. 6; 1: not moved from the parent)",
    "router.drop_rate": "share of assignments dropped by the expert capacity limit (0 when "
                        "dropless)",
    "router.overflow_rate_cf1": "share of assignments that would overflow at capacity factor "
                                "1 (an imbalance signal, 002 §4.2)",
    "router.aux_switch": "Switch load-balancing loss, normalised to 1 at perfect balance "
                         "(000 App. A.3)",
    "router.aux_coef": "the coefficient the balancing loss is multiplied by",
    "router.max_vio": "MaxVio, (largest expert load − mean load) / mean load (0: balanced, "
                      "E − 1: one expert takes all; Wang et al. 2024, arXiv:2408.15664)",
    "aux_loss": "the auxiliary loss added to the LM loss (coefficient × balancing loss, plus "
                "the z-loss if set)",
}


def glossary_lines(columns: Iterable[str]) -> list[str]:
    """``- name: meaning`` for each router statistic among ``columns``, in their order."""
    return [f"- `{c}`: {ROUTER_METRICS[c]}" for c in columns if c in ROUTER_METRICS]



def format_knob(v: Any) -> str:
    """A knob value as the labels show it (null for a missing value)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "null"
    return schema.format_knob(v)


def knob_value(v: Any) -> Any:
    """A knob cell as a value: JSON text decoded, a missing value (NaN) as None."""
    v = schema.decode_value(v)
    return None if isinstance(v, float) and math.isnan(v) else v


def _values(rows: Iterable[Mapping[str, Any]], metric: str) -> list[float]:
    """The finite numeric values of ``metric`` in ``rows``."""
    vals = (r.get(metric) for r in rows)
    return [float(x) for x in vals if isinstance(x, (int, float, np.number))
            and math.isfinite(float(x))]


@dataclass(frozen=True)
class Stat:
    """Mean, sample standard deviation (NaN below two values) and count of a metric."""

    mean: float
    std: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat:
        vals = np.array(values, dtype=float)
        return cls(float(vals.mean()) if len(vals) else math.nan,
                   float(vals.std(ddof=1)) if len(vals) > 1 else math.nan, len(vals))

    @property
    def finite(self) -> bool:
        return math.isfinite(self.mean)


@dataclass(frozen=True, eq=False)
class Group:
    """One configuration: its label, knob values (YAML path → value), the final-eval row of
    each of its trials (seeds), and the metrics' :class:`Stat` over those rows."""

    label: str
    knobs: Mapping[str, Any]
    rows: tuple[Mapping[str, Any], ...]
    trials: tuple[str, ...]
    stats: Mapping[str, Stat]

    def values(self, metric: str) -> list[float]:
        """The finite values of ``metric`` over the group's trials."""
        return _values(self.rows, metric)

    def stat(self, metric: str) -> Stat:
        s = self.stats.get(metric)
        return s if s is not None else Stat.of(self.values(metric))

    def knob(self, path: str, default: Any = None) -> Any:
        """The value at YAML ``path``: a knob's, or a key inside a dict-valued knob
        (``upcycle.lr_policy.policy`` of the knob ``upcycle.lr_policy``)."""
        if path in self.knobs:
            return self.knobs[path]
        for k, node in self.knobs.items():
            if path.startswith(k + "."):
                for part in path[len(k) + 1:].split("."):
                    if not isinstance(node, Mapping) or part not in node:
                        return default
                    node = node[part]
                return node
        return default


@dataclass(frozen=True, eq=False)
class Sweep:
    """One sweep's results: every row, each trial's final eval, and the configuration groups
    (best val_loss first)."""

    name: str
    path: Path
    rows: Any
    finals: Any
    knobs: tuple[str, ...]
    """Knob YAML paths (without ``knob.``), the seed left out."""
    summary: dict[str, Any] | None = None
    groups: tuple[Group, ...] = ()

    def ok_rows(self):
        """Every eval of the trials that finished."""
        return ok_trials(self.rows)

    def varies(self, path: str) -> bool:
        """Whether the groups ran more than one value at YAML ``path`` (a knob, or a key of a
        dict-valued knob)."""
        return len({format_knob(g.knob(path)) for g in self.groups}) > 1

    @property
    def varied(self) -> tuple[str, ...]:
        """The knobs that take more than one value."""
        return tuple(k for k in self.knobs if self.varies(k))

    @property
    def stat_columns(self) -> list[str]:
        """The statistics of :data:`STATS` that some group has."""
        return [c for c in STATS if any(g.stat(c).finite for g in self.groups)]

    def group_of(self, trial_id: str) -> Group | None:
        for g in self.groups:
            if trial_id in g.trials:
                return g
        return None


def _short_names(knobs: Sequence[str]) -> dict[str, str]:
    """Last segment of each knob's path, longer where two knobs would share it
    (``parent.tokens`` and ``tokens``)."""
    out = {}
    for k in knobs:
        parts = k.split(".")
        n = 1
        while n < len(parts) and sum(o.split(".")[-n:] == parts[-n:] for o in knobs) > 1:
            n += 1
        out[k] = ".".join(parts[-n:])
    return out


def _label(row: Mapping[str, Any], knobs: Sequence[str]) -> str:
    if not knobs:
        return "all"
    names = _short_names(knobs)
    parts = []
    for k in knobs:
        v, short = format_knob(row.get(schema.KNOB_PREFIX + k)), names[k]
        parts.append(f"{short}({v})" if "=" in v else f"{short}={v}")
    return ", ".join(parts)


def _group(label: str, rows: list[dict[str, Any]], knobs: Sequence[str]) -> Group:
    trials = tuple(r["trial_id"] if "trial_id" in r else str(i) for i, r in enumerate(rows))
    vals = {k: knob_value(rows[0].get(schema.KNOB_PREFIX + k)) for k in knobs}
    return Group(label, vals, tuple(rows), trials, {m: Stat.of(_values(rows, m)) for m in METRICS})


def group_finals(finals, knobs: Sequence[str]) -> list[Group]:
    """Configurations (knob values without the seed) of the final evals, best val_loss first."""
    by_label: dict[str, list[dict[str, Any]]] = {}
    for r in finals.to_dict("records"):
        by_label.setdefault(_label(r, knobs), []).append(r)
    groups = [_group(lab, rows, knobs) for lab, rows in by_label.items()]
    return sorted(groups, key=lambda g: g.stat("val_loss").mean if g.stat("val_loss").finite
                  else math.inf)


def _knob_paths(columns: Iterable[str]) -> tuple[str, ...]:
    p = schema.KNOB_PREFIX
    return tuple(sorted(c[len(p):] for c in columns if c.startswith(p) and c != p + "seed"))


def load_sweep(path: str | Path) -> Sweep:
    """A sweep's results directory (or results file; a local path or a URL) as a
    :class:`Sweep`."""
    path = path.rstrip("/") if is_url(path) else Path(path)
    rows = read_table(path)
    if rows.empty:
        raise FitError(f"{path}: the results are empty")
    finals = final_evals(rows)
    knobs = _knob_paths(rows.columns)
    named = rows["sweep"].dropna() if "sweep" in rows.columns else ()
    name = str(named.iloc[0]) if len(named) else str(path).rsplit("/", 1)[-1]
    return Sweep(name, path, rows, finals, knobs, read_summary(path),
                 tuple(group_finals(finals, knobs)))

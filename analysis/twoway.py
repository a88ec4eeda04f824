"""Two-way views of sweeps: for each pair of varied knobs, the joint table of the final metric
(mean over seeds per cell) and an interaction plot; across sweeps, the cells two sweeps share
(the same configuration, seeds aside) overlaid.

A knob's marginal (``analysis.compare``'s one-way table) averages over the other knobs; when the
best value of one knob depends on another, only the joint table shows it. ``seed`` is never a
knob here: cells pool their seeds. Colours come from a qualitative palette (tab10), so two
values are two distinct hues, never the two ends of a sequential map. Used by
``python -m analysis.compare`` and ``python -m analysis.report``.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from analysis.claims import MIN_LOSS, NEEDS_SEEDS, REPRODUCED, paired_verdict
from moe_core.fsio import atomic_write
from sweeps.spec.naming import short_keys
from sweeps.store.results import CONFIG_SECTIONS, KNOB_PREFIX, final_rows, format_knob

SEED_KNOB = KNOB_PREFIX + "seed"
PALETTE = "tab10"
"""Qualitative colours: legible with two values and up to ten."""


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(float(v)) else None


def ok_finals(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The final row of each trial that finished (status ok)."""
    return [r for r in final_rows(rows) if r.get("status") == "ok"]


def _order(values: set[str]) -> list[str]:
    """Knob values in numeric order where they are all numbers, else as text."""
    try:
        return sorted(values, key=float)
    except ValueError:
        return sorted(values)


def varied_knobs(finals: Sequence[Mapping[str, Any]]) -> list[str]:
    """Knob columns (never ``knob.seed``) that take more than one value in ``finals``."""
    cols = sorted({k for r in finals for k in r if k.startswith(KNOB_PREFIX) and k != SEED_KNOB})
    return [c for c in cols if len({format_knob(r.get(c)) for r in finals}) > 1]


def follows(finals: Sequence[Mapping[str, Any]], knob: str, leader: str) -> bool:
    """Every trial with the same ``leader`` value has the same ``knob`` value, and ``knob``
    takes no more values than ``leader``: ``knob`` is tied to ``leader`` (an ``expr`` knob such
    as ``num_experts: {expr: 8 * moe.granularity}``), not a second factor of the design."""
    seen: dict[str, str] = {}
    for r in finals:
        if seen.setdefault(format_knob(r.get(leader)), format_knob(r.get(knob))) != \
                format_knob(r.get(knob)):
            return False
    return len(set(seen.values())) <= len(seen)


def folded_knobs(finals: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """The varied knobs that are factors of the design, each with the knobs tied to it (folded
    in: a 2 × 2 design whose knobs each carry an ``expr`` knob is one table, not six)."""
    out: dict[str, list[str]] = {}
    for k in varied_knobs(finals):
        lead = next((f for f in out if follows(finals, k, f)), None)
        if lead is None:
            out[k] = []
        else:
            out[lead].append(k)
    return out


def seed_verdict(better: Mapping[Any, float], worse: Mapping[Any, float],
                 metric: str = "val_loss", mode: str = "min") -> str:
    """"``better`` beats ``worse``" by the claims' paired-by-seed rule
    (``analysis.claims.paired_verdict``): ``needs ≥ 2 seeds`` when fewer than 2 seeds are
    common to both cells."""
    common = sorted(set(better) & set(worse), key=str)
    if len(common) < 2:
        return NEEDS_SEEDS
    sign = -1 if mode == "min" else 1
    d = np.array([sign * (better[k] - worse[k]) for k in common])
    scale = max(abs(float(np.mean(list(better.values())))), 1e-12)
    return paired_verdict(d, MIN_LOSS if "loss" in metric else 0.005 * scale)[0]


@dataclass(frozen=True)
class JointTable:
    """The final metric of every (a, b) cell: its values over seeds (and, where the rows name
    their seeds, the value per seed, for the per-seed agreement a "best" needs)."""

    a: str
    b: str
    a_values: tuple[str, ...]
    b_values: tuple[str, ...]
    cells: Mapping[tuple[str, str], tuple[float, ...]]
    by_seed: Mapping[tuple[str, str], Mapping[Any, float]] | None = None
    metric: str = "val_loss"

    def supported_best(self, va: str, mode: str = "min") -> tuple[str | None, str]:
        """The best b at ``a = va`` when it beats every other b of the row by the claims' rule
        (paired by seed), else None; and why not (``needs ≥ 2 seeds`` or ``inconclusive``)."""
        best = self.best_b(va, mode)
        seeds = self.by_seed or {}
        if best is None:
            return None, "empty"
        why = REPRODUCED
        for vb in self.b_values:
            if vb == best or not self.cells.get((va, vb)):
                continue
            v = seed_verdict(seeds.get((va, best), {}), seeds.get((va, vb), {}),
                             self.metric, mode)
            if v == NEEDS_SEEDS:
                return None, NEEDS_SEEDS
            if v != REPRODUCED:
                why = v
        return (best, why) if why == REPRODUCED else (None, "inconclusive")

    @property
    def names(self) -> tuple[str, str]:
        """The two knobs' short names (``top_k`` for ``knob.moe.top_k``)."""
        n = short_keys([self.a[len(KNOB_PREFIX):], self.b[len(KNOB_PREFIX):]])
        return tuple(n.values())  # type: ignore[return-value]

    def mean(self, va: str, vb: str) -> float | None:
        v = self.cells.get((va, vb), ())
        return statistics.fmean(v) if v else None

    def best_b(self, va: str, mode: str = "min") -> str | None:
        """The b value with the best mean at ``a = va`` (None if the row is empty)."""
        got = [(m, vb) for vb in self.b_values if (m := self.mean(va, vb)) is not None]
        if not got:
            return None
        return (min if mode == "min" else max)(got)[1]

    def transposed(self) -> JointTable:
        """The same cells with a and b swapped."""
        return JointTable(self.b, self.a, self.b_values, self.a_values,
                          {(vb, va): v for (va, vb), v in self.cells.items()},
                          {(vb, va): v for (va, vb), v in (self.by_seed or {}).items()},
                          self.metric)

    def _best_line(self, mode: str) -> str:
        """What the data hold about the best b at each a: a best only where it beats the rest
        of its row on every seed (the claims' rule); "depends on" only between such bests."""
        a, b = self.names
        got = {va: self.supported_best(va, mode) for va in self.a_values}
        shown = {va: vb for va, (vb, _) in got.items() if vb is not None}
        if any(why == NEEDS_SEEDS for _, why in got.values()):
            return f"best {b} at each {a}: {NEEDS_SEEDS}"
        if not shown:
            return (f"no {b} is best at any {a} on every seed (paired by seed, as the claims: "
                    "inconclusive)")
        open_ = [va for va in self.a_values if va not in shown]
        rest = (f"; at {', '.join(f'{a}={va}' for va in open_)} no {b} is best on every seed"
                if open_ else "")
        if len(set(shown.values())) == 1:
            where = f"at every {a}" if not open_ else "at " + ", ".join(
                f"{a}={va}" for va in shown)
            return f"best {b} = {next(iter(shown.values()))} {where}{rest}"
        return f"best {b} depends on {a}: " + ", ".join(
            f"{vb} at {a}={va}" for va, vb in shown.items()) + rest

    def interaction(self, mode: str = "min") -> str:
        """One line: whether the best b is the same at every a (and the best a at every b),
        and for a 2 × 2 table the interaction contrast
        (y[a2,b2] − y[a2,b1]) − (y[a1,b2] − y[a1,b1])."""
        a, b = self.names
        line = f"{self._best_line(mode)}; {self.transposed()._best_line(mode)}"
        if len(self.a_values) == 2 and len(self.b_values) == 2:
            (a1, a2), (b1, b2) = self.a_values, self.b_values
            m = [self.mean(x, y) for x in (a1, a2) for y in (b1, b2)]
            if None not in m:
                line += (f"; interaction contrast ({b}={b2} − {b}={b1} at {a}={a2}) − (same at "
                         f"{a}={a1}) = {(m[3] - m[2]) - (m[1] - m[0]):+.4g}")
        seeds = {len(v) for v in self.cells.values()}
        if seeds == {1}:
            line += " (one seed per cell: no noise estimate)"
        return line


def joint_table(finals: Sequence[Mapping[str, Any]], a: str, b: str,
                metric: str = "val_loss") -> JointTable:
    """The ``a`` × ``b`` table of ``metric`` over ``finals`` (one row per trial)."""
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    by_seed: dict[tuple[str, str], dict[Any, float]] = defaultdict(dict)
    for r in finals:
        v = _finite(r.get(metric))
        if v is not None:
            k = (format_knob(r.get(a)), format_knob(r.get(b)))
            cells[k].append(v)
            seed = r.get(SEED_KNOB, r.get("seed"))
            if seed is not None:
                by_seed[k][seed] = v
    return JointTable(a, b, tuple(_order({k[0] for k in cells})),
                      tuple(_order({k[1] for k in cells})),
                      {k: tuple(v) for k, v in cells.items()}, dict(by_seed), metric)


def knob_pairs(finals: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """Every pair of the design's factors (seed excluded; ``expr``-tied knobs folded into the
    knob they follow, :func:`folded_knobs`)."""
    return list(itertools.combinations(folded_knobs(finals), 2))


def markdown(jt: JointTable, metric: str, mode: str = "min") -> list[str]:
    """The joint table as markdown: rows = a's values, columns = b's, cells = mean over seeds
    (n when more than one), the best of each row in bold."""
    a, b = jt.names
    lines = [f"| {a} \\ {b} | " + " | ".join(jt.b_values) + " |",
             "|---|" + "---|" * len(jt.b_values)]
    for va in jt.a_values:
        best = jt.supported_best(va, mode)[0]
        cells = []
        for vb in jt.b_values:
            vals = jt.cells.get((va, vb), ())
            if not vals:
                cells.append("—")
                continue
            txt = f"{statistics.fmean(vals):.4f}" + (f" (n={len(vals)})" if len(vals) > 1
                                                     else "")
            cells.append(f"**{txt}**" if vb == best else txt)
        lines.append(f"| {va} | " + " | ".join(cells) + " |")
    return [*lines, "", f"{metric}: {jt.interaction(mode)}.", ""]


def empty_cells(jt: JointTable) -> int:
    """How many (a, b) cells of the table hold no trial."""
    return sum(1 for va in jt.a_values for vb in jt.b_values if not jt.cells.get((va, vb)))


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    plt = _plt()
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return path


def colors(n: int) -> list[tuple[float, float, float, float]]:
    """``n`` qualitative colours (tab10, cycling): distinct hues, none pale on white."""
    cmap = _plt().get_cmap(PALETTE)
    return [cmap(i % 10) for i in range(n)]


def plot_interaction(jt: JointTable, metric: str, path: Path, title: str) -> Path:
    """Interaction plot: ``metric`` against a's values, one line per b value (qualitative
    colours, markers), error bars = std over seeds where a cell has several. Parallel lines:
    no interaction; crossing lines: the best b depends on a."""
    plt = _plt()
    cs = colors(len(jt.b_values))
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    xs = range(len(jt.a_values))
    for i, vb in enumerate(jt.b_values):
        pts = [(x, jt.cells.get((va, vb), ())) for x, va in zip(xs, jt.a_values)]
        pts = [(x, v) for x, v in pts if v]
        ax.errorbar([x for x, _ in pts], [statistics.fmean(v) for _, v in pts],
                    yerr=[statistics.stdev(v) if len(v) > 1 else 0 for _, v in pts],
                    color=cs[i], marker="os^Dv"[i % 5], capsize=3, lw=1.5,
                    label=f"{jt.names[1]}={vb}")
        for x, v in pts:
            ax.scatter([x] * len(v), v, color=cs[i], s=10, alpha=0.5)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(jt.a_values, fontsize=8)
    ax.set_xlabel(jt.names[0])
    ax.set_ylabel(f"final {metric}")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


# ---- across sweeps: the cells they share -------------------------------------------------------


def cell_key(row: Mapping[str, Any]) -> tuple[tuple[str, str], ...] | None:
    """A trial's configuration without its seed: every config column (``model.*``, ``moe.*``,
    …, ``tokens_budget``) but those named ``seed``, nulls left out. None when the row has no
    config values (then no cell can be said to be shared)."""
    items = [(k, format_knob(v)) for k, v in row.items()
             if (k.split(".")[0] in CONFIG_SECTIONS or k == "tokens_budget")
             and k.rsplit(".", 1)[-1] != "seed" and v is not None
             and not (isinstance(v, float) and math.isnan(v))]
    return tuple(sorted(items)) or None


def _knob_label(row: Mapping[str, Any]) -> str:
    knobs = [(k[len(KNOB_PREFIX):], format_knob(v)) for k, v in sorted(row.items())
             if k.startswith(KNOB_PREFIX) and k != SEED_KNOB and v is not None]
    return ", ".join(f"{k}={v}" for k, v in knobs) or "base"


@dataclass(frozen=True)
class SharedCell:
    """One configuration two sweeps both ran: per sweep, its label there and the trials."""

    sweeps: tuple[str, str]
    labels: tuple[str, str]
    trials: tuple[tuple[str, ...], tuple[str, ...]]
    values: tuple[tuple[float, ...], tuple[float, ...]]


def shared_cells(sweeps: Mapping[str, Sequence[Mapping[str, Any]]],
                 metric: str = "val_loss") -> list[SharedCell]:
    """Every configuration that two of ``sweeps`` (name → rows) both ran to the end."""
    by_sweep: dict[str, dict[Any, list[dict[str, Any]]]] = {}
    for name, rows in sweeps.items():
        cells: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for r in ok_finals(rows):
            k = cell_key(r)
            if k is not None:
                cells[k].append(r)
        by_sweep[name] = cells
    out = []
    for s1, s2 in itertools.combinations(by_sweep, 2):
        for k in by_sweep[s1].keys() & by_sweep[s2].keys():
            r1, r2 = by_sweep[s1][k], by_sweep[s2][k]
            out.append(SharedCell(
                (s1, s2), (_knob_label(r1[0]), _knob_label(r2[0])),
                (tuple(str(r["trial_id"]) for r in r1), tuple(str(r["trial_id"]) for r in r2)),
                (tuple(v for r in r1 if (v := _finite(r.get(metric))) is not None),
                 tuple(v for r in r2 if (v := _finite(r.get(metric))) is not None))))
    return sorted(out, key=lambda c: (c.sweeps, c.labels))


def shared_markdown(cells: Sequence[SharedCell], metric: str) -> list[str]:
    """The shared cells as a table: the configuration as each sweep names it, and each
    sweep's mean final metric there (the difference: their run-to-run agreement)."""
    if not cells:
        return []
    lines = [f"| sweep A | cell in A | {metric} A | sweep B | cell in B | {metric} B | B − A |",
             "|---|---|---|---|---|---|---|"]
    for c in cells:
        m = [statistics.fmean(v) if v else None for v in c.values]
        diff = f"{m[1] - m[0]:+.4f}" if None not in m else "—"
        fmt = [f"{x:.4f} (n={len(v)})" if x is not None else "—" for x, v in zip(m, c.values)]
        lines.append(f"| {c.sweeps[0]} | {c.labels[0]} | {fmt[0]} | {c.sweeps[1]} | "
                     f"{c.labels[1]} | {fmt[1]} | {diff} |")
    return [*lines, ""]


def plot_overlay(sweeps: Mapping[str, Sequence[Mapping[str, Any]]], cells: Sequence[SharedCell],
                 metric: str, path: Path) -> Path | None:
    """The curves of the shared cells of one pair of sweeps on one figure: a colour per cell,
    a line style per sweep (solid = the first, dashed = the second)."""
    if not cells:
        return None
    plt = _plt()
    cs = colors(len(cells))
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for i, c in enumerate(cells):
        for j, (name, trials) in enumerate(zip(c.sweeps, c.trials)):
            for k, tid in enumerate(trials):
                pts = sorted((r.get("step") or 0, r.get("tokens") or 0, r.get(metric))
                             for r in sweeps[name] if str(r.get("trial_id")) == tid
                             and _finite(r.get(metric)) is not None)
                ax.plot([p[1] for p in pts], [p[2] for p in pts], color=cs[i],
                        ls=["-", "--"][j], lw=1.4, alpha=0.9,
                        label=f"{name}: {c.labels[j]}" if k == 0 else None)
    ax.set_xlabel("tokens")
    ax.set_ylabel(metric)
    ax.set_title(f"shared cells of {cells[0].sweeps[0]} (solid) and {cells[0].sweeps[1]} "
                 "(dashed)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    return _save(fig, path)


def twoway_lines(name: str, rows: Sequence[Mapping[str, Any]], metric: str, out: Path,
                 stem: str, mode: str = "min") -> tuple[list[str], list[Path]]:
    """Markdown (joint tables with their one-line reading) and interaction plots for every
    pair of ``name``'s varied knobs; nothing when fewer than two knobs vary."""
    finals = ok_finals(rows)
    lines: list[str] = []
    pngs: list[Path] = []
    tied = folded_knobs(finals)
    for k, ks in tied.items():
        if ks:
            lines += [f"{', '.join(x[len(KNOB_PREFIX):] for x in ks)} follow(s) "
                      f"{k[len(KNOB_PREFIX):]} in every trial (an `expr` or tied knob): folded "
                      "into it, not a second factor.", ""]
    for a, b in knob_pairs(finals):
        jt = joint_table(finals, a, b, metric)
        sa, sb = a[len(KNOB_PREFIX):], b[len(KNOB_PREFIX):]
        if (n := empty_cells(jt)):
            lines += [f"**{sa} × {sb}**: not shown: {n} of {len(jt.a_values) * len(jt.b_values)}"
                      " cells hold no trial (the design does not cross these knobs).", ""]
            continue
        png = plot_interaction(jt, metric, out / f"{stem}_{sa}_x_{sb}.png".replace("/", "_"),
                               f"{name}: final {metric}, {sa} × {sb}")
        pngs.append(png)
        lines += [f"**{sa} × {sb}** (mean over seeds per cell; bold: the best of its row on "
                  "every seed, by the claims' paired rule)", "",
                  *markdown(jt, metric, mode), f"![{sa} x {sb}]({png.name})", ""]
    return lines, pngs

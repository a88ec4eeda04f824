"""Reading sweep results (and any CSV/Parquet table) for the fits and the reports.

Sweep results are read only through :mod:`sweeps.store.results`, the column schema's module: it
upgrades files written before schema 2 on read, so the columns here are always schema 2's (config
by YAML path, knobs as ``knob.<YAML path>``, router statistics as ``router.<stat>``). Nothing
here reads the sweep driver's private files (the parent cache); ``summary.json`` next to the
results is the driver's published compute ledger. A results path may be an object-storage URL
(``s3://bucket/results/sweep``, ``gs://...``): it is read through ``sweeps.store.storage``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from moe_core.errors import FitError
from scaling.laws import Law, Points, get_law
from sweeps.store import results as schema
from sweeps.store.storage import Location, is_url

_log = logging.getLogger("analysis")
DEFAULT_COLUMNS = {"D": "tokens", "N": "N1", "L": "val_loss"}
SUMMARY_FILE = "summary.json"
"""The sweep driver's compute ledger next to ``results.parquet``."""


def _results_frame(path: Path | Location):
    table = schema.read_table(path)
    if table is None:
        raise FitError(f"{path} holds no {schema.RESULTS_FILE} (run python -m sweeps.run first)")
    return table.to_pandas()


def is_sweep_dir(path: str | Path) -> bool:
    """A sweep's results directory (it holds ``results.parquet``)."""
    if is_url(path):
        return (Location.of(path) / schema.RESULTS_FILE).is_file()
    return (Path(path) / schema.RESULTS_FILE).is_file()


def sweep_dirs(root: str | Path) -> list[Path]:
    """The sweep results directories right below ``root``, sorted (URLs for a URL)."""
    if is_url(root):
        loc, tail = Location.of(root), "/" + schema.RESULTS_FILE
        return sorted(f"{loc.uri}/{f[:-len(tail)]}" for f in loc.files()
                      if f.count("/") == 1 and f.endswith(tail))
    return sorted(p.parent for p in Path(root).glob(f"*/{schema.RESULTS_FILE}"))


def _read_url(path: str):
    import pandas as pd

    loc = Location.of(path)
    if loc.is_file():
        return _results_frame(loc)
    dirs = [path] if is_sweep_dir(path) else sweep_dirs(path)
    if not dirs:
        raise FitError(f"{path} holds no {schema.RESULTS_FILE} (run python -m sweeps.run first)")
    return pd.concat([_results_frame(Location.of(d)) for d in dirs], ignore_index=True)


def read_table(path: str | Path):
    """A pandas DataFrame from a CSV, a Parquet file, or a results directory (its
    ``results.parquet``, or those of the sweep directories right below it)."""
    import pandas as pd

    if is_url(path):
        return _read_url(str(path))
    path = Path(path)
    if path.is_dir():
        dirs = [path] if is_sweep_dir(path) else sweep_dirs(path)
        if not dirs:
            raise FitError(f"{path} holds no {schema.RESULTS_FILE} "
                           "(run python -m sweeps.run first)")
        return pd.concat([_results_frame(d) for d in dirs], ignore_index=True)
    if not path.exists():
        raise FitError(f"{path} does not exist")
    if path.suffix == ".csv":
        return pd.read_csv(path)
    if path.suffix in (".parquet", ".pq"):
        return _results_frame(path)
    raise FitError(f"{path}: expected a .csv, a .parquet or a results directory")


def read_summary(path: str | Path) -> dict[str, Any] | None:
    """``summary.json`` next to a sweep's results (None when the sweep wrote none)."""
    if is_url(path):
        loc = Location.of(path)
        sp = (loc if not loc.is_file() else Location.of(loc.uri.rsplit("/", 1)[0])) / \
            SUMMARY_FILE
        return json.loads(sp.read_text()) if sp.exists() else None
    path = Path(path)
    sp = (path if path.is_dir() else path.parent) / SUMMARY_FILE
    return json.loads(sp.read_text()) if sp.exists() else None


def ok_trials(df, include_pruned: bool = False):
    """Rows of trials that finished ("ok"); of running ones only if none has finished yet. A
    trial a health rule pruned (status "pruned") stopped early for a reason: it is left out
    unless ``include_pruned``."""
    if "trial_id" not in df.columns or "status" not in df.columns:
        return df
    status = df["status"].astype(str)
    good = {"ok" if (status == "ok").any() else "running"}
    if include_pruned:
        good.add("pruned")
    return df[df["trial_id"].isin(set(df.loc[status.isin(good), "trial_id"]))]


def final_evals(df, include_pruned: bool = False):
    """The final evaluation (max step) of each successful trial (and of each pruned one with
    ``include_pruned``)."""
    df = ok_trials(df, include_pruned)
    if "trial_id" in df.columns and "step" in df.columns:
        df = df.sort_values("step", kind="stable").groupby("trial_id", as_index=False).tail(1)
    return df


def _filter(df, where: Mapping[str, Any] | None):
    for k, v in (where or {}).items():
        if k not in df.columns:
            raise FitError(f"--where {k}=…: no column {k!r}")
        df = df[df[k].astype(str) == str(v)]
    return df


def _variable(df, law: Law, var: str, col: str | None) -> np.ndarray:
    """The values of one law variable: the mapped column, the same-named one, the default
    column (D → tokens, N → N1), or sparsity P = N_total/N2 (000 §4.2)."""
    import pandas as pd

    if col is None:
        if var in df.columns:
            col = var
        elif var in DEFAULT_COLUMNS and DEFAULT_COLUMNS[var] in df.columns:
            col = DEFAULT_COLUMNS[var]
        elif var == "P" and {"N_total", "N2"} <= set(df.columns):
            return (pd.to_numeric(df["N_total"]) / pd.to_numeric(df["N2"])).to_numpy(float)
        else:
            raise FitError(f"law {law.name!r} needs variable {var!r} but the data has no "
                           f"such column; map one with --columns {var}=<column>")
    elif col not in df.columns:
        raise FitError(f"--columns {var}={col}: no column {col!r}; the data has "
                       f"{', '.join(map(str, df.columns[:20]))}")
    return pd.to_numeric(df[col], errors="coerce").to_numpy(float)


def _left_out(before, after) -> list[str]:
    """Trials the status filter left out, counted by status (said, never silent)."""
    if "trial_id" not in before.columns or "status" not in before.columns:
        return []
    gone = before[~before["trial_id"].isin(set(after["trial_id"]))]
    if gone.empty:
        return []
    last = gone.sort_values("step", kind="stable").groupby("trial_id").tail(1) \
        if "step" in gone.columns else gone.drop_duplicates("trial_id")
    counts = last["status"].astype(str).value_counts()
    return [f"{n} {st} trial(s)" for st, n in sorted(counts.items())]


def _refuse_infinite(values: Mapping[str, np.ndarray], law: Law, lcol: str) -> None:
    """An infinite variable or loss is not a measurement: refused, never silently dropped
    (one D2 = inf would otherwise set the range a decision extrapolates to)."""
    for var, v in values.items():
        n = int(np.isinf(v).sum())
        if n:
            name = lcol if var == "L" else var
            raise FitError(f"{n} row(s) have an infinite {name} (law {law.name}); an infinite "
                           "value is not a measurement: fix or remove those rows")


MIN_PARENT_CLUSTERS = 10
"""Fewest distinct parents for resampling by parent: fewer clusters than this give a cluster
bootstrap that mostly resamples the design (a D1 × D2 grid has one parent per D1)."""


def bootstrap_units(df) -> tuple[str, ...]:
    """Each row's bootstrap unit: its trial (a ``--curves`` trial's evals are resampled
    together), or its parent (``parent_key``) where trials share parents and there are at least
    ``MIN_PARENT_CLUSTERS`` of them; () when the data has no ``trial_id`` (each row a unit)."""
    if "trial_id" not in df.columns:
        return ()
    trials = df["trial_id"].astype(str)
    if "parent_key" in df.columns:
        keys = df["parent_key"].fillna("").astype(str)
        per = df.assign(_k=keys, _t=trials).groupby("_k")["_t"].nunique()
        per = per[per.index != ""]
        if len(per) >= MIN_PARENT_CLUSTERS and (per > 1).any():
            return tuple(np.where(keys != "", "parent:" + keys, "trial:" + trials))
    return tuple("trial:" + trials)


def load_points(data, law: Law | str, *, columns: Mapping[str, str] | None = None,
                curves: bool = False, where: Mapping[str, Any] | None = None,
                include_pruned: bool = False) -> Points:
    """Points for ``law`` from a path or a DataFrame.

    ``columns`` maps a law variable (or ``L``) to a column name; by default a variable uses the
    column of the same name, D → ``tokens``, N → ``N1``, L → ``val_loss`` (or ``loss``), and
    sparsity P = N_total/N2 (000 §4.2) is derived when absent. Sweep results are reduced to each
    trial's final eval unless ``curves`` (every eval; D2 is then the tokens seen at that eval).
    Rows with a missing, non-positive or non-finite value are dropped. Pruned trials (a health
    rule stopped them, ``sweeps.run.prune``) are left out unless ``include_pruned``. Each point
    carries its bootstrap unit (:func:`bootstrap_units`): intervals resample trials, never
    single evals.
    """
    import pandas as pd

    law = get_law(law) if isinstance(law, str) else law
    df = data if isinstance(data, pd.DataFrame) else read_table(data)
    df = _filter(df, where)
    before = df
    df = ok_trials(df, include_pruned) if curves else final_evals(df, include_pruned)
    left_out = _left_out(before, df)
    cmap = dict(columns or {})
    x = {var: _variable(df, law, var, cmap.get(var)) for var in law.variables}
    lcol = cmap.get("L") or ("val_loss" if "val_loss" in df.columns else "loss")
    if lcol not in df.columns:
        raise FitError(f"no loss column {lcol!r}; map it with --columns L=<column>")
    L = pd.to_numeric(df[lcol], errors="coerce").to_numpy(float)
    _refuse_infinite({**x, "L": L}, law, lcol)
    good = np.isfinite(L) & (L > 0)
    why = {f"no or non-positive {lcol}": int((~good).sum())}
    for var, v in x.items():
        bad = good & ~(np.isfinite(v) & (v > 0))
        why[f"no or non-positive {var}"] = int(bad.sum())
        good &= ~bad
    dropped = [f"{n} with {w}" for w, n in why.items() if n] + left_out
    if dropped:
        _log.warning("analysis: left out %s (law %s)", "; ".join(dropped), law.name)
    labels = tuple(df["trial_id"].astype(str)) if "trial_id" in df.columns else ()
    groups = bootstrap_units(df)
    idx = np.flatnonzero(good)
    if len(idx) == 0:
        raise FitError(f"no usable points for law {law.name!r} (need positive "
                       f"{', '.join(law.variables)} and L)")
    return Points(x, L, labels, groups).take(idx)

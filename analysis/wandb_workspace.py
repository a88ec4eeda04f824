"""``upcycle-sweeps wandb-workspace RESULTS [RESULTS ...]``: a W&B workspace over a sweep's runs,
built with ``wandb-workspaces`` (the ``wandb`` extra: ``pip install 'upcycle-sweeps[wandb]'``).

Its sections:

- **knobs → metric**: a parallel-coordinates panel over every knob (the run config's
  ``knob.<path>``) to the sweep's metric, W&B's parameter importance, and one panel per knob:
  the metric against the knob (a scatter for a number, a bar per value otherwise);
- **loss curves**: each trial's validation and training loss against the optimizer step, and
  the same grouped by sweep (the W&B group), one line per sweep;
- **per-layer health**: one panel per MoE health statistic, every layer's
  ``health/layer<i>/<stat>`` with the worst layer and all layers (``sweeps.store.wandb_keys``);
- **metrics**: every other metric column against the step.

The runs shown are the sweeps' groups. The definition (the view spec W&B stores, with its
entity, project and name) is written to ``wandb-workspace.json`` in the first results folder
(``--out`` elsewhere; a bucket URL works as a folder); it is saved to W&B only when
``WANDB_API_KEY`` is set, otherwise one line says where the definition is.
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from analysis.sweep import Sweep, load_sweep
from moe_core.errors import UpcycleError, cli_boundary
from sweeps.store.results import KNOB_PREFIX, is_static
from sweeps.store.storage import Location
from sweeps.store.wandb_keys import HEALTH, PROJECT, health_stats, metric_key

DEFINITION_FILE = "wandb-workspace.json"
OUTCOME_COLUMNS = frozenset({"status", "reason", "prune_rule", "prune_metric", "prune_value",
                             "prune_threshold", "prune_step", "step"})
"""Per-row columns that are no curve: the trial's outcome, and ``step`` (the x axis)."""
LOSSES = ("val_loss", "train_loss")


def _import_workspaces() -> tuple[Any, Any]:
    try:
        with warnings.catch_warnings():  # its pydantic-v1-style validators warn on import
            warnings.simplefilter("ignore", DeprecationWarning)
            import wandb_workspaces.reports.v2 as wr
            import wandb_workspaces.workspaces as ws
    except ImportError as e:
        raise UpcycleError("wandb-workspace needs the wandb extra: pip install "
                           "'upcycle-sweeps[wandb]' (the wandb-workspaces package)") from e
    return ws, wr


def knob_columns(sweeps: Sequence[Sweep]) -> list[str]:
    """Every ``knob.<path>`` column of the sweeps (the seed's too), in order."""
    cols = {c for s in sweeps for c in s.rows.columns if c.startswith(KNOB_PREFIX)}
    return sorted(cols)


def metric_columns(sweeps: Sequence[Sweep]) -> list[str]:
    """Every metric column of the sweeps: numeric, per eval (not configuration), with a value."""
    out = set()
    for s in sweeps:
        for c in s.rows.columns:
            col = s.rows[c]
            if (c not in OUTCOME_COLUMNS and not is_static(c) and col.notna().any()
                    and (col.dtype == bool or np.issubdtype(col.dtype, np.number))):
                out.add(c)
    return sorted(out)


def _numeric(sweeps: Sequence[Sweep], column: str) -> bool:
    vals = [v for s in sweeps if column in s.rows.columns for v in s.rows[column].dropna()]
    return bool(vals) and all(isinstance(v, (int, float, np.number)) and not
                              isinstance(v, (bool, np.bool_)) for v in vals)


def _knob_panels(wr: Any, sweeps: Sequence[Sweep], knobs: list[str], metric: str) -> list:
    summary = wr.SummaryMetric(metric)
    columns = [wr.ParallelCoordinatesPlotColumn(metric=wr.Config(k)) for k in knobs]
    panels: list[Any] = [
        wr.ParallelCoordinatesPlot(
            title=f"knobs → final {metric}",
            columns=[*columns, wr.ParallelCoordinatesPlotColumn(metric=summary)]),
        wr.ParameterImportancePlot(with_respect_to=metric)]
    for k in knobs:
        title = f"final {metric} by {k.removeprefix(KNOB_PREFIX)}"
        if _numeric(sweeps, k):
            panels.append(wr.ScatterPlot(title=title, x=wr.Config(k), y=summary))
        else:
            panels.append(wr.BarPlot(title=title, metrics=[summary], groupby=wr.Config(k),
                                     groupby_aggfunc="mean", groupby_rangefunc="minmax"))
    return panels


def _curve(wr: Any, keys: list[str], title: str, **kw: Any) -> Any:
    return wr.LinePlot(title=title, x="step", y=keys, **kw)


def _health_panels(wr: Any, keys: list[str]) -> list:
    """One panel per health statistic: each layer's curve, then the worst layer and all layers."""
    by_stat: dict[str, list[str]] = {}
    for k in keys:  # health/<layer<i>|worst|all>/<stat>
        by_stat.setdefault(k.rsplit("/", 1)[1], []).append(k)

    def order(k: str) -> tuple[int, int]:
        where = k.split("/")[1]
        return (0, int(where[5:])) if where.startswith("layer") else (1, where == "all")

    return [_curve(wr, sorted(v, key=order), f"{stat} per layer")
            for stat, v in sorted(by_stat.items())]


def workspace(sweeps: Sequence[Sweep], *, entity: str, project: str, metric: str,
              groups: Sequence[str], name: str | None = None) -> Any:
    """The ``wandb_workspaces`` Workspace of ``sweeps`` (whose W&B groups are ``groups``)."""
    ws, wr = _import_workspaces()
    knobs, metrics = knob_columns(sweeps), metric_columns(sweeps)
    stats = health_stats(metrics)
    health = [c for c in metrics if metric_key(c, stats).startswith(f"{HEALTH}/")]
    health_keys = [metric_key(c, stats) for c in health]
    losses = [c for c in LOSSES if c in metrics]
    others = [c for c in metrics if c not in health and c not in losses]
    by_sweep = wr.Metric("Group")
    sections = [
        ws.Section(name="knobs → metric", is_open=True,
                   panels=_knob_panels(wr, sweeps, knobs, metric)),
        ws.Section(name="loss curves", is_open=True, panels=[
            *(_curve(wr, [c], c) for c in losses),
            *(_curve(wr, [c], f"{c} by sweep", groupby=by_sweep, groupby_aggfunc="mean",
                     groupby_rangefunc="minmax") for c in losses)]),
        ws.Section(name="per-layer health", is_open=True, panels=_health_panels(wr, health_keys)),
        ws.Section(name="metrics", panels=[_curve(wr, [c], c) for c in others]),
    ]
    group_list = ", ".join(json.dumps(g) for g in groups)
    return ws.Workspace(
        entity=entity, project=project, name=name or f"sweep {' vs '.join(groups)}",
        sections=sections, settings=ws.WorkspaceSettings(x_axis="step"),
        runset_settings=ws.RunsetSettings(filters=f"Metric('Group') in [{group_list}]"))


def definition(view: Any) -> dict[str, Any]:
    """What W&B stores for the workspace ``view`` (``upsertView``'s variables: the spec as
    ``wandb_workspaces`` uploads it, parsed)."""
    model = view._to_model()  # the library's own serialisation, as Workspace.save sends it
    spec = model.spec.model_dump_json(by_alias=True, exclude_none=True)
    return {"entity": model.entity, "project": model.project,
            "display_name": model.display_name, "type": "project-view",
            "spec": json.loads(spec)}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="upcycle-sweeps wandb-workspace", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="results folders (results/<sweep>, s3://...)")
    ap.add_argument("--metric", default=None,
                    help="the metric of the knob panels (default: the sweep's, summary.json)")
    ap.add_argument("--project", default=PROJECT, help="W&B project of the runs (the spec's "
                    "logging.wandb.project)")
    ap.add_argument("--entity", default=os.environ.get("WANDB_ENTITY", ""),
                    help="W&B entity (default: WANDB_ENTITY, else the key's default entity)")
    ap.add_argument("--group", action="append", default=None,
                    help="W&B group of each results folder (default: the sweep's name)")
    ap.add_argument("--name", default=None, help="the workspace's name")
    ap.add_argument("--out", default=None,
                    help=f"the definition file (default: RESULTS/{DEFINITION_FILE})")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    return ap


def _check_out(out: Location) -> None:
    """``out`` is new, or a definition this command wrote (never any other file overwritten)."""
    if not out.exists():
        return
    try:
        ours = {"entity", "project", "spec"} <= set(json.loads(out.read_text()))
    except (ValueError, UnicodeDecodeError, TypeError):
        ours = False
    if not ours:
        raise UpcycleError(f"--out {out} exists and is not a workspace definition; give a new "
                           "file (or remove it)")


@cli_boundary()
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out = Location.of(args.out or Location.of(str(args.results[0]).rstrip("/")).join(
        DEFINITION_FILE))
    _check_out(out)
    sweeps = [load_sweep(p) for p in args.results]
    groups = args.group or [s.name for s in sweeps]
    if len(groups) != len(sweeps):
        raise UpcycleError(f"--group given {len(groups)} times for {len(sweeps)} results "
                           "folders; give it once per folder, or not at all")
    metric = args.metric or (sweeps[0].summary or {}).get("metric") or "val_loss"
    key = os.environ.get("WANDB_API_KEY")
    entity = args.entity
    if key and not entity:
        import wandb

        entity = wandb.Api().default_entity or ""
    view = workspace(sweeps, entity=entity, project=args.project, metric=metric,
                     groups=groups, name=args.name)
    out.write_text(json.dumps(definition(view), indent=1) + "\n")
    if key:
        view.save()
        print(f"workspace saved to W&B: {view.url}; its definition: {out}")
    else:
        print(f"workspace definition written to {out} (not saved: no WANDB_API_KEY; set it "
              "and rerun to save it to W&B)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

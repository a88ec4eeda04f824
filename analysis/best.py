"""python -m analysis.best RESULTS [--metric val_loss] [--mode min|max] [--export DIR]
                       [--overwrite] [--tokenizer DIR] [--no-verify] [--json]

The best finished trial of a sweep: its knobs, configuration, final metrics and the checkpoint
on disk; with ``--export DIR`` that checkpoint as a Hugging Face folder with the tokenizer the
run used (``moe_core.hf.export``), which ``transformers.AutoTokenizer`` and
``AutoModelForCausalLM`` load. Ties, diverged or failed trials and a missing checkpoint are
each said in one line. ``--export`` refuses a file, a symlink, the results folder, and a folder
that exists and is not empty unless ``--overwrite`` and the project wrote it (an earlier
export). No network.

Where checkpoints are: Tune keeps each trial's last reported checkpoint (``checkpoint.at_end``:
its final step) in ``RESULTS/tune/<trial folder>/checkpoint_<n>/``, the trial folder named
``<trial_id>_<knob>=<value>…`` (``sweeps.spec.naming``); a multi-rank trial's are in
``RESULTS/train/<sweep>-<trial_id>/checkpoint_<n>/`` and its ranks' local copy in
``RESULTS/train/rank_checkpoints/<trial_id>/step_<n>/``; ``export: hf`` writes
``RESULTS/export/<trial_id>/``.

RESULTS and ``--export`` may each be a folder or a URL (``s3://BUCKET/PATH``, ``gs://…``;
``moe_core.location``): a checkpoint in a bucket is downloaded through the signed view
(``sweeps.store.signing``: every file verified) into a temporary folder, and an export to a
bucket is written locally, then uploaded with its manifest last.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moe_core.errors import UpcycleError, cli_boundary, shown
from moe_core.fsio import load_json
from moe_core.location import is_url
from moe_core.outdir import guard_output
from sweeps.store.results import (
    CONFIG_SECTIONS,
    KNOB_PREFIX,
    RESULTS_FILE,
    final_rows,
    format_knob,
    read_rows,
)
from sweeps.store.storage import Location

METRIC_COLUMNS = ("val_loss", "train_loss", "aux_loss", "tokens", "step", "wall_s", "flops")


@dataclass(frozen=True)
class Pick:
    """The best trial's final row, the other trials tied with it, and the trials left out
    (status → trial ids)."""

    row: dict[str, Any]
    metric: str
    ties: tuple[str, ...] = ()
    left_out: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def _value(r: Mapping[str, Any], metric: str) -> float | None:
    v = r.get(metric)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(float(v)) else None


def best_trial(rows: Sequence[Mapping[str, Any]], metric: str = "val_loss",
               mode: str = "min") -> Pick:
    """The trial whose final row has the best ``metric`` among finished (``ok``) trials; ties
    (equal to the last digit) go to the smallest trial id. Raises ``UpcycleError`` when no
    finished trial has the metric."""
    finals = final_rows(rows)
    left: dict[str, list[str]] = {}
    ok = []
    for r in finals:
        status = str(r.get("status") or "unknown")
        if status != "ok":
            left.setdefault(status, []).append(str(r["trial_id"]))
        elif _value(r, metric) is None:
            left.setdefault(f"no {metric}", []).append(str(r["trial_id"]))
        else:
            ok.append(r)
    if not ok:
        counts = ", ".join(f"{len(v)} {k}" for k, v in left.items()) or "no trials"
        raise UpcycleError(f"no finished trial has a finite {metric} ({counts}); nothing to pick")
    sign = 1.0 if mode == "min" else -1.0
    ok.sort(key=lambda r: (sign * _value(r, metric), str(r["trial_id"])))
    top = _value(ok[0], metric)
    ties = tuple(str(r["trial_id"]) for r in ok[1:] if _value(r, metric) == top)
    return Pick(dict(ok[0]), metric, ties, {k: tuple(v) for k, v in left.items()})


def _trial_of(folder: Path) -> str | None:
    """The trial id a Tune trial folder belongs to (first row of its ``result.json``)."""
    f = folder / "result.json"
    try:
        with open(f) as fh:
            return str(json.loads(fh.readline()).get("trial_id"))
    except (OSError, ValueError, AttributeError):
        return None


def _step(ck: Path) -> int:
    """A checkpoint's step from its ``meta.json`` (bounded read); -1 when it is damaged."""
    try:
        meta = load_json(ck / "meta.json", 1 << 20, "checkpoint meta")
        step = meta.get("step", -1) if isinstance(meta, dict) else -1
        return int(step) if isinstance(step, int) and not isinstance(step, bool) else -1
    except UpcycleError:
        return -1


def _sweep_metric(loc: Location) -> str:
    """The metric the sweep ranked by, from ``summary.json`` (refused in one line when it is
    damaged), else ``val_loss``."""
    if not loc.is_local:
        summary = Location.of(loc.uri) / "summary.json"  # not signed: read as written
        return (json.loads(summary.read_text()).get("metric") if summary.is_file()
                else None) or "val_loss"
    summary = loc.local_path / "summary.json"
    if not summary.exists() and not summary.is_symlink():
        return "val_loss"
    s = load_json(summary, 16 << 20, "summary")  # a regular file: a named pipe never hangs
    if not isinstance(s, dict):
        raise UpcycleError(f"{summary} is not a JSON object (damaged); give --metric")
    metric = s.get("metric")
    if metric is not None and not isinstance(metric, str):
        raise UpcycleError(f"{summary}: metric={shown(metric)} is not a column name; give "
                           "--metric")
    return metric or "val_loss"


def trial_checkpoints(results_dir: Path, trial_id: str, sweep: str | None = None) -> list[Path]:
    """Every checkpoint folder (one with ``meta.json``) of ``trial_id`` under ``results_dir``,
    the latest step last: Tune's copies, a multi-rank trial's Ray Train copies and its ranks'
    local ``step_…`` folders."""
    found: list[Path] = []
    tune = results_dir / "tune"
    if tune.is_dir():
        for d in sorted(tune.iterdir()):
            if d.is_dir() and (d.name.startswith(f"{trial_id}_") or _trial_of(d) == trial_id):
                found += d.glob("checkpoint_*")
    train = results_dir / "train"
    if sweep is not None:
        found += (train / f"{sweep}-{trial_id}").glob("checkpoint_*")
    found += (train / "rank_checkpoints" / trial_id).glob("step_*")
    found = [p for p in set(found) if (p / "meta.json").is_file()]
    return sorted(found, key=lambda p: (_step(p), str(p)))


def check_export_dir(out: str | Path, overwrite: bool, results: Path | None = None
                     ) -> str | None:
    """Refuse a file, a symlink, a non-empty folder (unless ``overwrite`` and this project wrote
    it: ``moe_core.outdir.guard_output``) and the results folder or one inside it; returns the
    line to print when an export of ours is replaced. ``out`` may be a URL."""
    return guard_output(out, sources=(results,) if results else (), overwrite=overwrite)


def _results_dir(path: str) -> tuple[Location, list[dict[str, Any]]]:
    """The sweep's folder (a local one, or a bucket's through the signed view) and its rows."""
    loc = Location.of(path)
    if loc.name == RESULTS_FILE and not loc.is_dir():
        loc = Location.of(str(Path(loc.path).parent) if loc.is_local
                          else loc.uri.rsplit("/", 1)[0])
    f = loc / RESULTS_FILE
    if not f.is_file():
        raise UpcycleError(f"{path}: no {RESULTS_FILE} (run python -m sweeps.run first, or give "
                           "results/<sweep>)")
    rows = read_rows(f)
    if not rows:
        raise UpcycleError(f"{f} has no rows")
    return loc if loc.is_local else loc.signed(), rows


def remote_checkpoints(d: Location, trial_id: str, sweep: str | None = None
                       ) -> list[tuple[int, str]]:
    """``trial_checkpoints`` for a sweep in a bucket: (step, URL) of each checkpoint folder of
    ``trial_id``, the latest step last."""
    found = []
    for sub in ("tune", "train"):
        for rel in (d / sub).files():
            if not rel.endswith("/meta.json"):
                continue
            parts = rel.split("/")[:-1]
            if sub == "tune":
                ok = len(parts) == 2 and parts[1].startswith("checkpoint_") and (
                    parts[0].startswith(f"{trial_id}_") or parts[0] == trial_id)
            else:
                ok = (len(parts) == 2 and parts[0] == f"{sweep}-{trial_id}"
                      and parts[1].startswith("checkpoint_")) or (
                    parts[:2] == ["rank_checkpoints", trial_id] and len(parts) == 3)
            if ok:
                ck = d / sub / "/".join(parts)
                try:
                    step = int(json.loads((ck / "meta.json").read_text()).get("step", -1))
                except ValueError:
                    step = -1
                found.append((step, ck.uri))
    return sorted(found)


def _checkpoints(d: Location, tid: str, sweep: str | None) -> list[tuple[int, str]]:
    if d.is_local:
        return [(_step(p), str(p)) for p in trial_checkpoints(d.local_path, tid, sweep)]
    return remote_checkpoints(d, tid, sweep)


def _export(d: Location, info: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Export the picked checkpoint (downloaded, every file verified, when in a bucket)."""
    from moe_core.hf.export import export_checkpoint  # torch: only to export

    if d.is_local:
        return export_checkpoint(info["checkpoint"], args.export, tokenizer=args.tokenizer,
                                 verify=not args.no_verify)
    with tempfile.TemporaryDirectory(prefix="upcycle-best-") as tmp:
        Location.of(info["checkpoint"]).signed().download_dir(tmp)
        res = export_checkpoint(tmp, args.export, tokenizer=args.tokenizer,
                                verify=not args.no_verify)
    res["checkpoint"] = info["checkpoint"]
    return res


def describe(pick: Pick, d: Location, checkpoints: list[tuple[int, str]]) -> dict[str, Any]:
    """The facts ``main`` prints (and ``--json`` gives)."""
    r = pick.row
    tid = str(r["trial_id"])
    knobs = {k[len(KNOB_PREFIX):]: format_knob(v) for k, v in r.items()
             if k.startswith(KNOB_PREFIX) and v is not None}
    config = {k: v for k, v in sorted(r.items()) if k.split(".")[0] in CONFIG_SECTIONS
              and v is not None}
    metrics = {k: r[k] for k in (*METRIC_COLUMNS, *sorted(k for k in r if k.startswith(
        "router."))) if r.get(k) is not None and not (isinstance(r[k], float)
                                                       and math.isnan(r[k]))}
    exported = d / "export" / tid
    return {"sweep": r.get("sweep"), "trial_id": tid, "metric": pick.metric,
            "value": r.get(pick.metric), "knobs": knobs, "config": config,
            "metrics": metrics, "ties": list(pick.ties),
            "left_out": {k: list(v) for k, v in pick.left_out.items()},
            "checkpoint": checkpoints[-1][1] if checkpoints else None,
            "checkpoint_step": checkpoints[-1][0] if checkpoints else None,
            "final_step": r.get("step"),
            "hf_export": str(exported) if (exported / "config.json").is_file() else None}


def _print(info: dict[str, Any]) -> None:
    knobs = ", ".join(f"{k}={v}" for k, v in info["knobs"].items()) or "no knobs"
    print(f"best trial {info['trial_id']} of {info['sweep']} ({knobs}): "
          f"{info['metric']}={info['value']:.6g} at step {info['final_step']}")
    if info["ties"]:
        print(f"tie: {len(info['ties'])} other trial(s) reached the same {info['metric']} "
              f"({', '.join(info['ties'])}); took the smallest trial id")
    for status, ids in info["left_out"].items():
        print(f"left out: {len(ids)} {status} trial(s) ({', '.join(ids[:5])}"
              f"{', …' if len(ids) > 5 else ''})")
    print("metrics: " + ", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                                  for k, v in info["metrics"].items()))
    print("config:")
    for k, v in info["config"].items():
        print(f"  {k}: {v}")
    ck = info["checkpoint"]
    if ck is None:
        print("checkpoint: none on disk for this trial (the spec's checkpoint.at_end was false, "
              "or the results folder was moved without tune/); nothing to export")
    else:
        late = "" if info["checkpoint_step"] == info["final_step"] else \
            f" (not the final step {info['final_step']})"
        print(f"checkpoint: {ck} (step {info['checkpoint_step']}){late}")
    if info["hf_export"]:
        print(f"hf export (export: hf): {info['hf_export']}")


@cli_boundary(kept="the results are unchanged")
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.best", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="a sweep's results folder (results/<sweep>) or its URL "
                                    "(s3://BUCKET/PATH/<sweep>, gs://…)")
    ap.add_argument("--metric", default=None,
                    help="final-row column to rank by (default: the sweep's, from summary.json, "
                         "else val_loss)")
    ap.add_argument("--mode", choices=("min", "max"), default="min")
    ap.add_argument("--export", default=None, metavar="DIR|URL",
                    help="write the best checkpoint here as a Hugging Face folder (with its "
                         "tokenizer), a local folder or s3://…, gs://…")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace a non-empty --export folder")
    ap.add_argument("--tokenizer", default=None, metavar="DIR",
                    help="ship this tokenizer instead of the one the run used")
    ap.add_argument("--no-verify", action="store_true",
                    help="skip comparing transformers' logits with ours")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    args = ap.parse_args(argv)
    d, rows = _results_dir(args.results)
    metric = args.metric if args.metric is not None else _sweep_metric(d)
    if args.export is not None:
        replacing = check_export_dir(args.export if is_url(args.export) else Path(args.export),
                                     args.overwrite, d.local_path if d.is_local else None)
        if replacing:
            print(replacing)
    pick = best_trial(rows, metric, args.mode)
    tid = str(pick.row["trial_id"])
    info = describe(pick, d, _checkpoints(d, tid, pick.row.get("sweep")))
    if args.export is not None:
        if info["checkpoint"] is None:
            raise UpcycleError(f"trial {tid} has no checkpoint on disk under {d}; nothing to "
                               "export (set checkpoint.at_end: true and rerun it)")
        info["exported"] = _export(d, info, args)
    if args.json:
        print(json.dumps(info, default=str))
        return 0
    _print(info)
    ex = info.get("exported")
    if ex:
        err = ex.get("transformers_vs_ours")
        print(f"exported {ex['architecture']} to {ex['out']} with tokenizer: {ex['tokenizer']}"
              + ("" if err is None else f"; transformers vs ours max |Δlogits|/max|logits| "
                                        f"{err:.2e}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""python -m sweeps.run.verify RESULTS [--trials K] [--seed S] [--rtol R] [--threads N] [--json]

Re-train K finished trials of a sweep (sampled with ``--seed``) from what the results record,
in this process and without Ray, and compare every eval's ``val_loss`` with the recorded curve.
Each trial's config is rebuilt from its row's config columns (and checked against them, column
by column), its parent taken from the sweep's parent cache (``RESULTS/parents``, or
``--parent-cache``; trained again by the same rule when absent). Per trial it says
``bit-exact`` or the largest relative difference and its step.

Bit for bit is the promise only where nothing differs: when this process's provenance
(``sweeps.store.provenance``: code commit and dirty tree, library versions, device) differs from the
recorded one, verify names what differs and judges each trial within ``--rtol`` instead
(default :data:`RTOL`). Exit status 0 when every trial is reproduced, 1 when one is not, 2 for
an input it cannot verify (one line). Trials it does not re-train, said in one line each: WSD
branches (``branch_from_step``: their stable run is shared) and multi-rank trials.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from moe_core.errors import UpcycleError, cli_boundary
from moe_core.train import Trainer
from moe_core.train.callbacks import FunctionCallback
from moe_core.train.config import TrainConfig, train_config_from_dict
from sweeps.run.parents import get_parent
from sweeps.spec.space import set_dotted
from sweeps.store.provenance import describe, differences, provenance
from sweeps.store.results import (
    CONFIG_SECTIONS,
    config_columns,
    decode_value,
    encode_value,
    final_rows,
    read_provenance,
    read_rows,
)

RTOL = 1e-2
"""Relative tolerance on each eval's val_loss when code, versions or device differ from the
record: the demo's final losses on two CPU kinds differ by up to 0.5 % (docs/getting-started.md
"Numbers on another CPU"); training amplifies a rounding difference, it does not stay at 1e-16."""


@dataclass
class Verdict:
    trial_id: str
    evals: int = 0
    max_rel: float = 0.0
    step: int | None = None
    recorded: float | None = None
    now: float | None = None
    skipped: str | None = None
    missing: list[int] = field(default_factory=list)

    def line(self, rtol: float | None) -> str:
        if self.skipped:
            return f"{self.trial_id}: not re-trained ({self.skipped})"
        if self.missing:
            return f"{self.trial_id}: the rerun has no eval at step(s) {self.missing[:5]}"
        if self.max_rel == 0.0:
            return f"{self.trial_id}: bit-exact ({self.evals} evals)"
        judged = "" if rtol is None else \
            f"; {'within' if self.max_rel <= rtol else 'beyond'} rtol {rtol:g}"
        return (f"{self.trial_id}: differs, max relative {self.max_rel:.3g} at step {self.step} "
                f"(recorded {self.recorded!r}, now {self.now!r}){judged}")

    def ok(self, rtol: float | None) -> bool:
        return bool(self.skipped) or (not self.missing and self.max_rel <= (rtol or 0.0))


def trial_config(row: Mapping[str, Any]) -> TrainConfig:
    """The TrainConfig a trial ran, from its row's config columns; every config column it
    yields must equal the recorded one (else an UpcycleError naming the column)."""
    d: dict[str, Any] = {"name": str(row["trial_id"]), "seed": int(row["seed"]),
                         "tokens": int(row["tokens_budget"])}
    null = {s for s in CONFIG_SECTIONS if s in row and row[s] is None}
    for k in sorted(row, key=lambda k: k.count(".")):
        sec = k.split(".", 1)[0]
        if sec not in CONFIG_SECTIONS or sec in null or "." not in k or row[k] is None:
            continue
        set_dotted(d, k, decode_value(row[k]))
    for s in null:
        d[s] = None
    cfg = train_config_from_dict(d)
    for k, v in config_columns(cfg.to_dict()).items():
        rec = row.get(k)
        if rec is not None and decode_value(rec) != decode_value(encode_value(v)):
            raise UpcycleError(f"trial {row['trial_id']}: config column {k} is {rec!r} in the "
                               f"results but rebuilds as {v!r}; verify cannot re-run it")
    return cfg


def retrain(row: Mapping[str, Any], cache_dir: str) -> dict[int, float]:
    """{step: val_loss} of the trial of ``row`` trained again in this process."""
    cfg = trial_config(row)
    parent = get_parent(cfg, row.get("parent_key") or None, {}, cache_dir)
    curve: dict[int, float] = {}
    cb = FunctionCallback(on_eval=lambda m: curve.__setitem__(int(m["step"]), m["val_loss"]))
    Trainer(cfg, parent=parent, callbacks=(cb,)).fit()
    return curve


def compare(trial_id: str, recorded: Mapping[int, float], now: Mapping[int, float]) -> Verdict:
    v = Verdict(trial_id, evals=len(recorded))
    v.missing = sorted(s for s in recorded if s not in now)
    for s in sorted(recorded.keys() & now.keys()):
        a, b = recorded[s], now[s]
        rel = 0.0 if a == b else abs(a - b) / max(abs(a), abs(b), 1e-300) \
            if math.isfinite(a) and math.isfinite(b) else math.inf
        if rel > v.max_rel:
            v.max_rel, v.step, v.recorded, v.now = rel, s, a, b
    return v


def _skip_reason(final: Mapping[str, Any]) -> str | None:
    if final.get("branch_from_step") is not None:
        return "a WSD branch of a shared stable run"
    if int(final.get("ranks") or 1) > 1:
        return f"a {final['ranks']}-rank trial"
    return None


def verify(results: str | Path, trials: int = 2, seed: int = 0, rtol: float = RTOL,
           parent_cache: str | None = None, now: Mapping[str, Any] | None = None
           ) -> dict[str, Any]:
    """Re-train ``trials`` sampled finished trials and compare (see the module docstring)."""
    results = Path(results)
    rows = read_rows(results)
    ok = {r["trial_id"]: r for r in final_rows(rows) if r.get("status") == "ok"}
    if not ok:
        raise UpcycleError(f"{results}: no finished trial to verify")
    summary = results / "summary.json"
    recorded = (json.loads(summary.read_text()).get("provenance") if summary.exists()
                else None) or read_provenance(results)
    now = dict(now or provenance())
    diff = differences(recorded, now)
    tol = rtol if diff else None
    picked = random.Random(seed).sample(sorted(ok), min(trials, len(ok)))
    cache = parent_cache or str((results / "parents").resolve())
    verdicts = []
    for t in picked:
        why = _skip_reason(ok[t])
        if why:
            verdicts.append(Verdict(t, skipped=why))
            continue
        curve = {int(r["step"]): float(r["val_loss"]) for r in rows
                 if r["trial_id"] == t and r.get("val_loss") is not None}
        verdicts.append(compare(t, curve, retrain(ok[t], cache)))
    return {"recorded": recorded, "now": now, "differences": diff, "rtol": tol,
            "verdicts": verdicts, "ok": all(v.ok(tol) for v in verdicts)}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sweeps.run.verify", description=__doc__.split(
        "\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="a sweep's results folder (holding results.parquet)")
    ap.add_argument("--trials", type=int, default=2, help="how many trials to re-train (2)")
    ap.add_argument("--seed", type=int, default=0, help="the sample's seed (0)")
    ap.add_argument("--rtol", type=float, default=RTOL,
                    help=f"relative tolerance when provenance differs ({RTOL:g})")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads, as the trial had (resources.cpus; default 1)")
    ap.add_argument("--parent-cache", help="the sweep's storage.parent_cache, if it set one")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    return ap


@cli_boundary()
def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.trials < 1 or args.threads < 1 or not (args.rtol >= 0 and math.isfinite(args.rtol)):
        raise UpcycleError("--trials and --threads must be >= 1 and --rtol a finite value >= 0")
    if not (Path(args.results) / "results.parquet").exists():
        raise UpcycleError(f"{args.results} holds no results.parquet (a sweep's results folder)")
    torch.set_num_threads(args.threads)
    out = verify(args.results, args.trials, args.seed, args.rtol, args.parent_cache)
    if args.json:
        print(json.dumps({**out, "verdicts": [vars(v) for v in out["verdicts"]]}))
    else:
        print(f"recorded: {describe(out['recorded'])}")
        print(f"now:      {describe(out['now'])}")
        print("same code, versions and device: expecting bit-exact" if not out["differences"]
              else f"differs from the record ({'; '.join(out['differences'])}): judged within "
                   f"rtol {out['rtol']:g}")
        for v in out["verdicts"]:
            print(v.line(out["rtol"]))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

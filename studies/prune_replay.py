"""Replay recorded sweeps through ASHA: raw loss vs predicted post-decay loss, with and without
health rules; and the predictors' error and ranking agreement on the same real curves.

    python studies/prune_replay.py [RESULTS ...] [--replays 400] [--seed 0] [--method multi_power]

RESULTS default to ``results/upcycle_lr results/scaling_d1_d2``, which these two commands write
(about 3 and 4 minutes on 2 CPU cores):

    make demo            # python -m sweeps.run search_spaces/upcycle_lr.yaml
    python -m sweeps.run search_spaces/scaling_d1_d2.yaml

A missing RESULTS folder is one line naming the command that makes it (exit 2).

1. **Validation.** For every trial and every eval of its WSD stable phase (a *rung*: eval
   index 1, 2, ...), each predictor (``scaling.predict``: ``branch_gain``, ``multi_power``,
   ``ratio``) predicts the loss at the trial's last step after its decay; the raw loss is the
   baseline. Reported per sweep and rung: mean absolute error against the actual final loss, and
   the Spearman correlation with it across the trials of a comparable set (same token budget).
   Calibration is fitted on the *other* sweep (cross), or on the same sweep without the
   held-out trial's group (LOGO: trials sharing its parent and LR policy, i.e. its stable run
   or its other seeds).
2. **Replay.** Each comparable set whose trials report more evals than the grace period (the
   others end before ASHA's first rung) is replayed through Ray Tune's own ASHA
   (``ray.tune.schedulers.AsyncHyperBandScheduler``, one bracket, grace period 2, reduction
   factor 3, as ``scheduler: asha`` defaults, fed through its public trial hooks): trials start
   in a random order, 2 at a time, each advancing eval by eval in token time; at each eval the
   scheduler sees the raw ``val_loss`` or ``predicted_final`` (cross calibration), and optionally
   the health stopper (``sweeps.run.health.HealthStopper`` with ``HEALTH`` below) first. Resampling:
   every replay draws a random order and a random subset of at least 3 of the set's trials;
   ``--replays`` replays per set and arm, the same draws for every arm. Reported: the share of
   replays in which the true best trial of the drawn subset (lowest final loss) runs to its end,
   the tokens saved (1 − tokens trained / tokens of every trial run to its end), and the regret
   (final loss of the best trial that finished minus the true best).

Ends with one JSON line (``best_survival_raw``, ``best_survival_predicted``,
``best_survival_health``, ``tokens_saved_predicted``, ...).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from ray.tune.schedulers import AsyncHyperBandScheduler, TrialScheduler
from scipy.stats import spearmanr

from scaling.predict import METHODS, Calibration, Curve, calibrate, predict_final
from sweeps.run.curves import curves_from_rows
from sweeps.run.health import HealthStopper
from sweeps.run.prune import parse_prune
from sweeps.store.results import read_rows

DEFAULT = ["results/upcycle_lr", "results/scaling_d1_d2"]
MAKES = {"upcycle_lr": "make demo", "scaling_d1_d2":
         "python -m sweeps.run search_spaces/scaling_d1_d2.yaml"}
HEALTH = {
    "max_load_fraction": {"above": 0.5, "for_evals": 3},
    "dead_experts": {"above": 0},
    # upcycled copies still ~identical after 150k tokens (about half of these runs' budgets)
    "expert_similarity": {"above": 0.99, "after_tokens": 150_000},
    "transition_jump": {"above": 0.05},
    "drop_rate": {"above": 0.1},
}
GRACE, RF, CONCURRENCY = 2, 3.0, 2
"""ASHA's grace period and reduction factor (``scheduler: asha`` defaults; ``--grace``,
``--rf``) and the trials running at once."""


def _refuse(msg: str) -> None:
    """One line on stderr, exit 2 (the project's input-error code)."""
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


class Sweep:
    """One recorded sweep: rows, curves and comparable sets (trials with the same budget)."""

    def __init__(self, path: str):
        self.path = path
        self.rows = [r for r in read_rows(path) if r.get("status") == "ok"]
        if not self.rows:
            _refuse(f"{path}: no finished trial")
        self.name = str(self.rows[0]["sweep"])
        self.curves = {t: c for t, c in curves_from_rows(self.rows).items()
                       if c.final_loss is not None}
        self.by_trial: dict[str, list[dict[str, Any]]] = {}
        for r in sorted(self.rows, key=lambda r: r["step"]):
            self.by_trial.setdefault(str(r["trial_id"]), []).append(r)
        self.group = {t: (rs[0].get("parent_key"), str(rs[0].get("knob.upcycle.lr_policy")))
                      for t, rs in self.by_trial.items()}
        sets: dict[int, list[str]] = {}
        for t in self.curves:
            sets.setdefault(int(self.by_trial[t][0]["tokens_budget"]), []).append(t)
        self.sets = {b: sorted(ts) for b, ts in sorted(sets.items()) if len(ts) >= 3}
        """Comparable sets (budget → trials) of at least 3 trials: Spearman's sets."""

    def replay_sets(self, grace: int) -> dict[int, list[str]]:
        """The sets whose trials report more evals than ASHA's grace period: replayed."""
        return {b: ts for b, ts in self.sets.items()
                if min(len(self.curves[t].steps) for t in ts) > grace}


def calibrations(sweeps: Sequence[Sweep]) -> dict[str, dict[str, Calibration]]:
    """Per sweep: 'cross' (fitted on every other sweep) and 'logo:<trial>' (same sweep, the
    trial's group left out)."""
    out: dict[str, dict[str, Calibration]] = {}
    for s in sweeps:
        others = [c for o in sweeps if o is not s for c in o.curves.values()]
        cals = {"cross": calibrate(others or list(s.curves.values()))}
        for g in set(s.group.values()):
            rest = [c for t, c in s.curves.items() if s.group[t] != g]
            cal = calibrate(rest)
            for t in s.curves:
                if s.group[t] == g:
                    cals[f"logo:{t}"] = cal
        out[s.name] = cals
    return out


def stable_rungs(c: Curve) -> list[int]:
    """Eval indices (0-based) of the stable phase, the last step excluded."""
    return [i for i, s in enumerate(c.steps) if s <= c.decay_start and s < c.total]


def validation(sweeps: Sequence[Sweep], cals: Mapping[str, Mapping[str, Calibration]]
               ) -> list[dict[str, Any]]:
    """Rows of the per-rung table: sweep, rung, n trials, MAE and Spearman of raw and of each
    predictor under each calibration."""
    table = []
    for s in sweeps:
        rungs = sorted({i for c in s.curves.values() for i in stable_rungs(c)})
        for i in rungs:
            row: dict[str, Any] = {"sweep": s.name, "rung": i + 1}
            preds: dict[str, dict[str, float]] = {"raw": {}}
            for t, c in s.curves.items():
                if i not in stable_rungs(c):
                    continue
                seen = c.upto(c.steps[i])
                preds["raw"][t] = seen.losses[-1]
                for m in METHODS:
                    for mode in ("cross", "logo"):
                        cal = cals[s.name]["cross" if mode == "cross" else f"logo:{t}"]
                        preds.setdefault(f"{m}/{mode}", {})[t] = predict_final(seen, cal, m)
            row["n"] = len(preds["raw"])
            for k, p in preds.items():
                err = [abs(v - s.curves[t].final_loss) for t, v in p.items()]
                row[f"mae:{k}"] = float(np.mean(err))
                rhos = []
                for ts in s.sets.values():
                    ts = [t for t in ts if t in p]
                    if len(ts) >= 3 and np.ptp([p[t] for t in ts]) > 0:
                        rhos.append(spearmanr([p[t] for t in ts],
                                              [s.curves[t].final_loss for t in ts])[0])
                row[f"rho:{k}"] = float(np.mean(rhos)) if rhos else math.nan
            table.append(row)
    return table


class _T:
    """What ASHA's trial hooks read of a trial: its id."""

    def __init__(self, trial_id: str):
        self.trial_id = trial_id


def asha(grace: int, max_t: int, rf: float) -> AsyncHyperBandScheduler:
    """Ray Tune's ASHA as ``scheduler: asha`` builds it, with one bracket: the metric is the
    eval's loss (``mode=min``), time the eval index; no forced stop at ``max_t``."""
    return AsyncHyperBandScheduler(time_attr="rung", metric="loss", mode="min",
                                   grace_period=grace, max_t=max_t, reduction_factor=rf,
                                   brackets=1, stop_last_trials=False)


def replay_once(s: Sweep, trials: Sequence[str], metric: str, cal: Calibration | None,
                method: str, health: bool, grace: int = GRACE, rf: float = RF
                ) -> tuple[set[str], int, int]:
    """One asynchronous ASHA replay of ``trials`` (in this start order): (trials that ran to
    their end, tokens trained, tokens of every trial run to its end)."""
    max_t = max(len(s.curves[t].steps) for t in trials)
    sched = asha(grace, max_t, rf)
    for t in trials:
        sched.on_trial_add(None, _T(t))
    stopper = HealthStopper(parse_prune(HEALTH)) if health else None
    queue, running, clock, finished, spent = list(trials), {}, 0.0, set(), 0
    full = sum(s.curves[t].steps[-1] * s.curves[t].tokens_per_step for t in trials)

    def start(now: float) -> None:
        while queue and len(running) < CONCURRENCY:
            running[queue.pop(0)] = (now, 0)  # (start time, index of the next eval)

    start(0.0)
    while running:
        def due(t: str) -> float:
            t0, i = running[t]
            c = s.curves[t]
            return t0 + c.steps[i] * c.tokens_per_step
        t = min(running, key=lambda x: (due(x), x))
        clock, (t0, i) = due(t), running[t]
        c, row = s.curves[t], s.by_trial[t][i]
        stop = stopper is not None and stopper(t, row)
        if not stop:
            value = c.losses[i] if metric == "raw" else predict_final(c.upto(c.steps[i]), cal,
                                                                       method)
            stop = sched.on_trial_result(None, _T(t), {"rung": i + 1, "loss": value}) \
                == TrialScheduler.STOP
        last = i + 1 == len(c.steps)
        if stop or last:
            spent += c.steps[i] * c.tokens_per_step
            if last and not (stopper is not None and stopper.verdict(t)):
                finished.add(t)  # ASHA's STOP at the last eval ends nothing early
            del running[t]
            start(clock)
        else:
            running[t] = (t0, i + 1)
    return finished, spent, full


def replays(sweeps: Sequence[Sweep], cals, n: int, seed: int, method: str,
            grace: int = GRACE, rf: float = RF) -> dict[str, dict[str, dict[str, float]]]:
    """Every arm over the same resampled (subset, order) draws of every comparable set:
    {scope ("all" or a sweep): {arm: {survive, saved, regret, replays}}}. Arms: raw, the
    predicted arm of every method (``predicted:<method>``), ``predicted`` (= ``method``) with
    the health rules (``health``), and raw with the health rules."""
    arms = {"raw": ("raw", method, False), "health": ("predicted", method, True),
            "raw+health": ("raw", method, True)}
    arms |= {f"predicted:{m}": ("predicted", m, False) for m in METHODS}
    rng = random.Random(seed)
    acc: dict[str, dict[str, dict[str, list]]] = {}
    for s in sweeps:
        cal = cals[s.name]["cross"]
        for ts in s.replay_sets(grace).values():
            for _ in range(n):
                k = rng.randint(3, len(ts))
                draw = rng.sample(ts, k)
                best = min(draw, key=lambda t: s.curves[t].final_loss)
                for a, (metric, m, health) in arms.items():
                    done, spent, full = replay_once(s, draw, metric, cal, m, health, grace, rf)
                    got = min((s.curves[t].final_loss for t in done), default=math.nan)
                    for scope in ("all", s.name):
                        d = acc.setdefault(scope, {}).setdefault(
                            a, {"survive": [], "saved": [], "regret": []})
                        d["survive"].append(best in done)
                        d["saved"].append(1 - spent / full)
                        d["regret"].append(got - s.curves[best].final_loss)
    return {scope: {a: {k: float(np.nanmean(v)) for k, v in d.items()}
                    | {"replays": len(d["survive"])} for a, d in arms_.items()}
            for scope, arms_ in acc.items()}


def _fmt(v: float) -> str:
    return "   nan" if not math.isfinite(v) else f"{v:6.3f}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="*", default=DEFAULT)
    ap.add_argument("--replays", type=int, default=400, help="replays per comparable set")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--grace", type=int, default=GRACE, help="ASHA grace period (evals)")
    ap.add_argument("--rf", type=float, default=RF, help="ASHA reduction factor")
    ap.add_argument("--method", default="branch_gain", choices=METHODS,
                    help="predictor of the replay's predicted arms")
    args = ap.parse_args(argv)
    for p in args.results:
        if not (Path(p) / "results.parquet").exists() and not Path(p).is_file():
            make = MAKES.get(Path(p).name, "python -m sweeps.run <its spec>")
            _refuse(f"{p}: no recorded sweep (results.parquet); make it with `{make}`, or give "
                    "RESULTS")
    sweeps = [Sweep(p) for p in args.results]
    cals = calibrations(sweeps)
    for s in sweeps:
        c = cals[s.name]["cross"]
        print(f"# {s.name}: {len(s.curves)} trials, sets (budget: trials) "
              f"{ {b: len(t) for b, t in s.sets.items()} }, replayed "
              f"{sorted(s.replay_sets(args.grace))}; cross calibration on "
              f"{c.curves} curves: alpha={c.alpha:.3f} gain(logk,p,q)="
              f"{tuple(round(x, 3) for x in c.gain)} mpl(B,C,beta,gamma)="
              f"{tuple(float(f'{x:.3g}') for x in c.mpl)} ratio(a,b,fmin)="
              f"{tuple(round(x, 4) for x in c.ratio)}")
    table = validation(sweeps, cals)
    keys = ["raw"] + [f"{m}/{mode}" for mode in ("cross", "logo") for m in METHODS]
    print("\n## prediction error |pred - final| (MAE, nats) and Spearman vs final, per rung")
    print(f"{'sweep':14s} rung  n  " + " ".join(f"{k:>22s}" for k in keys))
    for r in table:
        print(f"{r['sweep']:14s} {r['rung']:4d} {r['n']:2d}  " + " ".join(
            f"{_fmt(r['mae:' + k])} rho {_fmt(r['rho:' + k])}".rjust(22) for k in keys))
    res = replays(sweeps, cals, args.replays, args.seed, args.method, args.grace, args.rf)
    print(f"\n## ASHA replay (grace {args.grace}, rf {args.rf:g}, {CONCURRENCY} concurrent, cross "
          f"calibration; health = predicted:{args.method} + rules {json.dumps(HEALTH)})")
    print(f"{'scope':14s} {'arm':24s} {'best survives':>14s} {'tokens saved':>13s} "
          f"{'regret':>8s} replays")
    for scope, arms in res.items():
        for a, d in arms.items():
            print(f"{scope:14s} {a:24s} {d['survive']:14.3f} {d['saved']:13.3f} "
                  f"{d['regret']:8.4f} {d['replays']}")
    res = res["all"]
    res["predicted"] = res[f"predicted:{args.method}"]
    summary_mae = {k: float(np.mean([r[f"mae:{k}"] for r in table])) for k in keys}
    summary_rho = {k: float(np.nanmean([r[f"rho:{k}"] for r in table])) for k in keys}
    out = {
        "best_survival_raw": round(res["raw"]["survive"], 4),
        "best_survival_predicted": round(res["predicted"]["survive"], 4),
        "best_survival_health": round(res["health"]["survive"], 4),
        "best_survival_raw_health": round(res["raw+health"]["survive"], 4),
        "tokens_saved_raw": round(res["raw"]["saved"], 4),
        "tokens_saved_predicted": round(res["predicted"]["saved"], 4),
        "tokens_saved_health": round(res["health"]["saved"], 4),
        "regret_raw": round(res["raw"]["regret"], 5),
        "regret_predicted": round(res["predicted"]["regret"], 5),
        "regret_health": round(res["health"]["regret"], 5),
        "method": args.method, "replays": res["raw"]["replays"], "grace": args.grace,
        "rf": args.rf,
        "best_survival_by_method": {m: round(res[f"predicted:{m}"]["survive"], 4)
                                    for m in METHODS},
        "tokens_saved_by_method": {m: round(res[f"predicted:{m}"]["saved"], 4)
                                   for m in METHODS},
        "mae_mean": {k: round(v, 4) for k, v in summary_mae.items()},
        "spearman_mean": {k: round(v, 3) for k, v in summary_rho.items()},
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()

"""WSD decay branches for token-budget grids (000 §3.1).

Trials that differ only in their token budget D (``tokens``) share one stable-phase run: it is
trained once (warmup + constant LR, from the trials' common parent) with a checkpoint at the
step where each budget's decay starts, and every such trial then runs only its decay from that
checkpoint. A branch equals, bit for bit on CPU, the single WSD run of its budget
(``tests/moe_core/test_train.py``), so results are unchanged while the stable tokens are paid
once per group instead of once per trial.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from moe_core.train.config import TrainConfig
from sweeps.spec import SweepSpec, iter_grid, trial_config, trial_dict


def stable_key(spec: SweepSpec, point: dict[str, Any]) -> str:
    """Hash of the trial config without its token budget."""
    d = copy.deepcopy(trial_dict(spec, point))
    d.pop("tokens", None)
    d.pop("name", None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def decay_start(cfg: TrainConfig) -> int:
    """The step where this trial's WSD decay starts (its stable phase ends)."""
    sched = dataclasses.replace(cfg.schedule, total_steps=cfg.steps)
    return sched.decay_start


def plan_branches(spec: SweepSpec) -> dict[str, dict[str, Any]]:
    """Groups of grid points that can share a stable run: same config but the budget, WSD
    schedule, two or more distinct budgets. Returns {stable_key: {"point": a representative
    grid point with the largest budget, "starts": {tokens: decay-start step}}}."""
    if not spec.wsd_branches:
        return {}
    groups: dict[str, dict[str, Any]] = {}
    for pt in iter_grid(spec):
        cfg = trial_config(spec, pt)
        if cfg.schedule.kind != "wsd" or (cfg.upcycle and cfg.upcycle.lr_policy.policy ==
                                          "constant"):
            continue
        key = stable_key(spec, pt)
        g = groups.setdefault(key, {"point": pt, "tokens": 0, "starts": {}})
        g["starts"][cfg.tokens] = decay_start(cfg)
        if cfg.tokens > g["tokens"]:
            g["point"], g["tokens"] = pt, cfg.tokens
    return {k: g for k, g in groups.items() if len(g["starts"]) > 1}


def stable_tokens_saved(spec: SweepSpec, groups: dict[str, dict[str, Any]]) -> int:
    """Stable-phase tokens not trained thanks to sharing: Σ starts − max start, per group."""
    saved = 0
    for g in groups.values():
        cfg = trial_config(spec, g["point"])
        starts = sorted(g["starts"].values())
        saved += (sum(starts) - starts[-1]) * cfg.tokens_per_step * spec.num_samples
    return saved


def train_stable_group(spec: SweepSpec, group: dict[str, Any], parent: Any,
                       out_dir: Path) -> dict[str, Any]:
    """Train the group's stable run once (or reuse it from ``out_dir``); returns
    {"checkpoints": {tokens: path}, "curve": [...], "peak": float}."""
    from moe_core.schedules import resolve_lr_policy
    from moe_core.train import train
    from moe_core.train.checkpoint import load_checkpoint

    cfg = trial_config(spec, group["point"])
    steps = sorted(set(group["starts"].values()))
    manifest = out_dir / "stable.json"
    if manifest.exists():
        m = json.loads(manifest.read_text())
        if all(Path(p).exists() for p in m["checkpoints"].values()):
            load_checkpoint(next(iter(m["checkpoints"].values())))  # checksum check
            return {"checkpoints": {int(k): v for k, v in m["checkpoints"].items()},
                    "curve": m["curve"], "peak": m["peak"]}
    sched = dataclasses.replace(cfg.schedule, total_steps=steps[-1], decay_frac=0.0)
    peak = cfg.optim.lr
    if parent is not None:
        peak, sched = resolve_lr_policy(
            cfg.upcycle.lr_policy, parent_peak=parent.peak_lr, parent_final_lr=parent.final_lr,
            schedule_cfg=sched, default_peak=peak)
        sched = dataclasses.replace(sched, total_steps=steps[-1], decay_frac=0.0)
    res = train(cfg, out_dir=out_dir, parent=parent, schedule_override=(peak, sched),
                checkpoint_steps=steps, end_step=steps[-1])
    ck = {t: res.checkpoints[s] for t, s in group["starts"].items()}
    curve = [{k: v for k, v in m.items() if isinstance(v, (int, float, str, type(None)))}
             for m in res.curve]
    manifest.write_text(json.dumps({"checkpoints": ck, "curve": curve, "peak": peak}))
    return {"checkpoints": ck, "curve": curve, "peak": peak}

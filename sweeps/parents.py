"""Parents and shared WSD stable runs: trained once, cached on disk, handed to trials.

A parent's state travels to trials through Ray's object store as numpy arrays (an ObjectRef
carried inside a dict, so Ray does not resolve it early); when the object is gone (its node
died) a trial reads the parent's disk cache instead, training it under a file lock only if the
cache lacks it. Each WSD stable run (``plan.BranchGroup``) is trained once with a checkpoint where
each of its token budgets' decay starts; its manifest (``stable.json``) lets a rerun reuse it.
"""

from __future__ import annotations

import fcntl
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from moe_core.fsio import atomic_write_text
from moe_core.train.callbacks import ParentState
from moe_core.train.checkpoint import load_checkpoint
from moe_core.train.config import TrainConfig
from moe_core.train.runner import load_parent, train_parent
from moe_core.train.wsd import train_stable
from sweeps.plan import BranchGroup, SweepPlan
from sweeps.spec import SweepSpec


@dataclass(frozen=True, slots=True)
class StableRun:
    """A trained WSD stable run: its checkpoint per token budget and its eval curve."""

    checkpoints: dict[int, str]
    curve: list[dict[str, Any]]
    peak: float


class _file_lock:
    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(self.path, "w")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def parent_payload(state: ParentState) -> dict[str, Any]:
    """What goes into the object store: numpy arrays + small metadata (no torch tensors)."""
    return {
        "model_state": state.model_state, "model_config": state.model_config,
        "peak_lr": state.peak_lr, "final_lr": state.final_lr, "tokens": state.tokens,
        "optimizer_state": None, "val_loss": state.val_loss,
    }


def get_parent(cfg: TrainConfig, key: str | None, parents: dict[str, Any],
               cache_dir: Path) -> ParentState | None:
    """The trial's parent: object store first, then the disk cache (training it if absent)."""
    if key is None:
        return None
    ref = parents.get(key)
    if ref is not None:
        try:
            return ParentState(**ray.get(ref, timeout=600))
        except Exception:  # object lost with its node: fall back to the disk cache
            pass
    if (cache_dir / key / "meta.json").exists():
        return load_parent(cache_dir / key)
    with _file_lock(cache_dir / f"{key}.lock"):
        state, _ = train_parent(cfg, cache_dir)
    return state


@ray.remote
def _train_parent_task(child: TrainConfig, cache_dir: str) -> dict[str, Any]:
    state, trained = train_parent(child, Path(cache_dir))
    return {**parent_payload(state), "_trained_now": trained}


def train_parents(spec: SweepSpec, plan: SweepPlan, cache_dir: Path) -> dict[str, Any]:
    """Train every distinct parent of the plan once (in parallel Ray tasks) and return their
    ObjectRefs keyed by parent hash. The state lives in the object store as numpy arrays."""
    # max_retries=0: no lineage reconstruction; a parent lost with its node is read back from
    # the disk cache by the trials instead of being retrained.
    refs = {key: _train_parent_task.options(num_cpus=spec.resources.cpus, max_retries=0)
            .remote(p.child, str(cache_dir)) for key, p in plan.parents.items()}
    if refs:
        print(f"[sweeps] preparing {len(refs)} parent(s) (cached by content hash in "
              f"{cache_dir})", file=sys.stderr, flush=True)
        ray.wait(list(refs.values()), num_returns=len(refs))
        ray.get(list(refs.values()))  # surface a failed parent now, not in every trial
    return refs


def train_stable_group(group: BranchGroup, parent: ParentState | None,
                       out_dir: Path) -> StableRun:
    """Train the group's stable run once (or reuse it from ``out_dir``)."""
    manifest = out_dir / "stable.json"
    if manifest.exists():
        m = json.loads(manifest.read_text())
        if all(Path(p).exists() for p in m["checkpoints"].values()):
            load_checkpoint(next(iter(m["checkpoints"].values())))  # checksum check
            return StableRun({int(k): v for k, v in m["checkpoints"].items()}, m["curve"],
                             m["peak"])
    res = train_stable(group.representative.config, out_dir, group.steps, parent=parent)
    ck = {t: res.checkpoints[s] for t, s in group.starts.items()}
    curve = [{k: v for k, v in m.items() if isinstance(v, (int, float, str, type(None)))}
             for m in res.curve]
    atomic_write_text(manifest, json.dumps({"checkpoints": ck, "curve": curve,
                                            "peak": res.peak_lr}))
    return StableRun(ck, curve, res.peak_lr)


@ray.remote
def _train_stable_task(group: BranchGroup, parents: dict[str, Any], cache_dir: str,
                       out_dir: str) -> StableRun:
    rep = group.representative
    parent = get_parent(rep.config, rep.parent_key, parents, Path(cache_dir))
    return train_stable_group(group, parent, Path(out_dir))


def train_stables(spec: SweepSpec, plan: SweepPlan, refs: dict[str, Any], cache_dir: Path,
                  results_dir: Path) -> dict[str, StableRun]:
    """Train each WSD stable run shared by a token-budget grid once; trials branch off it."""
    groups = plan.branch_groups
    if not groups:
        return {}
    print(f"[sweeps] training {len(groups)} shared WSD stable run(s) for "
          f"{sum(len(g.starts) for g in groups.values())} token budgets", file=sys.stderr,
          flush=True)
    tasks = {k: _train_stable_task.options(num_cpus=spec.resources.cpus).remote(
        g, dict(refs), str(cache_dir), str(results_dir / "stable" / k))
        for k, g in groups.items()}
    return {k: ray.get(t) for k, t in tasks.items()}

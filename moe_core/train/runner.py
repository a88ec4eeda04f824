"""Runs with parents: train (or reuse) the parent once, then the upcycled child.

Parents are cached on disk by a content hash of everything that determines them (model, data,
seed, batch, optimizer, schedule, D1), so reruns and sibling trials reuse them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import stat
import time
from pathlib import Path
from typing import Any

import torch

from moe_core.config import model_config_from_dict
from moe_core.errors import CheckpointError, one_line
from moe_core.hf.load import load_pretrained, weight_files
from moe_core.schedules import Phase
from moe_core.train.callbacks import Callback, ParentState, TrainResult
from moe_core.train.checkpoint import load_checkpoint, save_checkpoint
from moe_core.train.config import TrainConfig
from moe_core.train.keys import parent_key, pretrained_key  # noqa: F401 (re-exported)
from moe_core.train.loop import Trainer, train

log = logging.getLogger(__name__)


def load_pretrained_parent(path: str | Path, cache: Path,
                           callbacks: tuple[Callback, ...] = ()) -> ParentState:
    """Load a Hugging Face checkpoint, dense or MoE (``moe_core.hf.load_pretrained``), into the
    parent cache at ``cache`` (same format as a trained parent: fp32 safetensors, no optimizer
    state; the learning rates are unknown, NaN) and return it. Each stage is announced to the
    callbacks' ``on_stage`` with its size."""
    size = sum(f.stat().st_size for f in weight_files(path))
    for cb in callbacks:
        cb.on_stage(f"loading {size / 1e6:,.0f} MB of safetensors from {Path(path).name}")
    cfg, state = load_pretrained(path)
    out = sum(v.numel() * v.element_size() for v in state.values())
    for cb in callbacks:
        cb.on_stage(f"writing the parent cache ({out / 1e6:,.0f} MB fp32)")
    save_checkpoint(cache, model_state=state, optimizer_state=None, meta={
        "step": 0, "tokens": 0, "peak_lr": math.nan, "lr": math.nan, "val_loss": math.nan,
        "parent_key": cache.name, "from_pretrained": str(Path(path).resolve()),
        "model_config": dataclasses.asdict(cfg), "curve": [], "wall_s": 0.0})
    return load_parent(cache)


def parent_phase(cfg: TrainConfig) -> Phase:
    """The parent's phase: a full WSD run of D1 tokens (``parent.decay``) or its stable phase
    only, ending at D1 without decay (a transition checkpoint, 003 §3)."""
    p = cfg.parent_run()
    return Phase.full() if cfg.parent.decay else Phase.stable(p.steps)


def train_parent(
    cfg: TrainConfig, cache_dir: str | Path, callbacks: tuple[Callback, ...] = ()
) -> tuple[ParentState, bool]:
    """Return the parent state of ``cfg`` from the cache, training it first if absent.

    Returns (state, trained_now)."""
    key = parent_key(cfg)
    path = Path(cache_dir) / key
    cached = cached_parent(path, key)
    if cached is not None:
        return cached, False
    if cfg.parent is not None and cfg.parent.from_pretrained is not None:
        return load_pretrained_parent(cfg.parent.from_pretrained, path, callbacks), True
    fit_parent(cfg, path, callbacks)
    return load_parent(path), True


def fit_parent(cfg: TrainConfig, path: Path, callbacks: tuple[Callback, ...] = (),
               save: bool = True) -> None:
    """Train ``cfg``'s parent and, with ``save``, write it to ``path`` (a parent cache entry).
    Every rank of a data-parallel parent calls it (``torch.distributed`` set up; the same global
    batch, split over the ranks by ``TokenBatcher``), rank 0 alone with ``save``. Its optimizer
    state is saved where one rank holds all of it (ZeRO 0, or one rank); a ZeRO-1/2 run on
    several ranks saves none (each holds a partition; only an MoE parent's is ever read)."""
    p = cfg.parent_run()
    trainer = Trainer(p, phase=parent_phase(cfg), callbacks=callbacks)
    res = trainer.fit()
    if not save:
        return
    state = trainer.parent_state()
    whole = trainer.world == 1 or p.optim.zero_stage == 0
    save_checkpoint(
        path, model_state={k: torch.as_tensor(v) for k, v in state.model_state.items()},
        optimizer_state=state.optimizer_state if whole else None,
        meta={
            "step": res.steps, "tokens": res.tokens, "peak_lr": res.peak_lr,
            "lr": res.final_lr, "val_loss": res.val_loss, "parent_key": parent_key(cfg),
            "config": p.to_dict(), "model_config": dataclasses.asdict(state.model_config),
            "curve": res.curve, "wall_s": res.wall_s,
            "data_seed": state.seed, "tokens_per_step": state.tokens_per_step,
            **({"ranks": trainer.world} if trainer.world > 1 else {}),
        },
    )


def check_cache_entry(path: Path, key: str) -> None:
    """Refuse (``CheckpointError``) a parent cache entry this run must not trust: a symbolic
    link or a file another user owns in it, a meta.json that names another parent, or a file
    its meta.json lists no checksum for (the checksums themselves, written by the run that
    trained it, are verified by ``load_checkpoint``)."""
    uid = os.geteuid()
    for p in [path, *path.rglob("*")]:
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode):
            raise CheckpointError(f"{p} is a symbolic link")
        if st.st_uid != uid:
            raise CheckpointError(f"{p} is owned by uid {st.st_uid}, not by you (uid {uid})")
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path / 'meta.json'} is unreadable ({e})") from None
    if not isinstance(meta, dict) or meta.get("parent_key") != key:
        raise CheckpointError(f"{path / 'meta.json'} names parent "
                              f"{meta.get('parent_key') if isinstance(meta, dict) else None!r},"
                              f" not {key!r}")
    sums = meta.get("sha256") or {}
    unlisted = sorted(f.name for f in path.iterdir() if f.name != "meta.json" and f.name not in
                      sums)
    if not sums or unlisted:
        raise CheckpointError(f"{path} holds {unlisted[0] if unlisted else 'files'} without a "
                              "checksum in its meta.json")


def cached_parent(path: Path, key: str) -> ParentState | None:
    """The cached parent at ``path`` (None if absent). An entry that fails its checks or its
    checksums is moved aside (``.corrupt-<key>-<time>`` next to it, kept for inspection) with
    a warning, and None is returned: the caller trains the parent again."""
    if not (path / "meta.json").exists():
        return None
    try:
        check_cache_entry(path, key)
        return load_parent(path)
    except (CheckpointError, KeyError, ValueError, OSError) as e:
        aside = path.with_name(f".corrupt-{key}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        try:
            os.replace(path, aside)
        except FileNotFoundError:  # another process moved it first
            return None
        log.warning("parent cache entry %s is unusable (%s); moved it to %s and training the "
                    "parent again", path, one_line(e), aside)
        return None


def load_parent(path: str | Path) -> ParentState:
    ck = load_checkpoint(path)
    state = {k: v.numpy() for k, v in ck.model_state().items()}
    return ParentState(
        model_state=state,
        model_config=model_config_from_dict(ck.meta["model_config"]),
        peak_lr=float(ck.meta["peak_lr"]),
        final_lr=float(ck.meta["lr"]),
        tokens=int(ck.meta["tokens"]),
        optimizer_state=ck.optimizer_state(),
        val_loss=float(ck.meta.get("val_loss", math.nan)),
        seed=ck.meta.get("data_seed"), tokens_per_step=ck.meta.get("tokens_per_step"),
    )


def run(
    cfg: TrainConfig,
    *,
    cache_dir: str | Path,
    callbacks: tuple[Callback, ...] = (),
    parent: ParentState | None = None,
) -> tuple[TrainResult, dict[str, Any]]:
    """Train ``cfg``; with a parent, train or reuse it first. Returns (result, ledger)."""
    ledger: dict[str, Any] = {"parent_key": None, "parent_trained": False, "parent_tokens": 0}
    if cfg.parent is not None and parent is None:
        parent, trained = train_parent(cfg, cache_dir)
        ledger.update(parent_key=parent_key(cfg), parent_trained=trained,
                      parent_tokens=parent.tokens)
    res = train(cfg, parent=parent, callbacks=callbacks)
    if not math.isfinite(res.val_loss):
        ledger["status"] = "diverged"
    return res, ledger

"""Checkpoints: model (safetensors), optimizer (torch.save, loaded with weights_only=True), the
CPU and (on CUDA) GPU random generators' states per rank, and a ``meta.json`` holding the step,
the data position, the LR state and a SHA-256 of every file.

A checkpoint is a directory written to a temporary name and renamed into place, so a crash never
leaves a half-written checkpoint under the final name. ``load_checkpoint`` verifies every
checksum before reading a tensor.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from moe_core.errors import CheckpointError, ConfigError
from moe_core.fsio import load_json, publish_dir, removed_on_error
from moe_core.hf_check import check_header
from moe_core.upcycle.optim import is_expert_shard

META = "meta.json"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _safe_globals() -> list[Any]:
    """DeepSpeed ZeRO optimizer state holds a few plain classes; allow exactly those."""
    out: list[Any] = []
    try:
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum

        out += [LossScaler, DynamicLossScaler, ZeroStageEnum]
        from deepspeed.utils.tensor_fragment import fragment_address

        out.append(fragment_address)
    except ImportError:  # pragma: no cover - deepspeed is a dependency
        pass
    return out


@dataclass(frozen=True, slots=True)
class Checkpoint:
    path: Path
    meta: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.meta["step"])

    def model_state(self, rank: int = 0) -> dict[str, torch.Tensor]:
        name = self.meta["files"].get(f"model_rank{rank}", self.meta["files"].get("model"))
        if not isinstance(name, str) or "/" in name or name in ("", ".", ".."):
            raise CheckpointError(f"{self.path / 'meta.json'}: files.model={name!r} is not a "
                                  "file name in the checkpoint folder")
        check_header(self.path / name)  # the dry run's streamed header check, before mapping it
        return load_file(str(self.path / name))

    @property
    def world_size(self) -> int:
        """The number of ranks that wrote it."""
        return int(self.meta.get("world_size", 1))

    @property
    def optim(self) -> dict[str, Any]:
        """The ``optim`` block of the training config it was written with."""
        return (self.meta.get("config") or {}).get("optim") or {}

    @property
    def expert_ranks(self) -> int:
        """The expert-parallel degree it was written with (``optim.expert_parallel``, 0 = all
        ranks); rank r holds expert slice r mod this (``parallel.expert_parallel_ranks``)."""
        return int(self.optim.get("expert_parallel") or self.world_size)

    def full_model_state(self) -> dict[str, torch.Tensor]:
        """The whole model: an expert-parallel checkpoint's per-rank shards joined, each expert
        weight ([E/ep, ·, ·] on each rank) concatenated in expert order; a one-file model as
        it is."""
        if "model" in self.meta["files"]:
            return self.model_state()
        shards = [self.model_state(r) for r in range(self.expert_ranks)]
        out = dict(shards[0])
        for k, v in shards[0].items():
            if is_expert_shard(k, v):
                out[k] = torch.cat([s[k] for s in shards])
        return out

    def optimizer_state(self, rank: int = 0) -> dict[str, Any] | None:
        name = self.meta["files"].get(f"optim_rank{rank}")
        if name is None:
            return None
        with torch.serialization.safe_globals(_safe_globals()):
            return torch.load(self.path / name, map_location="cpu", weights_only=True)

    def rng_state(self, rank: int = 0) -> torch.Tensor | None:
        """The CPU generator's state of ``rank``."""
        name = self.meta["files"].get(f"rng_rank{rank}")
        if name is None:
            return None
        return torch.load(self.path / name, map_location="cpu", weights_only=True)

    def cuda_rng_state(self, rank: int = 0) -> list[torch.Tensor] | None:
        """The CUDA generators' states of ``rank``, one per visible device; None when it was
        written without CUDA (and by every checkpoint older than this file)."""
        name = self.meta["files"].get(f"cuda_rng_rank{rank}")
        if name is None:
            return None
        return torch.load(self.path / name, map_location="cpu", weights_only=True)

    def restore_rng(self, rank: int = 0) -> None:
        """Set this process's CPU generator, and the CUDA generator of each device that both
        the checkpoint and this process have, to the states ``rank`` saved."""
        cpu = self.rng_state(rank)
        if cpu is not None:
            torch.set_rng_state(cpu)
        cuda = self.cuda_rng_state(rank)
        if cuda and torch.cuda.is_available():
            for device in range(min(len(cuda), torch.cuda.device_count())):
                torch.cuda.set_rng_state(cuda[device], device)


def _unshared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of each tensor whose storage an earlier key already holds (tied embeddings:
    ``lm_head.weight`` is ``tok_emb.weight``), which safetensors refuses to write twice."""
    seen: set[int] = set()
    out = {}
    for k, v in state.items():
        ptr = v.untyped_storage().data_ptr() if v.numel() else -1
        out[k] = v.clone() if ptr in seen else v
        seen.add(ptr)
    return out


def save_checkpoint(
    path: str | Path,
    *,
    model_state: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any] | None,
    meta: dict[str, Any],
    rank: int = 0,
    world_size: int = 1,
    per_rank_model: bool = False,
    barrier: Any = None,
    gather: Callable[[Any], list[Any]] | None = None,
) -> Path:
    """Write a checkpoint directory atomically. Every rank calls this; with ``per_rank_model``
    (expert parallelism) each rank writes its own model shard, else rank 0 writes the model.

    ``barrier`` is called between the writes and the rename so all ranks' files are in place.

    With ``gather`` (an all-gather of one Python object per rank, e.g.
    ``torch.distributed.all_gather_object``) the ranks share no directory: each ``path`` is
    that rank's own (its node's), each rank writes and publishes only its own files there, the
    ranks' checksums are exchanged through ``gather``, and rank 0's folder also holds
    ``meta.json`` listing every rank's files. The folders joined (as a checkpoint upload
    joins them on shared storage) are one checkpoint; ``load_checkpoint`` of one rank's
    folder alone refuses it as missing the other ranks' files.
    """
    path = Path(path)
    own = gather is not None and world_size > 1
    if world_size == 1 or own:  # a unique name: concurrent savers of one path never share it
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{path.name}-", dir=path.parent))
    else:  # every rank writes into one directory, so its name is agreed: the run's own
        tmp = path.parent / f".tmp-{path.name}-w{world_size}"
        if rank == 0:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
    with removed_on_error(tmp, enabled=world_size == 1 or own):  # no .tmp-* left behind
        if barrier and not own:
            barrier()
        files: dict[str, str] = {}
        if per_rank_model or rank == 0:
            key = f"model_rank{rank}" if per_rank_model else "model"
            files[key] = f"{key}.safetensors"
            state = _unshared({k: v.detach().cpu().contiguous() for k, v in model_state.items()})
            save_file(state, str(tmp / files[key]))
        if optimizer_state is not None:
            files[f"optim_rank{rank}"] = f"optim_rank{rank}.pt"
            torch.save(optimizer_state, tmp / files[f"optim_rank{rank}"])
        files[f"rng_rank{rank}"] = f"rng_rank{rank}.pt"
        torch.save(torch.get_rng_state(), tmp / files[f"rng_rank{rank}"])
        if torch.cuda.is_available():  # dropout, router jitter … on a GPU draw from these
            files[f"cuda_rng_rank{rank}"] = f"cuda_rng_rank{rank}.pt"
            torch.save(torch.cuda.get_rng_state_all(), tmp / files[f"cuda_rng_rank{rank}"])
        # Each rank records its own files' checksums in a part file; rank 0 merges them.
        part = {name: {"file": f, "sha256": _sha256(tmp / f)} for name, f in files.items()}
        if own:  # no shared folder: the parts travel through the collective
            parts = gather(part)
            if rank == 0:
                _write_meta(tmp, meta, parts, world_size)
            publish_dir(tmp, path)
            if barrier:
                barrier()
            return path
        (tmp / f"part_rank{rank}.json").write_text(json.dumps(part))
        if barrier:
            barrier()
        if rank == 0:
            parts = []
            for r in range(world_size):
                parts.append(json.loads((tmp / f"part_rank{r}.json").read_text()))
                (tmp / f"part_rank{r}.json").unlink()
            _write_meta(tmp, meta, parts, world_size)
            publish_dir(tmp, path)
        if barrier:
            barrier()
        return path


def _write_meta(folder: Path, meta: dict[str, Any], parts: list[dict[str, Any]],
                world_size: int) -> None:
    """``meta.json``: ``meta`` plus every rank's files (``parts``: name -> file, sha256)."""
    merged: dict[str, Any] = {}
    for part in parts:
        merged.update(part)
    full = dict(meta)
    full["files"] = {k: v["file"] for k, v in merged.items()}
    full["sha256"] = {v["file"]: v["sha256"] for v in merged.values()}
    full["world_size"] = world_size
    (folder / META).write_text(json.dumps(full, indent=1, default=_json_default))


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (tuple, set)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def load_checkpoint(path: str | Path, *, verify: bool = True) -> Checkpoint:
    """Open a checkpoint directory and verify the SHA-256 of every file it lists."""
    path = Path(path)
    meta_path = path / META
    if not meta_path.exists():
        raise CheckpointError(f"{path} is not a checkpoint (no {META})")
    try:
        meta = load_json(meta_path, 16 << 20, "checkpoint meta")
    except ConfigError as e:
        raise CheckpointError(f"{meta_path} is corrupt: {e}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("files", {}), dict):
        raise CheckpointError(f"{meta_path} is corrupt: not a checkpoint's meta object")
    if verify:
        for fname, digest in meta.get("sha256", {}).items():
            f = path / fname
            if not f.exists():
                raise CheckpointError(f"checkpoint {path} is missing {fname}")
            if _sha256(f) != digest:
                raise CheckpointError(
                    f"checksum mismatch for {f}: the file is corrupt or was modified"
                )
    return Checkpoint(path=path, meta=meta)


def state_from_numpy(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A model state from numpy arrays (accepts torch tensors too). Copies, so read-only
    object-store buffers are never written through."""
    return {k: torch.as_tensor(np.array(v)) if isinstance(v, np.ndarray) else v.clone()
            for k, v in state.items()}

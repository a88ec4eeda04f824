"""One of this project's training checkpoints → a Hugging Face folder with its tokenizer
(``python -m moe_core.hf export``, ``python -m analysis.best --export``)."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import torch

from moe_core.config import ModelConfig
from moe_core.errors import ConfigError, UpcycleError
from moe_core.hf.save import save_moe
from moe_core.hf.tokenizer import save_run_tokenizer
from moe_core.hf_config import model_config, pretrained_hf
from moe_core.location import Location, is_url
from moe_core.model import build_model
from moe_core.moe.named_state import load_model_state
from moe_core.outdir import MARKER
from moe_core.train.checkpoint import load_checkpoint
from moe_core.train.config import TrainConfig, train_config_from_dict


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| / max |b| over all logits."""
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def random_batches(vocab: int, seq_len: int, n: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (2, seq_len), generator=g) for _ in range(n)]


@torch.no_grad()
def logits_of(model: Any, batches: list[torch.Tensor]) -> list[torch.Tensor]:
    model.eval()
    return [model(b).logits for b in batches]  # ours and transformers' outputs both have .logits


SIDECAR = ".upcycle-hmac"
"""Suffix of the HMAC sidecars ``sweeps.store.signing`` writes beside a sweep's objects (not part of
a checkpoint; ``analysis.best --export`` verifies them, this module cannot hold the key)."""


def exported_config(tcfg: TrainConfig, cfg: ModelConfig) -> ModelConfig:
    """The ModelConfig the export describes. A run upcycled from a Hugging Face checkpoint
    builds its model with the run's sequence length (``model.max_seq_len`` unset: RoPE tables
    of ``data.seq_len`` rows), yet its weights serve the positions the checkpoint had: RoPE does
    not depend on the table's length. The export keeps the checkpoint's
    ``max_position_embeddings`` (SmolLM2: 8192, not the trials' 64); a checkpoint no longer at
    its path leaves the run's."""
    src = tcfg.parent.from_pretrained if tcfg.parent is not None else None
    if src is None or tcfg.model.max_seq_len is not None:
        return cfg
    try:
        positions = model_config(pretrained_hf(src)[0]).max_seq_len
    except ConfigError:
        return cfg
    return dataclasses.replace(cfg, max_seq_len=max(positions, cfg.max_seq_len))


def export_checkpoint(checkpoint: str | Path, out: str | Path, **kw: Any) -> dict[str, Any]:
    """:func:`export_local` for a ``checkpoint`` and an ``out`` that may each be a folder or a
    URL (``s3://…``, ``gs://…``; ``moe_core.location``): a checkpoint in a bucket is downloaded
    into a temporary folder first (its HMAC sidecars left out); an export to a bucket is written
    in a temporary folder, then uploaded, replacing what was under ``out``, with its marker
    (``moe_core.outdir.MARKER``) last."""
    if is_url(str(checkpoint)):
        src = Location.of(str(checkpoint))
        with tempfile.TemporaryDirectory(prefix="upcycle-ckpt-") as tmp:
            for rel in src.files():
                if not rel.endswith(SIDECAR):
                    dst = Path(tmp, rel)
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    dst.write_bytes((src / rel).read_bytes())
            return dict(export_checkpoint(tmp, out, **kw), checkpoint=str(checkpoint))
    if is_url(str(out)):
        dst = Location.of(str(out))
        with tempfile.TemporaryDirectory(prefix="upcycle-export-") as tmp:
            res = export_local(checkpoint, Path(tmp, "hf"), **kw)
            dst.delete()
            dst.upload_dir(Path(tmp, "hf"), last=(MARKER,))
        return dict(res, out=dst.uri)
    return export_local(checkpoint, out, **kw)


def export_local(checkpoint: str | Path, out: str | Path, *, arch: str | None = None,
                 tokenizer: str | Path | None = None, verify: bool = True,
                 batches: int = 4, seq_len: int = 64, seed: int = 0) -> dict[str, Any]:
    """Write the checkpoint folder ``checkpoint`` (a ``step_…`` folder, a Tune trial's
    ``checkpoint_…`` copy of one, or expert-parallel rank shards) as a Hugging Face model in
    ``out`` with the tokenizer its run used (``save_run_tokenizer``; ``tokenizer`` overrides);
    with ``verify``, transformers' logits against ours on random batches. Returns the facts as a
    dict (``architecture``, ``out``, ``checkpoint``, ``step``, ``ranks``, ``tokenizer``,
    ``transformers_vs_ours``)."""
    if tokenizer is not None and not Path(tokenizer).exists():  # before anything is written
        raise UpcycleError(f"--tokenizer {tokenizer} does not exist; give a save_pretrained "
                           "folder or its tokenizer.json")
    ck = load_checkpoint(checkpoint)
    if not isinstance(ck.meta.get("config"), dict):
        raise UpcycleError(f"{checkpoint}: its meta.json holds no training config")
    state = ck.full_model_state()
    tcfg = train_config_from_dict(ck.meta["config"])
    cfg = exported_config(tcfg, tcfg.model_config(vocab_size=int(state["tok_emb.weight"].shape[0])))
    out = Path(out)
    res: dict[str, Any] = {"architecture": save_moe(state, cfg, out, arch=arch), "out": str(out),
                           "checkpoint": str(checkpoint), "step": ck.step,
                           "ranks": ck.world_size}
    parent = tcfg.parent.from_pretrained if tcfg.parent is not None else None
    res["tokenizer"] = save_run_tokenizer(out, tcfg.data, parent_dir=parent, override=tokenizer)
    if verify:
        import transformers  # noqa: PLC0415 (verification only)

        transformers.utils.logging.disable_progress_bar()
        bs = random_batches(cfg.vocab_size, min(seq_len, cfg.max_seq_len), batches, seed)
        ours = build_model(cfg)
        load_model_state(ours, {k: v.float() for k, v in state.items()}, resume=True)
        ref = logits_of(ours, bs)
        del ours
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
        res["transformers_vs_ours"] = max(rel_err(a, b) for a, b in zip(logits_of(hf, bs), ref))
        res["verify_batches"] = len(bs)
    return res

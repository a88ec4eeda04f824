"""Evaluation: validation loss over fixed batches and router statistics (002 §4, 004 Fig. 6)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from moe_core.model import Transformer
from moe_core.moe import stats as moe_stats
from moe_core.train.callbacks import ParentState


@torch.no_grad()
def evaluate(
    model: Transformer,
    val_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    device: torch.device,
    reference_mlp: dict[int, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """Validation loss over fixed batches, plus router statistics averaged over MoE layers."""
    was_training = model.training
    model.eval()
    model.record_router_stats(True)
    losses, per_layer = [], []
    for x, y in val_batches:
        out = model(x.to(device), y.to(device))
        losses.append(float(out.loss))
        per_layer.append(out.router_stats)
    model.record_router_stats(False)
    model.train(was_training)
    metrics: dict[str, Any] = {"val_loss": float(np.mean(losses))}
    moe_layers = model.moe_layers()
    if moe_layers:
        keys = ("drop_rate", "overflow_rate_cf1", "entropy", "max1_max2", "max2_max3",
                "aux_switch", "aux_coef")
        for k in keys:
            vals = [s[k] for batch in per_layer for s in batch]
            metrics[f"router.{k}"] = float(np.nanmean(vals)) if vals else math.nan
        loads = np.array([[s["load"] for s in batch] for batch in per_layer]).mean(0)  # [L, E]
        metrics["router.max_load"] = float(loads.max(-1).mean())
        metrics["router.min_load"] = float(loads.min(-1).mean())
        # experts no validation token reached, summed over MoE layers (002 §4: dead experts)
        metrics["router.dead_experts"] = float((loads <= 0).sum())
        sims = [moe_stats.mean_pairwise_cosine(m.expert_vectors().float()) for m in moe_layers]
        metrics["router.expert_similarity"] = float(np.nanmean(sims))
        layer_ids = [i for i, b in enumerate(model.blocks) if b.is_moe]
        metrics.update(layer_health(layer_ids, loads, per_layer, sims))
        if reference_mlp:
            cos = []
            for i, m in enumerate(moe_layers):
                ref = reference_mlp.get(i)
                if ref is not None and ref.numel() == m.expert_vectors().shape[1]:
                    vecs = m.expert_vectors().float()
                    cos.append(moe_stats.cosine_to_reference(vecs, ref))
            if cos:
                metrics["router.cos_to_parent"] = float(np.mean(cos))
    return metrics


def layer_health(layer_ids: Sequence[int], loads_LE: np.ndarray,
                 per_layer: Sequence[Sequence[dict[str, Any]]],
                 sims_L: Sequence[float]) -> dict[str, float]:
    """Per-MoE-layer health (``moe_stats.LAYER_HEALTH``) as ``router.<stat>.layer<block>``, the
    least healthy layer as ``router.<stat>.worst``, and ``router.max_vio`` (mean over layers).

    A layer that collapses is hidden by the means (``router.max_load`` averages over layers);
    the worst-layer figure shows it. ``loads_LE``: each layer's load fractions averaged over the
    eval's batches; ``per_layer``: each batch's per-layer statistics; ``sims_L``: each layer's
    expert similarity."""
    per = {
        "max_load": [float(x) for x in loads_LE.max(-1)],
        "max_vio": [moe_stats.max_violation(torch.from_numpy(row)) for row in loads_LE],
        "dead_experts": [float(x) for x in (loads_LE <= 0).sum(-1)],
        "drop_rate": [float(np.nanmean([b[j]["drop_rate"] for b in per_layer]))
                      for j in range(len(layer_ids))],
        "max1_max2": [float(np.nanmean([b[j]["max1_max2"] for b in per_layer]))
                      for j in range(len(layer_ids))],
        "expert_similarity": [float(x) for x in sims_L],
    }
    out = {"router.max_vio": float(np.nanmean(per["max_vio"]))}
    for stat, vals in per.items():
        for i, v in zip(layer_ids, vals, strict=True):
            out[f"router.{stat}.layer{i}"] = v
        out[f"router.{stat}.worst"] = moe_stats.worst_layer(stat, vals)
    return out


def parent_reference_mlp(parent: ParentState | None,
                         model: Transformer) -> dict[int, torch.Tensor]:
    """Flattened dense-parent MLP per MoE layer, for 004 Fig. 6's cosine similarity (coarse
    upcycling only: a granular expert is a shard and has another shape).

    Built once, in fp32 on the device of the model's parameters (where ``evaluate`` compares
    it with the experts' fp32 vectors): call it after the model has moved to its device."""
    if parent is None or parent.model_config.moe is not None:
        return {}
    device = next(model.parameters()).device
    out, j = {}, 0
    for i, b in enumerate(model.blocks):
        if b.is_moe:
            try:
                parts = [parent.model_state[f"blocks.{i}.mlp.{w}"] for w in
                         ("w_gate", "w_up", "w_down")]
            except KeyError:
                return {}
            out[j] = torch.cat([torch.tensor(np.asarray(p), dtype=torch.float32).reshape(-1)
                                for p in parts]).to(device)
            j += 1
    return out

"""Llama-style decoder (000 §2.1, App. A.2): RMSNorm pre-norm, RoPE, SwiGLU, causal SDPA
attention; MLPs optionally replaced by MoE layers. By default no biases, untied embeddings and
multi-head attention; grouped-query attention (``n_kv_heads``), q/k/v biases (``qkv_bias``) and
tied embeddings (``tie_embeddings``) cover Llama/Mistral/Qwen2 checkpoints.

Shape legend: B batch, S sequence, D model dim, H heads, Hkv key/value heads, Dh head dim,
V vocab. The fused ``wqkv`` rows are [q (H·Dh) | k (Hkv·Dh) | v (Hkv·Dh)].
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from moe_core.config import ModelConfig
from moe_core.loss import head_loss
from moe_core.moe.layer import MoELayer, exclude_from_compile
from moe_core.nn import FixedDtypeBuffers, RMSNorm, SwiGLU, apply_rope, checkpointed, rope_cache

log = logging.getLogger(__name__)



def _is_compile_error(e: BaseException) -> bool:
    """What a failed ``torch.compile`` raises at a block's call: BackendCompilerFailed and
    InductorError (no C compiler, a failed C++/Triton build), Unsupported, ... (torch._dynamo
    is imported by then)."""
    return isinstance(e, torch._dynamo.exc.TorchDynamoException)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.head_dim, self.n_kv = cfg.n_head, cfg.resolved_head_dim, cfg.kv_heads
        self.wqkv = nn.Linear(cfg.d_model, cfg.qkv_dim, bias=cfg.qkv_bias)
        self.wo = nn.Linear(cfg.n_head * self.head_dim, cfg.d_model, bias=False)
        # Qwen3: RMSNorm of each query / key head before RoPE
        self.q_norm = RMSNorm(self.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.norm_eps) if cfg.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        H, Hkv, Dh = self.n_head, self.n_kv, self.head_dim
        if Hkv == H:
            q, k, v = self.wqkv(x).view(B, S, 3, H, Dh).unbind(2)
        else:
            q, k, v = self.wqkv(x).split((H * Dh, Hkv * Dh, Hkv * Dh), dim=-1)
            q, k, v = q.view(B, S, H, Dh), k.view(B, S, Hkv, Dh), v.view(B, S, Hkv, Dh)
        if self.q_norm is not None:  # per head, before RoPE (Qwen3)
            q, k = self.q_norm(q), self.k_norm(k)
        if Hkv != H:  # grouped-query attention: query head h reads key/value head h // (H / Hkv)
            k, v = (t.view(B, S, Hkv, 1, Dh).expand(B, S, Hkv, H // Hkv, Dh).reshape(B, S, H, Dh)
                    for t in (k, v))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, S, H * Dh))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, moe_layer_cls: type = MoELayer):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.is_moe = cfg.moe is not None and cfg.moe.is_moe_layer(layer_idx)
        self.mlp: nn.Module
        if self.is_moe:
            self.mlp = moe_layer_cls(cfg.d_model, cfg.ffn_dim, cfg.moe, cfg.init_std)
        else:
            self.mlp = SwiGLU(cfg.d_model, cfg.ffn_dim)

    def forward(self, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        if self.is_moe:
            y, aux = self.mlp(self.mlp_norm(x))
            return x + y, aux
        return x + self.mlp(self.mlp_norm(x)), None


@dataclass
class ModelOutput:
    logits: torch.Tensor | None
    """[B, S, V]; None when the loss was computed without them (``chunked_loss`` with
    targets)."""
    aux_loss: torch.Tensor
    """Weighted sum of all router losses (aux + z-loss), a scalar; 0 for a dense model."""
    loss: torch.Tensor | None = None
    """Mean next-token cross-entropy when targets were given."""
    router_stats: list[dict[str, Any]] = field(default_factory=list)
    """Per-MoE-layer statistics when ``model.record_router_stats(True)`` is on."""


class Transformer(FixedDtypeBuffers):
    # RoPE tables stay fp32 in a bf16 model: bf16 cos/sin (8 mantissa bits) are off by up to
    # 2^-9 relative, i.e. rotations by the wrong angle at every position
    FIXED_DTYPE_BUFFERS = ("rope_cos", "rope_sin")

    def __init__(self, cfg: ModelConfig, moe_layer_cls: type = MoELayer):
        super().__init__()
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i, moe_layer_cls) for i in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        cos, sin = rope_cache(cfg.max_seq_len, cfg.resolved_head_dim, cfg.rope_theta,
                              cfg.rope_scaling)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.activation_checkpointing = False
        """Recompute each block's activations in the backward (``enable_speedups``)."""
        self.chunked_loss = False
        self.fused_head = False
        """With targets, LM head + cross-entropy in token chunks without the logits
        (``moe_core.loss``; ``enable_speedups``)."""
        self._compiled: list[Any] | None = None  # one compiled callable per block, unregistered
        self.compile_key = "model.compile"
        self.compile_error: str | None = None
        """Why torch.compile failed at set-up (the blocks then run eager); None otherwise."""
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        std = self.config.init_std  # 000 Table 5 "init. size"
        nn.init.normal_(self.tok_emb.weight, std=std)
        if not self.config.tie_embeddings:
            nn.init.normal_(self.lm_head.weight, std=std)
        for b in self.blocks:
            nn.init.normal_(b.attn.wqkv.weight, std=std)
            if b.attn.wqkv.bias is not None:
                nn.init.zeros_(b.attn.wqkv.bias)
            nn.init.normal_(b.attn.wo.weight, std=std)
            if b.is_moe:
                b.mlp.reset_parameters()
            else:
                b.mlp.reset_parameters(std)

    def moe_layers(self) -> list[MoELayer]:
        return [b.mlp for b in self.blocks if b.is_moe]

    def record_router_stats(self, on: bool = True) -> None:
        for m in self.moe_layers():
            m.record_stats = on
            m.last_stats = None

    def update_balancing(self) -> list[dict[str, float]]:
        """Per-step balancing updates (loss-free bias, adaptive aux coefficients)."""
        return [m.update_balancing() for m in self.moe_layers()]

    def enable_speedups(self, *, compile: bool | str = False,
                        activation_checkpointing: bool = False,
                        chunked_loss: bool = False, backend: str = "inductor",
                        key: str = "model.compile", fused_head: bool = False) -> bool:
        """Regional ``torch.compile`` (each block separately, not the whole model), activation
        checkpointing per block and the chunked LM-head loss (``moe_core.loss``); returns
        whether compilation is on. ``compile="auto"`` compiles when the model's parameters are
        on a CUDA device (call it after moving the model). Parameters, buffers and the
        state dict are unchanged (the compiled callables are not submodules). If ``torch.compile``
        fails, now or at a block's first call (no C compiler, an unsupported op), one warning
        naming ``key`` is logged and the model runs eager."""
        self.activation_checkpointing = activation_checkpointing
        self.chunked_loss = chunked_loss
        self.fused_head = fused_head  # Liger's fused linear cross-entropy (moe_core.loss)
        self._compiled, self.compile_key, self.compile_error = None, key, None
        if compile == "auto":
            compile = next(self.parameters()).is_cuda
        if compile:
            exclude_from_compile()  # before dynamo traces a block (moe_core.moe.layer)
            try:
                self._compiled = [torch.compile(b, backend=backend) for b in self.blocks]
            except Exception as e:  # noqa: BLE001 -- any failure means: run eager
                self._compile_failed(e)
        return self._compiled is not None

    @property
    def compiled(self) -> bool:
        """Whether the blocks run compiled (``enable_speedups(compile=True)`` and no failure)."""
        return self._compiled is not None

    def _compile_failed(self, e: BaseException) -> None:
        self._compiled = None
        cause = getattr(e, "inner_exception", None) or e  # BackendCompilerFailed wraps the cause
        lines = str(cause).strip().splitlines()
        self.compile_error = f"{type(cause).__name__}: {lines[0][:300] if lines else ''}"
        log.warning("%s=true: torch.compile failed (%s: %s); running eager. Set %s=false to "
                    "silence this.", self.compile_key, type(cause).__name__,
                    lines[0][:300] if lines else "", self.compile_key)

    def _block(self, i: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Block i, compiled when ``enable_speedups(compile=True)`` succeeded (else eager)."""
        b, args = self.blocks[i], (x, self.rope_cos, self.rope_sin)
        if self._compiled is None:
            return b(*args)
        saved = b.mlp.balancing_state() if b.is_moe else None
        try:
            return self._compiled[i](*args)
        except Exception as e:
            if not _is_compile_error(e):
                raise
            self._compile_failed(e)
            if saved is not None:  # a graph that ran before the failure must not count twice
                b.mlp.restore_balancing_state(saved)
            return b(*args)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> ModelOutput:
        S = tokens.shape[1]
        if S > self.config.max_seq_len:
            raise ValueError(
                f"sequence length {S} exceeds model.max_seq_len={self.config.max_seq_len}"
            )
        x = self.tok_emb(tokens)
        aux = x.new_zeros((), dtype=torch.float32)
        ckpt = self.activation_checkpointing and torch.is_grad_enabled()
        for i in range(len(self.blocks)):
            x, a = checkpointed(self._block, i, x) if ckpt else self._block(i, x)
            if a is not None:
                aux = aux + a
        h, logits, loss = self.norm(x), None, None
        if targets is not None and (self.chunked_loss or self.fused_head):
            loss = head_loss(h.flatten(0, 1), self.lm_head.weight, targets.flatten(),
                             fused=self.fused_head)
        else:
            logits = self.lm_head(h)
            if targets is not None:
                loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        stats = [m.last_stats for m in self.moe_layers() if m.last_stats is not None]
        return ModelOutput(logits=logits, aux_loss=aux, loss=loss, router_stats=stats)


def build_model(cfg: ModelConfig, *, moe_layer_cls: type = MoELayer) -> Transformer:
    """Build the model for ``cfg`` (dense when ``cfg.moe`` is None). ``moe_layer_cls`` lets the
    trainer substitute a subclass of :class:`MoELayer` (DeepSpeed's expert-parallel marker)."""
    return Transformer(cfg, moe_layer_cls)

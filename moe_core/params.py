"""Exact parameter counts from a config, without building the model (000 Eq. 4–6, Table 3)."""

from __future__ import annotations

from dataclasses import dataclass

from moe_core.config import ModelConfig


@dataclass(frozen=True, slots=True)
class ParamCount:
    embedding: int
    """Input embedding (vocab·d)."""
    lm_head: int
    """Untied output projection (vocab·d); 0 when ``tie_embeddings`` shares the embedding."""
    non_embedding_total: int
    """Every parameter except the two embedding matrices (000 Table 3's N)."""
    non_embedding_active: int
    """Parameters a token passes through: attention, norms, routers, shared experts, top-K
    routed experts, dense MLPs."""
    num_moe_layers: int

    @property
    def total(self) -> int:
        return self.non_embedding_total + self.embedding + self.lm_head

    @property
    def sparsity(self) -> float:
        """P = N_total / N_active (000 §4.2)."""
        return self.non_embedding_total / self.non_embedding_active


def count_params(cfg: ModelConfig) -> ParamCount:
    """Count parameters of ``cfg`` exactly as ``build_model(cfg)`` allocates them.

    Per block: attention d·(H + 2·Hkv)·Dh + H·Dh·d (= 4·d² for multi-head attention) plus the
    q/k/v biases (H + 2·Hkv)·Dh with ``qkv_bias`` and the q/k norms 2·Dh with ``qk_norm``, two
    RMSNorm weights 2·d, and either a SwiGLU MLP
    3·d·d_ff or an MoE layer (router E·d, E experts of 3·d·f, shared experts 3·d·S·f). Plus a
    final norm d.
    """
    d = cfg.d_model
    dense_mlp = 3 * d * cfg.ffn_dim
    total = active = d  # final norm
    n_moe = 0
    for i in range(cfg.n_layer):
        qkv = cfg.qkv_dim  # 3·d for multi-head attention
        hd = cfg.n_head * cfg.resolved_head_dim  # d unless head_dim is decoupled
        base = d * qkv + hd * d + 2 * d + (qkv if cfg.qkv_bias else 0) + \
            (2 * cfg.resolved_head_dim if cfg.qk_norm else 0)
        total += base
        active += base
        if cfg.moe is not None and cfg.moe.is_moe_layer(i):
            n_moe += 1
            m = cfg.moe
            f = m.resolved_expert_d_ff(cfg.ffn_dim)
            expert = 3 * d * f
            router = m.num_experts * d
            shared = 3 * d * f * m.num_shared_experts
            total += router + m.num_experts * expert + shared
            active += router + m.top_k * expert + shared
        else:
            total += dense_mlp
            active += dense_mlp
    emb = cfg.vocab_size * d
    return ParamCount(
        embedding=emb,
        lm_head=0 if cfg.tie_embeddings else emb,
        non_embedding_total=total,
        non_embedding_active=active,
        num_moe_layers=n_moe,
    )

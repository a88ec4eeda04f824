"""Frozen configuration dataclasses for the model, the MoE layer and its router.

Each dataclass validates itself in ``__post_init__`` and raises ``ConfigError`` with a message that
names the key (as it appears in a YAML spec: ``model.*``, ``moe.*``, ``router.*``) and the fix.
``from_mapping`` decodes nested mappings (YAML, checkpoint metadata) into any of the project's
config dataclasses (``moe_core.configio.decode``: pydantic over these dataclasses).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from moe_core.configio import (  # noqa: F401 (INT_MAX, coerce_number, unknown_key re-exported)
    INT_MAX,
    coerce_number,
    decode,
    unknown_key,
)
from moe_core.errors import ConfigError

_T = TypeVar("_T")

RouterOrder = Literal["softmax_topk", "topk_softmax"]
AuxLossKind = Literal["switch", "squared", "none"]
ExpertsKernel = Literal["auto", "grouped", "liger"]


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


@dataclass(frozen=True, kw_only=True, slots=True)
class RouterConfig:
    """How tokens are routed to experts and how load is balanced."""

    order: RouterOrder = "softmax_topk"
    """``softmax_topk``: softmax over all experts, then top-K (004 §2.1.2). ``topk_softmax``:
    top-K of the logits, then softmax over those K (000 Eq. 15, Mixtral)."""
    renormalize: bool = False
    """Divide the K selected weights by their sum (002 Eq. 2). Only changes ``softmax_topk``."""
    logit_norm_lambda: float | None = None
    """Gating logit normalization z̃ = λ(z − μ)/σ over experts (002 §4.1). None = off."""
    aux_loss: AuxLossKind = "switch"
    """Load balancing: ``switch`` (000 App. A.3; 004 §3.3), ``squared`` (002 Eq. 3), ``none``."""
    aux_coef: float = 1e-3
    """Coefficient α of the aux loss (000 Table 6 uses 1e-3; 004 uses 1e-2). Initial value when
    ``adaptive_aux`` is on."""
    z_loss_coef: float = 0.0
    """Router z-loss coefficient (ST-MoE; 004 §3.3 tried 1e-3). 0 = off."""
    adaptive_aux: bool = False
    """Adaptive per-layer aux coefficients from the token drop rate (002 §4.2, Eq. 5–9)."""
    adaptive_xi: float = 0.2
    """ξ in f(d) = min(ξ·d, α_max) (002 Eq. 9)."""
    adaptive_alpha_max: float = 0.01
    """α_max in 002 Eq. 9."""
    adaptive_beta: float = 0.99
    """β of the moving average α_{i+1} = β·α_i + (1−β)·α̂_{i+1} (002 Eq. 6)."""
    loss_free_rate: float = 0.0
    """Loss-free load balancing (003 §2): per-expert selection bias updated after each step by
    ``rate·sign(mean load − load)``. 0 = off."""
    init_std: float | None = None
    """Router weight init std; None = sqrt(2 / (5·d_model)) (000 App. A.6)."""

    def __post_init__(self) -> None:
        _check(
            self.order in ("softmax_topk", "topk_softmax"),
            f"router.order={self.order!r} is not known; use 'softmax_topk' or 'topk_softmax'",
        )
        _check(
            self.aux_loss in ("switch", "squared", "none"),
            f"router.aux_loss={self.aux_loss!r} is not known; use 'switch', 'squared' or 'none'",
        )
        _check(
            self.logit_norm_lambda is None or self.logit_norm_lambda > 0,
            f"router.logit_norm_lambda={self.logit_norm_lambda} must be > 0; "
            "use null to switch gating logit normalization off",
        )
        for name in ("aux_coef", "z_loss_coef", "loss_free_rate"):
            v = getattr(self, name)
            _check(v >= 0 and math.isfinite(v), f"router.{name}={v} must be a finite value >= 0")
        _check(self.adaptive_xi > 0, f"router.adaptive_xi={self.adaptive_xi} must be > 0")
        _check(
            self.adaptive_alpha_max > 0,
            f"router.adaptive_alpha_max={self.adaptive_alpha_max} must be > 0",
        )
        _check(
            0.0 <= self.adaptive_beta < 1.0,
            f"router.adaptive_beta={self.adaptive_beta} must lie in [0, 1) (002 Eq. 6)",
        )
        _check(
            self.init_std is None or self.init_std > 0,
            f"router.init_std={self.init_std} must be > 0, or null for sqrt(2/(5 d_model))",
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class MoEConfig:
    """Shape of the MoE layers (E/G/T nomenclature of 004 §2.2)."""

    num_experts: int = 8
    """Total number of routed experts in each MoE layer."""
    top_k: int = 2
    """Experts each token is routed to (T in 004)."""
    granularity: int = 1
    """G: expert d_ff = d_ff / G (004 §2.2). Ignored when ``expert_d_ff`` is given."""
    expert_d_ff: int | None = None
    """Hidden size of each expert; None = model d_ff // granularity."""
    num_shared_experts: int = 0
    """Always-on shared experts of size ``expert_d_ff`` each (004 §3.9, DeepSeek-MoE)."""
    capacity_factor: float | None = None
    """None = dropless (default). Otherwise each expert takes at most
    ceil(capacity_factor · tokens · top_k / num_experts) assignments; the rest are dropped."""
    interleave: int = 1
    """Every ``interleave``-th layer is MoE (layers i with (i + 1) % interleave == 0); 1 = every
    layer; 2 = alternate dense and MoE as 003 §5.1 / Llama 4."""
    router: RouterConfig = field(default_factory=RouterConfig)
    """Router and balancing options."""
    experts_kernel: ExpertsKernel = "auto"
    """How the experts are computed (the same maths; outputs agree to rounding): ``grouped``,
    torch's own kernels (``torch._grouped_mm`` on CUDA, the per-expert loop on CPU where it
    measured faster); ``liger``, liger-kernel's fused MoE (Triton: gather, gate/up GEMM, SwiGLU
    and combine fused; the ``gpu`` extra; CUDA only, an error at set-up elsewhere); ``auto``,
    the kernel measured faster at the nearest measured shape on this GPU
    (``moe_core/moe/kernel_choice.json``, filled by ``bench/moe_experts.py --record``), else
    ``grouped``. Not part of a parent's identity."""

    EXECUTION_KEYS = ("experts_kernel",)
    """Options that change how fast the layer computes, not what: left out of ``identity``."""

    def identity(self) -> dict[str, Any]:
        """The fields that decide what the layer computes (not ``EXECUTION_KEYS``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in self.EXECUTION_KEYS}

    def __post_init__(self) -> None:
        _check(self.num_experts >= 1, f"moe.num_experts={self.num_experts} must be >= 1")
        _check(self.top_k >= 1, f"moe.top_k={self.top_k} must be >= 1")
        _check(
            self.top_k <= self.num_experts,
            f"moe.top_k={self.top_k} exceeds moe.num_experts={self.num_experts}; "
            "lower top_k or raise num_experts",
        )
        _check(self.granularity >= 1, f"moe.granularity={self.granularity} must be >= 1")
        _check(
            self.expert_d_ff is None or self.expert_d_ff >= 1,
            f"moe.expert_d_ff={self.expert_d_ff} must be >= 1 (or null for d_ff / granularity)",
        )
        _check(
            self.num_shared_experts >= 0,
            f"moe.num_shared_experts={self.num_shared_experts} must be >= 0",
        )
        _check(
            self.capacity_factor is None or self.capacity_factor > 0,
            f"moe.capacity_factor={self.capacity_factor} must be > 0, or null for dropless",
        )
        _check(self.interleave >= 1, f"moe.interleave={self.interleave} must be >= 1")
        _check(
            isinstance(self.router, RouterConfig),
            "moe.router must be a mapping of router options",
        )
        _check(
            self.experts_kernel in typing.get_args(ExpertsKernel),
            f"moe.experts_kernel={self.experts_kernel!r} is not known; use auto, grouped or liger",
        )

    def resolved_expert_d_ff(self, d_ff: int) -> int:
        """Expert hidden size for a model with dense hidden size ``d_ff``."""
        if self.expert_d_ff is not None:
            return self.expert_d_ff
        if d_ff % self.granularity != 0:
            raise ConfigError(
                f"moe.granularity={self.granularity} does not divide model.d_ff={d_ff}; "
                "pick a granularity that divides d_ff or set moe.expert_d_ff"
            )
        return d_ff // self.granularity

    def is_moe_layer(self, layer_idx: int) -> bool:
        return (layer_idx + 1) % self.interleave == 0


RopeKind = Literal["linear", "llama3"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RopeScaling:
    """RoPE frequency scaling of a long-context checkpoint (Hugging Face ``rope_parameters``):
    ``linear`` divides every frequency by ``factor`` (position interpolation); ``llama3``
    (Llama 3.1+) divides the low frequencies by ``factor``, keeps the high ones and blends
    between them (``moe_core.nn.rope_inv_freq``)."""

    kind: RopeKind
    """``linear`` or ``llama3``."""
    factor: float
    """How much longer the context is than the original (the frequencies' divisor)."""
    low_freq_factor: float = 1.0
    """llama3: wavelengths above original_max_position / low_freq_factor are divided."""
    high_freq_factor: float = 4.0
    """llama3: wavelengths below original_max_position / high_freq_factor are kept."""
    original_max_position: int = 8192
    """llama3: the context length the checkpoint was pretrained at."""

    def __post_init__(self) -> None:
        _check(self.kind in typing.get_args(RopeKind),
               f"model.rope_scaling.kind={self.kind!r} must be one of "
               f"{', '.join(typing.get_args(RopeKind))}")
        _check(self.factor > 0, f"model.rope_scaling.factor={self.factor} must be > 0")
        _check(0 < self.low_freq_factor < self.high_freq_factor,
               f"model.rope_scaling: need 0 < low_freq_factor={self.low_freq_factor} < "
               f"high_freq_factor={self.high_freq_factor}")
        _check(self.original_max_position >= 1, "model.rope_scaling.original_max_position="
               f"{self.original_max_position} must be >= 1")


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    """A Llama-style decoder (000 §2.1, App. A.2): RMSNorm pre-norm, RoPE, SwiGLU; by default
    multi-head attention, no biases and untied embeddings. ``n_kv_heads``, ``qkv_bias``,
    ``tie_embeddings``, ``head_dim``, ``qk_norm`` and ``rope_scaling`` cover Llama 2/3.x,
    Mistral, Qwen2 and Qwen3 checkpoints (``moe_core.hf``)."""

    vocab_size: int
    """Tokenizer vocabulary size."""
    n_layer: int
    """Number of transformer blocks."""
    d_model: int
    """Hidden size."""
    n_head: int
    """Attention heads; d_model must be divisible by n_head."""
    n_kv_heads: int | None = None
    """Key/value heads (grouped-query attention, Llama 2/3, Mistral); None = n_head (MHA).
    Must divide n_head."""
    d_ff: int | None = None
    """Dense MLP hidden size; None = 4·d_model (000 Table 3)."""
    max_seq_len: int = 1024
    """Longest sequence the RoPE cache covers (000 Table 4: context length 1,024)."""
    init_std: float = 0.02
    """Std of the normal init of every weight matrix (000 Table 5 per size)."""
    rope_theta: float = 10000.0
    """RoPE base."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    tie_embeddings: bool = False
    """Share one matrix between the input embedding and the output projection (lm_head)."""
    qkv_bias: bool = False
    """Biases on the query/key/value projections (Qwen2); the output projection has none."""
    head_dim: int | None = None
    """Width of one attention head; None = d_model / n_head. Set where a checkpoint decouples
    it (Qwen3: 16 heads of 128 in a 1,024-wide model); the output projection then maps
    n_head·head_dim back to d_model."""
    qk_norm: bool = False
    """RMSNorm of each query and key head (a weight of head_dim, shared by the heads) before
    RoPE (Qwen3)."""
    rope_scaling: RopeScaling | None = None
    """RoPE frequency scaling of a long-context checkpoint; None = plain RoPE."""
    moe: MoEConfig | None = None
    """None = dense model."""
    name: str = "custom"
    """Preset name, for logs."""

    def __post_init__(self) -> None:
        for key in ("vocab_size", "n_layer", "d_model", "n_head", "max_seq_len"):
            v = getattr(self, key)
            _check(isinstance(v, int) and v >= 1, f"model.{key}={v!r} must be an integer >= 1")
        if self.head_dim is None:
            _check(
                self.d_model % self.n_head == 0,
                f"model.n_head={self.n_head} does not divide model.d_model={self.d_model}; "
                "pick n_head dividing d_model (or set model.head_dim)",
            )
            _check(
                (self.d_model // self.n_head) % 2 == 0,
                f"model.d_model/model.n_head={self.d_model // self.n_head} must be even for "
                "RoPE",
            )
        else:
            _check(isinstance(self.head_dim, int) and self.head_dim >= 2
                   and self.head_dim % 2 == 0,
                   f"model.head_dim={self.head_dim!r} must be an even integer >= 2 (RoPE "
                   "rotates pairs), or null for d_model / n_head")
        _check(self.rope_scaling is None or isinstance(self.rope_scaling, RopeScaling),
               "model.rope_scaling must be a RopeScaling or null")
        _check(
            self.d_ff is None or self.d_ff >= 1, f"model.d_ff={self.d_ff} must be >= 1 or null"
        )
        _check(
            self.n_kv_heads is None or (
                isinstance(self.n_kv_heads, int) and self.n_kv_heads >= 1
                and self.n_head % self.n_kv_heads == 0),
            f"model.n_kv_heads={self.n_kv_heads!r} must be an integer >= 1 dividing "
            f"model.n_head={self.n_head}, or null for n_head",
        )
        _check(self.rope_theta > 0, f"model.rope_theta={self.rope_theta} must be > 0")
        _check(self.norm_eps > 0, f"model.norm_eps={self.norm_eps} must be > 0")
        _check(self.init_std > 0, f"model.init_std={self.init_std} must be > 0")
        if self.moe is not None:
            _check(isinstance(self.moe, MoEConfig), "model.moe must be a MoEConfig or null")
            self.moe.resolved_expert_d_ff(self.ffn_dim)  # raises if G does not divide d_ff
            _check(
                any(self.moe.is_moe_layer(i) for i in range(self.n_layer)),
                f"moe.interleave={self.moe.interleave} exceeds model.n_layer={self.n_layer}: "
                "no layer would be MoE; lower interleave",
            )

    @property
    def ffn_dim(self) -> int:
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    @property
    def resolved_head_dim(self) -> int:
        """``head_dim``, or d_model / n_head when null."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_head

    @property
    def kv_heads(self) -> int:
        """Key/value heads (``n_kv_heads``, or ``n_head`` when null)."""
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_head

    @property
    def qkv_dim(self) -> int:
        """Output width of the fused q/k/v projection: (n_head + 2·kv_heads)·head_dim."""
        return (self.n_head + 2 * self.kv_heads) * self.resolved_head_dim

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    def with_moe(self, moe: MoEConfig | None) -> ModelConfig:
        return dataclasses.replace(self, moe=moe)


# ---- mapping -> dataclasses (moe_core.configio.decode, through pydantic) -------------------------


def from_mapping(cls: type[_T], data: Any, key_prefix: str = "") -> _T:
    """Decode a nested mapping (parsed YAML, ``dataclasses.asdict`` output) into dataclass
    ``cls``; errors name the full dotted key (``key_prefix`` is the path of ``data``). See
    ``moe_core.configio.decode``."""
    return decode(cls, data, key_prefix)


def decode_value(tp: Any, value: Any, path: str) -> Any:
    """One value decoded as a field of type ``tp`` would be: a ``ConfigError`` naming ``path``
    if it does not fit."""
    return decode(tp, value, path)


def router_config_from_dict(data: Mapping[str, Any]) -> RouterConfig:
    return from_mapping(RouterConfig, data, "router")


def moe_config_from_dict(data: Mapping[str, Any]) -> MoEConfig:
    return from_mapping(MoEConfig, data, "moe")


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Nested plain-dict form of any config dataclass (for logs, hashing, checkpoints)."""
    return dataclasses.asdict(cfg)


def model_config_from_dict(data: Mapping[str, Any]) -> ModelConfig:
    """ModelConfig from a mapping, e.g. ``dataclasses.asdict(model_config)`` in checkpoints."""
    return from_mapping(ModelConfig, data, "model")

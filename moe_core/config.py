"""Frozen configuration dataclasses for the model, the MoE layer and its router.

Each dataclass validates itself in ``__post_init__`` and raises ``ConfigError`` with a message that
names the key (as it appears in a YAML spec: ``model.*``, ``moe.*``, ``router.*``) and the fix.
``from_mapping`` is the one decoder of nested mappings (YAML, checkpoint metadata) into any of the
project's config dataclasses.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from moe_core.errors import ConfigError, shown

_T = TypeVar("_T")

INT_MAX = 2**63 - 1
"""Largest magnitude an integer field takes (int64: what torch and numpy hold)."""

RouterOrder = Literal["softmax_topk", "topk_softmax"]
AuxLossKind = Literal["switch", "squared", "none"]


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


# ---- mapping -> dataclasses ---------------------------------------------------------------------


def coerce_number(value: Any, key: str = "") -> Any:
    """YAML 1.1 reads ``1e-4`` (no dot) as a string: turn numeric strings into numbers.

    An int when the string has no dot or exponent and is integral, a float otherwise; any other
    value is returned unchanged. ``key`` is unused (kept for callers that pass it).
    """
    if isinstance(value, str):
        try:
            f = float(value)
        except ValueError:
            return value
        return int(f) if f.is_integer() and "e" not in value.lower() and "." not in value else f
    return value


@functools.cache
def _fields(cls: type) -> dict[str, tuple[Any, bool]]:
    """``{name: (resolved type, required)}`` of the init fields of dataclass ``cls``."""
    hints = typing.get_type_hints(cls)
    return {
        f.name: (
            hints[f.name],
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(cls)
        if f.init
    }


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _arms(tp: Any) -> tuple[Any, ...]:
    """The alternatives of a union type (``X | None``), or ``(tp,)``."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return (tp,)


def _admits_number(tp: Any) -> bool:
    for arm in _arms(tp):
        if typing.get_origin(arm) is Literal:
            args = typing.get_args(arm)
            if any(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args):
                return True
        elif arm in (int, float):
            return True
    return False


def _decode(tp: Any, value: Any, path: str) -> Any:
    """Decode one field value: nested dataclasses from mappings, lists into tuples, numeric
    strings into numbers where ``tp`` admits a number. Anything else passes through unchanged;
    its type is checked after the dataclass (and its ``__post_init__``) has seen it."""
    arms = _arms(tp)
    if value is None and type(None) in arms:
        return None
    for arm in arms:
        if isinstance(arm, type) and dataclasses.is_dataclass(arm):
            return from_mapping(arm, value, path)
    for arm in arms:
        if typing.get_origin(arm) is tuple and isinstance(value, (list, tuple)):
            args = typing.get_args(arm)
            if len(args) == 2 and args[1] is Ellipsis:
                args = (args[0],) * len(value)
            if not args:
                return tuple(value)
            # a length mismatch is kept for __post_init__ / the type check to report
            return tuple(
                _decode(args[min(i, len(args) - 1)], x, f"{path}[{i}]")
                for i, x in enumerate(value)
            )
    if isinstance(value, str) and _admits_number(tp):
        return coerce_number(value, path)
    return value


def _describe(tp: Any) -> str:
    names = []
    for arm in _arms(tp):
        origin = typing.get_origin(arm)
        if arm is type(None):
            names.append("null")
        elif origin is Literal:
            names.append("one of " + ", ".join(repr(a) for a in typing.get_args(arm)))
        elif origin is tuple:
            args = typing.get_args(arm)
            fixed = args and not (len(args) == 2 and args[1] is Ellipsis)
            names.append(f"a list of {len(args)} values" if fixed
                         else f"a list ({_describe(args[0])} each)" if args else "a list")
        elif isinstance(arm, type) and dataclasses.is_dataclass(arm):
            names.append("a mapping")
        else:
            names.append(
                {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
                .get(arm, getattr(arm, "__name__", str(arm)))
            )
    return " or ".join(names)


def _fits(arm: Any, value: Any) -> bool:
    origin = typing.get_origin(arm)
    if arm is Any:
        return True
    if arm is type(None):
        return value is None
    if origin is Literal:  # true is not 1
        return any(value == a and isinstance(value, bool) == isinstance(a, bool)
                   for a in typing.get_args(arm))
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        args = typing.get_args(arm)
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_type_problem(args[0], x, "") is None for x in value)
        return len(value) == len(args) and all(
            _type_problem(a, x, "") is None for a, x in zip(args, value)
        )
    if arm in (int, float) and _bad_number(value, integer=arm is int) is not None:
        return False
    if arm is int:  # integral floats (``tokens: 1e6``) are accepted as they always were
        return isinstance(value, numbers.Integral) or (
            isinstance(value, numbers.Real) and float(value).is_integer()
        )
    if arm is float:
        return isinstance(value, numbers.Real)
    if arm is bool:
        return isinstance(value, bool)
    if arm is str:  # taken as YAML typed them (``name: 123``); value rules are __post_init__'s
        return value is not None and not isinstance(
            value, (Mapping, list, tuple, set, bytes, bytearray))
    if isinstance(arm, type):
        return isinstance(value, arm)
    return True  # a type this decoder does not know: trust the dataclass


def _bad_number(value: Any, integer: bool = True) -> str | None:
    """Why ``value`` is no number for an int (``integer``) or float field: a bool, NaN or
    infinite, an integer beyond int64; or None."""
    if isinstance(value, bool):
        return "is true/false, not a number"
    if isinstance(value, numbers.Real) and not math.isfinite(value):
        return "is not finite"
    if integer and isinstance(value, numbers.Real) and abs(value) > INT_MAX:
        return f"is out of range: an integer is at most 2**63 - 1 = {INT_MAX:,} in magnitude"
    return None


def _has_bad_number(value: Any) -> bool:
    """A bool, NaN, ±inf or beyond-int64 number in ``value``: refused before ``__post_init__``
    where the field does not take it (``moe.num_experts: true`` is not 1)."""
    if isinstance(value, tuple):
        return any(_has_bad_number(v) for v in value)
    return isinstance(value, numbers.Number) and _bad_number(value) is not None


def _type_problem(tp: Any, value: Any, path: str) -> str | None:
    """A message naming ``path`` if ``value`` does not fit ``tp``, else None."""
    arms = _arms(tp)
    if any(_fits(arm, value) for arm in arms):
        return None
    why = _bad_number(value, integer=int in arms) if isinstance(value, numbers.Number) else None
    if why is not None and _admits_number(tp):
        return f"{path}={shown(value)} {why}; use {_describe(tp)}"
    for arm in arms:  # name the element of a tuple that does not fit
        if typing.get_origin(arm) is tuple and isinstance(value, tuple):
            args = typing.get_args(arm)
            if len(args) == 2 and args[1] is Ellipsis:
                args = (args[0],) * len(value)
            if len(args) == len(value):
                for i, (a, x) in enumerate(zip(args, value)):
                    problem = _type_problem(a, x, f"{path}[{i}]")
                    if problem is not None:
                        return problem
    return f"{path}={shown(list(value) if isinstance(value, tuple) else value)} must be " \
        f"{_describe(tp)}"


def from_mapping(cls: type[_T], data: Any, key_prefix: str = "") -> _T:
    """Decode a nested mapping (parsed YAML, ``dataclasses.asdict`` output) into dataclass ``cls``.

    Walks the field types: nested dataclasses are decoded from mappings (an instance passes
    through), ``T | None`` keeps None, lists become tuples, and numeric strings become numbers
    where the field admits a number (``coerce_number``; ints are kept for float fields). Errors
    are ``ConfigError`` naming the full dotted key (``key_prefix`` is the path of ``data``):
    unknown keys, missing required keys, a non-mapping where a mapping is required. Value rules
    are the dataclass's own ``__post_init__``; a value of the wrong type that it lets through
    (``moe.top_k: 1.5``, ``optim.lr: fast``) is reported after it. A number that no number field
    takes is refused before ``__post_init__`` sees it: a bool (``true`` is not 1), NaN or ±inf,
    an integer beyond int64; bool fields take only true/false, string fields no null.
    """
    if isinstance(data, cls):
        return data
    where = key_prefix or "the config"
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must be a mapping, got {type(data).__name__}")
    fields = _fields(cls)
    unknown = sorted((k for k in data if k not in fields), key=str)
    if unknown:
        under = f"under {key_prefix}" if key_prefix else "at the top level"
        name = str(unknown[0]) if len(str(unknown[0])) <= 100 else shown(unknown[0], 100)
        raise ConfigError(
            f"unknown key {_join(key_prefix, name)}; known keys {under}: "
            f"{', '.join(sorted(fields))}"
        )
    missing = [k for k, (_, required) in fields.items() if required and k not in data]
    if missing:
        raise ConfigError(f"missing required key {_join(key_prefix, missing[0])}")
    kwargs = {k: _decode(fields[k][0], v, _join(key_prefix, k)) for k, v in data.items()}

    def type_problem() -> str | None:
        for k, v in kwargs.items():
            problem = _type_problem(fields[k][0], v, _join(key_prefix, k))
            if problem is not None:
                return problem
        return None

    for k, v in kwargs.items():  # true, NaN, inf, 1e30 where a number goes: refused first
        if _has_bad_number(v):
            problem = _type_problem(fields[k][0], v, _join(key_prefix, k))
            if problem is not None:
                raise ConfigError(problem)
    try:
        obj = cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError, ArithmeticError, AttributeError) as e:
        # __post_init__ tripped over a value of the wrong type
        raise ConfigError(type_problem() or f"{where}: {e}") from None
    problem = type_problem()
    if problem is not None:
        raise ConfigError(problem)
    return obj


def unknown_key(cls: type, dotted: str) -> str | None:
    """None if ``dotted`` (``moe.router.order``) names a field of dataclass ``cls`` (following
    nested and optional dataclass fields), else ``from_mapping``'s message for that key."""
    tp: Any = cls
    path = ""
    for part in dotted.split("."):
        dc = next((a for a in _arms(tp) if isinstance(a, type) and dataclasses.is_dataclass(a)),
                  None)
        if dc is None:
            return f"unknown key {dotted}: {path} is not a mapping of options"
        if part not in _fields(dc):
            under = f"under {path}" if path else "at the top level"
            return (f"unknown key {_join(path, part)}; known keys {under}: "
                    f"{', '.join(sorted(_fields(dc)))}")
        tp, path = _fields(dc)[part][0], _join(path, part)
    return None


def decode_value(tp: Any, value: Any, path: str) -> Any:
    """One value decoded as a field of type ``tp`` would be (``from_mapping``'s rules, without
    a dataclass): a ``ConfigError`` naming ``path`` if it does not fit."""
    out = _decode(tp, value, path)
    problem = _type_problem(tp, out, path)
    if problem is not None:
        raise ConfigError(problem)
    return out


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

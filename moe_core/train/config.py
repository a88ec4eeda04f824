"""Configuration of one training run (dense, MoE, or upcycled from a parent).

A run is described by a nested mapping (YAML) that ``train_config_from_dict`` turns into frozen
dataclasses (``moe_core.config.from_mapping``), validating every key before any work starts.
The strict YAML reader and the ``--set key.path=value`` overrides live in ``moe_core.configio``
(re-exported here).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from moe_core.config import ModelConfig, MoEConfig, _check, from_mapping
from moe_core.config import (
    coerce_number as coerce_number,  # re-exported (sweeps.spec.sweep uses it)
)
from moe_core.data.config import DataConfig
from moe_core.errors import ConfigError, shown
from moe_core.hf_config import pretrained_model_config, pretrained_moe
from moe_core.presets import model_config, preset
from moe_core.schedules import LRPolicyConfig, ScheduleConfig
from moe_core.upcycle.strategies import STRATEGIES
from moe_core.yamlio import (  # noqa: F401 (re-exported: the YAML front door's home)
    apply_overrides,
    load_yaml,
    parse_override_value,
)


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    preset: str = "debug"
    """Size preset (``moe_core.presets``): 15M 44M 0.1B 0.2B 0.5B 1B tiny debug."""
    max_seq_len: int | None = None
    """RoPE table length; None = data.seq_len."""
    compile: bool | Literal["auto"] = "auto"
    """Regional ``torch.compile``: each transformer block compiled separately (fuses the
    element-wise work: norms, RoPE, SwiGLU, routing weights; an MoE block is one graph on
    CUDA). ``auto``: on when the model trains on a CUDA device, off on CPU. If compilation
    fails the run logs one warning naming this key and trains eager."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in the backward pass (non-reentrant
    ``torch.utils.checkpoint``): less memory for larger micro-batches, ~1/3 more compute.
    The MoE balancing counters still count each forward once."""

    chunked_loss: bool = False
    """LM head + cross-entropy over chunks of tokens, gradients formed in the forward
    (``moe_core.loss``): the [tokens, vocab] logits and their fp32 copies are never
    materialised (about 10 GiB at 32k vocabulary and 32 × 1,024 tokens). The loss and
    gradients agree with the plain path to rounding, not bit for bit."""

    fused_head: bool | Literal["auto"] = "auto"
    """The LM head's loss by liger-kernel's fused linear cross-entropy (the ``gpu`` extra):
    ``auto`` on CUDA when liger-kernel is installed (else the chunked loss, or the plain head
    without ``chunked_loss``), ``false`` never, ``true`` always (an error where it cannot run).
    Evaluation keeps the chunked loss. Same loss and gradients to rounding."""

    EXECUTION_KEYS = ("compile", "activation_checkpointing", "chunked_loss", "fused_head")
    """Options that change how fast a run computes and what memory it takes, not what it
    computes: left out of a parent's identity (``runner.parent_key``)."""

    def identity(self) -> dict[str, Any]:
        """The fields that decide what the model computes (not ``EXECUTION_KEYS``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in self.EXECUTION_KEYS}

    def __post_init__(self) -> None:
        preset(self.preset)
        _check(isinstance(self.compile, bool) or self.compile == "auto",
               f"model.compile={self.compile!r} must be true, false or 'auto'")
        for key in self.EXECUTION_KEYS[1:]:
            v = getattr(self, key)
            if key == "fused_head":
                _check(isinstance(v, bool) or v == "auto",
                       f"model.fused_head={v!r} must be auto, true or false")
                continue
            _check(isinstance(v, bool), f"model.{key}={v!r} must be true or false")


BF16_MODE_AUTO = {0: "torch_autocast", 1: "bf16_optimizer", 2: "deepspeed"}
"""``optim.bf16_mode: auto`` per ZeRO stage (``moe_core.train.engine.DEFAULT_BF16_MODE`` is this
dict): of the modes correct at the stage, the one with the fewest host syncs per optimizer step
on the CUDA path (docs/gpu-training-step.md §2, §4)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OptimConfig:
    """AdamW on the DeepSpeed engine (000 Table 4)."""

    lr: float = 3e-3
    """Peak learning rate."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW β1, β2 (000 Table 4)."""
    eps: float = 1e-8
    """AdamW ε."""
    weight_decay: float = 0.1
    """Decoupled weight decay on matrices (000 Table 4)."""
    grad_clip: float = 1.0
    """Clip the gradient norm of the whole model to this (000 Table 4); at ZeRO 0 every expert
    counted once."""
    zero_stage: int = 0
    """DeepSpeed ZeRO stage 0–2 (DeepSpeed-MoE does not support ZeRO-3)."""
    dtype: Literal["auto", "fp32", "bf16"] = "auto"
    """``auto``: bf16 on a CUDA device that supports it, fp32 otherwise."""
    expert_parallel: int = 0
    """Expert-parallel ranks for MoE runs (DeepSpeed-MoE groups); 0 = all ranks."""
    bf16_mode: Literal["auto", "deepspeed", "bf16_optimizer", "torch_autocast"] = "auto"
    """How a bf16 run keeps its weights and optimizer (``moe_core.train.engine.bf16_mode``):
    ``torch_autocast`` (fp32 weights, bf16 compute, plain torch AdamW), ``bf16_optimizer``
    (DeepSpeed's BF16_Optimizer: bf16 weights, ZeRO 1, fp32 gradient accumulation) or
    ``deepspeed`` (bf16 weights, DeepSpeed's wrapper for the stage: the ZeRO-0 unfused one);
    ``auto``: the fewest host syncs correct at the stage, torch_autocast at ZeRO 0,
    bf16_optimizer at 1, deepspeed at 2 (docs/gpu-training-step.md)."""

    def __post_init__(self) -> None:
        _check(self.lr > 0 and math.isfinite(self.lr), f"optim.lr={self.lr} must be > 0")
        _check(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
            f"optim.betas={list(self.betas)} must be two numbers in [0, 1)",
        )
        _check(self.eps > 0, f"optim.eps={self.eps} must be > 0")
        _check(self.weight_decay >= 0, f"optim.weight_decay={self.weight_decay} must be >= 0")
        _check(self.grad_clip >= 0, f"optim.grad_clip={self.grad_clip} must be >= 0 (0 = off)")
        _check(
            self.zero_stage in (0, 1, 2, 3),
            f"optim.zero_stage={self.zero_stage} must be 0, 1 or 2",
        )
        _check(
            self.expert_parallel >= 0,
            f"optim.expert_parallel={self.expert_parallel} must be >= 0 (0 = all ranks)",
        )
        _check(
            self.bf16_mode in ("auto", "deepspeed", "bf16_optimizer", "torch_autocast"),
            f"optim.bf16_mode={self.bf16_mode!r} must be 'auto', 'deepspeed', "
            "'bf16_optimizer' or 'torch_autocast'",
        )
        _check(
            self.bf16_mode != "bf16_optimizer" or self.zero_stage == 1,
            f"optim.bf16_mode=bf16_optimizer needs optim.zero_stage=1 (DeepSpeed's "
            f"BF16_Optimizer is ZeRO 1), not {self.zero_stage}; set optim.zero_stage: 1 or "
            "another bf16_mode",
        )

    def resolved_bf16_mode(self) -> str:
        """What a bf16 run does: ``bf16_mode``, ``auto`` resolved by ZeRO stage
        (:data:`BF16_MODE_AUTO`). The dry run's disk and memory forecast read it (no torch)."""
        if self.bf16_mode != "auto":
            return self.bf16_mode
        return BF16_MODE_AUTO[min(self.zero_stage, 2)]
        _check(
            self.dtype in ("auto", "fp32", "bf16"),
            f"optim.dtype={self.dtype!r} must be 'auto', 'fp32' or 'bf16'",
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchConfig:
    global_batch: int = 16
    """Sequences per optimizer step, whatever the number of ranks."""
    micro_batch: int = 8
    """Sequences per forward pass on one rank; gradient accumulation makes up the rest."""

    def __post_init__(self) -> None:
        _check(self.global_batch >= 1, f"batch.global_batch={self.global_batch} must be >= 1")
        _check(self.micro_batch >= 1, f"batch.micro_batch={self.micro_batch} must be >= 1")

    def accumulation_steps(self, world_size: int) -> int:
        per_rank, rem = divmod(self.global_batch, world_size)
        _check(
            rem == 0,
            f"batch.global_batch={self.global_batch} is not divisible by the {world_size} ranks; "
            "make global_batch a multiple of the rank count",
        )
        gas, rem = divmod(per_rank, self.micro_batch)
        _check(
            rem == 0 and gas >= 1,
            f"batch.micro_batch={self.micro_batch} does not divide the per-rank batch {per_rank} "
            f"(global_batch={self.global_batch} over {world_size} ranks); pick a divisor",
        )
        return gas


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalConfig:
    every_steps: int = 20
    """Evaluate (validation loss + router statistics) every this many optimizer steps."""
    batches: int = 4
    """Fixed validation batches (of batch.micro_batch sequences) per evaluation."""
    seed: int = 0
    """Seed of the validation batches: fixed apart from the run's seed, so every trial of a
    sweep (any seed) is scored on the same tokens."""

    def __post_init__(self) -> None:
        _check(self.every_steps >= 1, f"eval.every_steps={self.every_steps} must be >= 1")
        _check(self.batches >= 1, f"eval.batches={self.batches} must be >= 1")


@dataclass(frozen=True, kw_only=True, slots=True)
class UpcycleConfig:
    """How a run is initialised from its parent (``moe_core.upcycle``)."""

    method: Literal["dense_to_moe", "expand_experts", "continue"] = "dense_to_moe"
    """``dense_to_moe`` (000 §2.1; 004 §2.3), ``expand_experts`` (003 Def. 3.1), or
    ``continue`` (same architecture: continued training, e.g. the dense baseline of 004 Fig. 4a)."""
    virtual_groups: bool = True
    """dense_to_moe: the G shards of a group share one router row, so top-K takes whole groups (004
    §2.3)."""
    weight_scaling: bool = True
    """dense_to_moe: scale each expert's up/down projections so the MoE output equals the dense
    output at init (004 §2.3.1)."""
    factor: int = 2
    """expand_experts: E → factor·E."""
    strategy: str = "uniform"
    """expand_experts replication: uniform, grad_norm, saliency, weight_norm, curvature."""
    router_noise: float = 0.0
    """expand_experts: U(−δ, δ) noise on the replicas' router biases."""
    lr_policy: LRPolicyConfig = field(default_factory=LRPolicyConfig)
    """LR after upcycling: constant at the parent's final LR, reset to a peak, or a ratio."""

    def __post_init__(self) -> None:
        _check(
            self.method in ("dense_to_moe", "expand_experts", "continue"),
            f"upcycle.method={self.method!r} must be 'dense_to_moe', 'expand_experts' or "
            "'continue'",
        )
        _check(self.factor >= 2, f"upcycle.factor={self.factor} must be >= 2")
        _check(
            self.strategy in STRATEGIES,
            f"upcycle.strategy={shown(self.strategy)} is not known; use one of "
            f"{', '.join(STRATEGIES)}",
        )
        _check(self.router_noise >= 0, f"upcycle.router_noise={self.router_noise} must be >= 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class ParentConfig:
    """The run a trial is upcycled from: same model preset, data, batch and seed as the child;
    or a pretrained Hugging Face checkpoint (``from_pretrained``), loaded rather than trained."""

    tokens: int | None = None
    """D1: tokens the parent is trained for (or, for expand_experts, the transition point τ).
    Required unless ``from_pretrained`` is given; with it, optional: the tokens the checkpoint
    was pretrained on when known (its model card), recorded as the trials' D1 (nothing is
    trained), so that the D1 × D2 laws and "Should I upcycle?" apply to your own model."""
    from_pretrained: str | None = None
    """A local ``save_pretrained`` folder (``moe_core.hf.load_pretrained``): a dense Llama /
    Mistral / Qwen2 / Qwen3 / Phi-3 (``dense_to_moe``, ``continue``) or a Mixtral / Qwen2-MoE /
    Qwen3-MoE (``expand_experts``, ``continue``). The parent is loaded, not trained; the trial's
    model dims, and an MoE parent's experts, come from it."""
    moe: MoEConfig | None = None
    """None = dense parent; an MoEConfig = the E-expert parent of expert upcycling."""
    lr: float | None = None
    """Parent peak LR; None = the child's optim.lr."""
    schedule: ScheduleConfig | None = None
    """Parent schedule; None = the child's schedule."""
    decay: bool = True
    """True: the parent ends with its WSD decay (a D1-token run). False: the parent is the
    stable-phase checkpoint at D1 (the transition point of 003 §3)."""
    batch: BatchConfig | None = None
    """Parent batch; None = the child's (set it when the child's batch is a sweep knob)."""
    seed: int | None = None
    """Parent seed; None = the child's (set it to share one parent across child seeds)."""

    def __post_init__(self) -> None:
        if self.from_pretrained is not None:
            _check(isinstance(self.from_pretrained, str) and self.from_pretrained != "",
                   "parent.from_pretrained must be the path of a save_pretrained folder")
            _check(self.tokens is None or self.tokens >= 1,
                   f"parent.tokens={self.tokens} must be >= 1 (with parent.from_pretrained: the "
                   "tokens the checkpoint was pretrained on), or be left out")
            for key in ("moe", "lr", "schedule", "batch", "seed"):
                _check(getattr(self, key) is None,
                       f"parent.{key} contradicts parent.from_pretrained (the parent is loaded, "
                       f"not trained, and its architecture is the checkpoint's); remove "
                       f"parent.{key}")
            _check(self.decay, "parent.decay=false contradicts parent.from_pretrained (the "
                   "parent is loaded, not trained); remove parent.decay")
            return
        _check(self.tokens is not None,
               "missing required key parent.tokens (or give parent.from_pretrained)")
        _check(self.tokens >= 1, f"parent.tokens={self.tokens} must be >= 1")
        _check(self.lr is None or self.lr > 0, f"parent.lr={self.lr} must be > 0")


def _same_routing(a: MoEConfig, b: MoEConfig, d_ff: int) -> bool:
    """The same experts and routing function (what a checkpoint fixes), whatever the training
    knobs (balancing, capacity, aux coefficients)."""
    keys = ("num_experts", "top_k", "num_shared_experts", "interleave")
    return all(getattr(a, k) == getattr(b, k) for k in keys) and \
        a.resolved_expert_d_ff(d_ff) == b.resolved_expert_d_ff(d_ff) and \
        (a.router.order, a.router.renormalize) == (b.router.order, b.router.renormalize)


def _identity(moe: MoEConfig | None) -> dict[str, Any] | None:
    return None if moe is None else moe.identity()


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    name: str = "run"
    """Run name, for logs and output folders."""
    seed: int = 0
    """Seed of initialisation and data order (a sweep sets it per trial from ``seeds``)."""
    model: ModelSpec = field(default_factory=ModelSpec)
    """Model size preset and execution options."""
    moe: MoEConfig | None = None
    """null = a dense run; else the MoE layers (``moe_core.config.MoEConfig``)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Corpus and tokenizer."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """AdamW and the DeepSpeed engine."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """Learning-rate schedule."""
    batch: BatchConfig = field(default_factory=BatchConfig)
    """Global and micro batch."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation cadence."""
    tokens: int = 100_000
    """D (D2 for an upcycled run): tokens this run trains on."""
    parent: ParentConfig | None = None
    """The run this one is upcycled from; null = trained from scratch."""
    upcycle: UpcycleConfig | None = None
    """How the run is made from its parent (defaults apply when ``parent`` is set)."""

    def __post_init__(self) -> None:
        _check(self.tokens >= 1, f"tokens={self.tokens} must be >= 1")
        if self.optim.zero_stage == 3 and (self.moe is not None or self._parent_is_moe()):
            raise ConfigError(
                "optim.zero_stage=3 is not supported with MoE (DeepSpeed-MoE supports ZeRO 0-2); "
                "set optim.zero_stage to 0, 1 or 2"
            )
        if self.optim.zero_stage == 3:
            raise ConfigError(
                "optim.zero_stage=3 is not supported by this trainer; use 0, 1 or 2"
            )
        if self.parent is not None and self.upcycle is None:
            object.__setattr__(self, "upcycle", UpcycleConfig())
        if self.upcycle is not None:
            _check(self.parent is not None, "upcycle is set but parent is missing; add parent:")
            if self.parent.from_pretrained is not None:
                self._check_pretrained()
            self._check_upcycle(self.parent_moe())
        # Build the model config now so impossible shapes fail before any work.
        self.model_config()
        self.batch.accumulation_steps(1)

    def _check_upcycle(self, parent_moe: MoEConfig | None) -> None:
        """The upcycling method against the parent's architecture (``parent.moe``, or a
        pretrained checkpoint's own) and the child's ``moe``."""
        assert self.upcycle is not None
        m, where = self.upcycle.method, (
            "the parent.from_pretrained checkpoint's" if self.parent.from_pretrained else
            "parent.moe")
        if m == "dense_to_moe":
            _check(
                parent_moe is None and self.moe is not None,
                "upcycle.method=dense_to_moe needs a dense parent (parent.moe: null) and an "
                "MoE child (moe: {...})" + ("; this checkpoint is an MoE: use expand_experts "
                                            "or continue" if parent_moe is not None else ""),
            )
        elif m == "expand_experts":
            _check(
                parent_moe is not None and self.moe is not None,
                "upcycle.method=expand_experts needs an MoE parent (parent.moe, or an MoE "
                "checkpoint) and moe",
            )
            want = parent_moe.num_experts * self.upcycle.factor
            _check(
                self.moe.num_experts == want,
                f"moe.num_experts={self.moe.num_experts} must equal {where} num_experts="
                f"{parent_moe.num_experts} × upcycle.factor = {want}",
            )
            _check(
                self.moe.top_k == parent_moe.top_k,
                f"moe.top_k={self.moe.top_k} must equal {where} top_k={parent_moe.top_k} "
                "(expert upcycling keeps top-K)",
            )
        elif self.parent.from_pretrained is not None and parent_moe is not None:
            d_ff = self.model_config(moe=None).ffn_dim
            _check(self.moe is not None and _same_routing(parent_moe, self.moe, d_ff),
                   f"upcycle.method=continue from an MoE checkpoint needs moe with its experts "
                   f"and routing: num_experts={parent_moe.num_experts}, top_k="
                   f"{parent_moe.top_k}, expert_d_ff={parent_moe.resolved_expert_d_ff(d_ff)}, "
                   f"num_shared_experts={parent_moe.num_shared_experts}, interleave="
                   f"{parent_moe.interleave}, router.order={parent_moe.router.order}, "
                   f"router.renormalize={parent_moe.router.renormalize}")
        else:
            _check(
                _identity(self.parent.moe) == _identity(self.moe),
                "upcycle.method=continue needs the same moe config in parent and child",
            )

    def _check_pretrained(self) -> None:
        """Settings a pretrained parent decides refuse a contradicting value, naming the key."""
        assert self.upcycle is not None
        _check(self.model.preset == "debug",
               f"model.preset={self.model.preset!r} contradicts parent.from_pretrained: the "
               "model's dims come from the checkpoint; remove model.preset")
        _check(self.upcycle.lr_policy.policy == "reset",
               f"upcycle.lr_policy.policy={self.upcycle.lr_policy.policy} needs the parent's "
               "learning rate, which a pretrained checkpoint does not record; use reset")

    def parent_moe(self) -> MoEConfig | None:
        """The parent's MoE: ``parent.moe``, or a pretrained checkpoint's own (Mixtral,
        Qwen2-MoE, Qwen3-MoE; read from its config.json); None for a dense parent."""
        if self.parent is None:
            return None
        if self.parent.from_pretrained is not None:
            return pretrained_moe(self.parent.from_pretrained)
        return self.parent.moe

    def _parent_is_moe(self) -> bool:
        return self.parent_moe() is not None

    @property
    def seq_len(self) -> int:
        return self.data.seq_len

    @property
    def tokens_per_step(self) -> int:
        return self.batch.global_batch * self.data.seq_len

    @property
    def steps(self) -> int:
        return max(1, math.ceil(self.tokens / self.tokens_per_step))

    def model_config(self, vocab_size: int | None = None, moe: Any = "self") -> ModelConfig:
        """ModelConfig of this run (``moe="parent"`` for the parent's architecture)."""
        m = self.moe if moe == "self" else (self.parent_moe() if moe == "parent" else moe)
        if self.parent is not None and self.parent.from_pretrained is not None:
            return pretrained_model_config(self.parent.from_pretrained, m,
                                           self.model.max_seq_len or self.data.seq_len)
        return model_config(
            self.model.preset,
            vocab_size=vocab_size or self.data.vocab_size_hint(),
            moe=m,
            max_seq_len=self.model.max_seq_len or self.data.seq_len,
        )

    def parent_run(self) -> TrainConfig:
        """The TrainConfig that trains this run's parent."""
        if self.parent is None:
            raise ConfigError("this run has no parent")
        if self.parent.from_pretrained is not None:
            raise ConfigError("a parent.from_pretrained parent is loaded, not trained")
        p = self.parent
        return dataclasses.replace(
            self,
            name=f"{self.name}-parent",
            seed=self.seed if p.seed is None else p.seed,
            batch=p.batch or self.batch,
            moe=p.moe,
            optim=dataclasses.replace(self.optim, lr=p.lr or self.optim.lr),
            schedule=p.schedule or self.schedule,
            tokens=p.tokens,
            parent=None,
            upcycle=None,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def train_config_from_dict(data: Mapping[str, Any]) -> TrainConfig:
    """Validate a nested mapping into a TrainConfig; errors name the key and the fix."""
    return from_mapping(TrainConfig, data)

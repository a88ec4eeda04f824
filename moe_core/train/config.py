"""Configuration of one training run (dense, MoE, or upcycled from a parent).

A run is described by a nested mapping (YAML) that ``train_config_from_dict`` turns into frozen
dataclasses (``moe_core.config.from_mapping``), validating every key before any work starts.
``apply_overrides`` implements the ``--set key.path=value`` command-line overrides with unknown
keys rejected.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from moe_core.config import ModelConfig, MoEConfig, _check, from_mapping
from moe_core.config import coerce_number as coerce_number  # re-exported (sweeps.spec uses it)
from moe_core.data import DataConfig
from moe_core.errors import ConfigError
from moe_core.presets import model_config, preset
from moe_core.schedules import LRPolicyConfig, ScheduleConfig


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    preset: str = "debug"
    """Size preset (``moe_core.presets``): 15M 44M 0.1B 0.2B 0.5B 1B tiny debug."""
    max_seq_len: int | None = None
    """RoPE table length; None = data.seq_len."""

    def __post_init__(self) -> None:
        preset(self.preset)


@dataclass(frozen=True, kw_only=True, slots=True)
class OptimConfig:
    """AdamW on the DeepSpeed engine (000 Table 4)."""

    lr: float = 3e-3
    """Peak learning rate."""
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    zero_stage: int = 0
    """DeepSpeed ZeRO stage 0–2 (DeepSpeed-MoE does not support ZeRO-3)."""
    dtype: Literal["auto", "fp32", "bf16"] = "auto"
    """``auto``: bf16 on a CUDA device that supports it, fp32 otherwise."""
    expert_parallel: int = 0
    """Expert-parallel ranks for MoE runs (DeepSpeed-MoE groups); 0 = all ranks."""

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
    weight_scaling: bool = True
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
        _check(self.router_noise >= 0, f"upcycle.router_noise={self.router_noise} must be >= 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class ParentConfig:
    """The run a trial is upcycled from: same model preset, data, batch and seed as the child."""

    tokens: int
    """D1: tokens the parent is trained for (or, for expand_experts, the transition point τ)."""
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
        _check(self.tokens >= 1, f"parent.tokens={self.tokens} must be >= 1")
        _check(self.lr is None or self.lr > 0, f"parent.lr={self.lr} must be > 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    name: str = "run"
    seed: int = 0
    model: ModelSpec = field(default_factory=ModelSpec)
    moe: MoEConfig | None = None
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    tokens: int = 100_000
    """D (D2 for an upcycled run): tokens this run trains on."""
    parent: ParentConfig | None = None
    upcycle: UpcycleConfig | None = None

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
            m = self.upcycle.method
            if m == "dense_to_moe":
                _check(
                    self.parent.moe is None and self.moe is not None,
                    "upcycle.method=dense_to_moe needs a dense parent (parent.moe: null) and an "
                    "MoE child (moe: {...})",
                )
            elif m == "expand_experts":
                _check(
                    self.parent.moe is not None and self.moe is not None,
                    "upcycle.method=expand_experts needs parent.moe and moe",
                )
                want = self.parent.moe.num_experts * self.upcycle.factor
                _check(
                    self.moe.num_experts == want,
                    f"moe.num_experts={self.moe.num_experts} must equal parent.moe.num_experts "
                    f"× upcycle.factor = {want}",
                )
                _check(
                    self.moe.top_k == self.parent.moe.top_k,
                    f"moe.top_k={self.moe.top_k} must equal parent.moe.top_k="
                    f"{self.parent.moe.top_k} (expert upcycling keeps top-K)",
                )
            else:
                _check(
                    self.parent.moe == self.moe,
                    "upcycle.method=continue needs the same moe config in parent and child",
                )
        # Build the model config now so impossible shapes fail before any work.
        self.model_config()
        self.batch.accumulation_steps(1)

    def _parent_is_moe(self) -> bool:
        return self.parent is not None and self.parent.moe is not None

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
        m = self.moe if moe == "self" else (self.parent.moe if moe == "parent" else moe)
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


def load_yaml(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must contain a mapping at the top level")
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides (values parsed as YAML) to a nested mapping.

    Intermediate mappings are created only under keys that exist in a dataclass schema; the
    final validation (``train_config_from_dict``) rejects unknown keys with their full path.
    """
    out = copy.deepcopy(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r} must look like key.path=value")
        key, raw = item.split("=", 1)
        value = yaml.safe_load(raw) if raw != "" else None
        parts = key.strip().split(".")
        node = out
        for p in parts[:-1]:
            if node.get(p) is None:
                node[p] = {}
            if not isinstance(node[p], dict):
                raise ConfigError(f"--set {key}: {p} is not a mapping")
            node = node[p]
        node[parts[-1]] = value
    return out

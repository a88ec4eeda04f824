"""The sweep plan: every grid trial with its TrainConfig, the distinct parents, the WSD branch
groups (000 §3.1) and the compute estimates, built once from the spec before Ray starts.

``build_plan(spec)`` is the only place a grid point becomes a ``TrialPlan`` (a point sampled at run
time gets its own from :func:`plan_trial` when its trial starts): nothing downstream re-derives a
trial's config, parent or branch. docs/sweeps.md ("The plan", "WSD branches") says how branches
and a law search's on-demand stable runs (:func:`extends_stable`) are trained.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from moe_core.errors import ConfigError
from moe_core.params import count_params
from moe_core.schedules import run_schedule
from moe_core.train.config import TrainConfig, train_config_from_dict
from moe_core.train.keys import parent_key
from sweeps.plan.resources import local_cluster, resolve_gpus
from sweeps.spec.algorithm import plugin
from sweeps.spec.sweep import SweepSpec
from sweeps.spec.trials import (
    Built,
    build_configs,
    experts_kernels,
    knob_values,
    point_key,
    trial_dict,
)


@dataclass(frozen=True, slots=True)
class TrialPlan:
    """One trial: its search point, config and everything derived from them once."""

    point: dict[str, Any]
    config: TrainConfig
    knobs: dict[str, Any]
    """The value each searched knob has in the trial's config, keyed by YAML path."""
    tokens: int
    N_active: int
    parent_key: str | None
    stable_key: str
    """Hash of the trial's config without its token budget (its WSD branch group)."""
    decay_start: int
    """The step where the trial's WSD decay starts (where its stable phase ends)."""


@dataclass(frozen=True, slots=True)
class ParentPlan:
    key: str
    child: TrainConfig
    """The config of a trial with this parent (``train_parent(child)`` trains or loads it)."""
    tokens: int
    flops: float
    trials: int
    """Trials (× num_samples) that start from this parent."""
    needs_optimizer: bool = False
    """A trial replicates its experts (003 §3): the parent's AdamW state travels with it."""


@dataclass(frozen=True, slots=True)
class BranchGroup:
    """Grid points that share one WSD stable run: same config but the token budget."""

    key: str
    representative: TrialPlan
    """The member with the largest budget: its config trains the stable run."""
    starts: dict[int, int]
    """{token budget: the step its decay starts at} (= the stable run's checkpoints)."""

    @property
    def steps(self) -> list[int]:
        return sorted(set(self.starts.values()))


@dataclass(frozen=True, slots=True)
class SweepPlan:
    trials: tuple[TrialPlan, ...]
    """The grid trials, one per grid point (each runs ``num_samples`` times), in the order Tune
    starts them (``SearchSpace.tune_points``; with ``num_samples`` > 1 Tune starts every point
    once, then every point again)."""
    parents: dict[str, ParentPlan]
    branch_groups: dict[str, BranchGroup]
    num_samples: int
    sampled: tuple[str, ...]
    """Knobs sampled at run time (random / Optuna)."""
    _index: dict[str, TrialPlan] = field(default_factory=dict, repr=False)
    kernels: frozenset[str] = frozenset()
    """The ``moe.experts_kernel`` values of every validated trial config
    (``sweeps.spec.trials.check_kernels``); last, so a plan pickled before it unpickles."""

    @property
    def num_trials(self) -> int:
        return len(self.trials) * self.num_samples

    @property
    def trial_tokens(self) -> int:
        return sum(t.tokens for t in self.trials) * self.num_samples

    @property
    def trial_flops(self) -> float:
        return sum(6 * t.N_active * t.tokens for t in self.trials) * self.num_samples

    @property
    def parent_tokens(self) -> int:
        return sum(p.tokens for p in self.parents.values())

    @property
    def parent_flops(self) -> float:
        return sum(p.flops for p in self.parents.values())

    @property
    def tokens_saved_by_sharing(self) -> int:
        """Parent tokens not trained because trials share parents."""
        return sum(p.tokens * p.trials for p in self.parents.values()) - self.parent_tokens

    @property
    def tokens_saved_by_branches(self) -> int:
        """Stable-phase tokens not trained thanks to WSD branches: Σ starts − max start."""
        saved = 0
        for g in self.branch_groups.values():
            starts = sorted(g.starts.values())
            saved += (sum(starts) - starts[-1]) * g.representative.config.tokens_per_step
        return saved * self.num_samples

    def estimates(self) -> dict[str, Any]:
        """The plan's compute ledger (the ``planned_*`` keys of summary.json)."""
        return {"trials": self.num_trials, "grid_points": len(self.trials),
                "parents": len(self.parents), "trial_tokens": self.trial_tokens,
                "trial_flops": self.trial_flops, "parent_tokens": self.parent_tokens,
                "parent_flops": self.parent_flops,
                "tokens_saved_by_sharing": self.tokens_saved_by_sharing,
                "branch_groups": len(self.branch_groups),
                "tokens_saved_by_branches": self.tokens_saved_by_branches}

    def trial(self, spec: SweepSpec, point: Mapping[str, Any]) -> TrialPlan:
        """The TrialPlan of a point: from the plan (grid points), or built now (a point with
        knobs sampled at run time)."""
        found = self._index.get(point_key(point))
        return found if found is not None else plan_trial(spec, point)

    def branch_starts(self, t: TrialPlan) -> dict[int, int]:
        """{token budget: decay start} of ``t`` and the planned members of its branch group
        (where an on-demand stable run saves checkpoints as it passes them)."""
        g = self.branch_groups.get(t.stable_key)
        return {**(g.starts if g is not None else {}), t.config.tokens: t.decay_start}

    def branch_of(self, t: TrialPlan) -> BranchGroup | None:
        """The WSD branch group ``t`` decays from (None when it trains on its own)."""
        g = self.branch_groups.get(t.stable_key)
        return g if g is not None and t.config.tokens in g.starts else None


def _stable_key(cfg_dict: dict[str, Any]) -> str:
    d = copy.deepcopy(cfg_dict)
    d.pop("tokens", None)
    d.pop("name", None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def plan_trial(spec: SweepSpec, point: Mapping[str, Any], built: Built | None = None
               ) -> TrialPlan:
    """Config, knob values, size, parent and branch facts of one search point (its config
    taken from ``built`` when there, else built now)."""
    point = dict(point)
    got = (built or {}).get(point_key(point))
    d = got[0] if got is not None else trial_dict(spec, point)
    cfg = got[1] if got is not None else train_config_from_dict(d)
    if spec.export == "hf":  # refuse a model with no exact HF form before any training
        from moe_core.hf.save import export_arch  # noqa: PLC0415 (torch: only for export: hf)

        try:
            export_arch(cfg.model_config())
            if cfg.upcycle is not None and cfg.upcycle.router_noise > 0:
                raise ConfigError(f"upcycle.router_noise={cfg.upcycle.router_noise} gives the "
                                  "replicas a selection bias, which Mixtral / Qwen2-MoE lack")
        except ConfigError as e:
            raise ConfigError(f"export: hf cannot write this sweep's models: {e}") from None
    return TrialPlan(
        point=point, config=cfg, knobs=knob_values(spec, point, d),
        tokens=cfg.steps * cfg.tokens_per_step,
        N_active=count_params(cfg.model_config()).non_embedding_active,
        parent_key=parent_key(cfg) if cfg.parent is not None else None,
        stable_key=_stable_key(d), decay_start=run_schedule(cfg).schedule.decay_start,
    )


def _bf16(cfg: TrainConfig, gpus: float) -> bool:  # gpus: resolved (resources.resolve_gpus)
    return cfg.optim.dtype == "bf16" or (cfg.optim.dtype == "auto" and gpus > 0)


def bf16_weights(cfg: TrainConfig, gpus: float) -> bool:
    """Whether a run keeps bf16 weights (and DeepSpeed's fp32 master copy): a bf16 run whose
    ``optim.bf16_mode`` is not ``torch_autocast`` (fp32 weights, bf16 compute)."""
    return _bf16(cfg, gpus) and cfg.optim.resolved_bf16_mode() != "torch_autocast"


def tied_copy_bytes(m: Any) -> int:
    """A checkpoint stores tied embeddings twice (``tok_emb`` and ``lm_head``: safetensors
    refuses shared tensors, ``moe_core.train.checkpoint`` writes a copy), in fp32: V·D·4 bytes
    that the parameter count, which counts them once, leaves out (SmolLM2-135M: 113 MB)."""
    return m.vocab_size * m.d_model * 4 if m.tie_embeddings else 0


@dataclass(frozen=True, slots=True)
class DiskEstimate:
    """What a sweep writes besides its results (``--dry-run`` prints it)."""

    checkpoint_bytes: int
    """The largest trial checkpoint: all parameters × ``bytes_per_param``."""
    params: int
    bytes_per_param: int
    keep: int
    trials: int
    concurrent: int
    """``max_concurrent``, or (unset: Ray decides from the cluster) every trial at once."""
    kept_bytes: int
    """Checkpoints Tune still holds after the sweep: ``keep`` per trial (at most)."""
    parent_bytes: int
    """The parents' disk cache: fp32 weights, AdamW moments (+ fp32 master in bf16)."""
    stable_bytes: int
    """WSD stable runs: one checkpoint per branch point of each group."""
    object_store_bytes: int = 0
    """The parents' payloads in Ray's object store (``sweeps.run.parents.parent_payload``, one
    ``ray.put`` each by the driver): fp32 weights with the tied copy, as the cache holds them,
    and the AdamW state (+ fp32 master in bf16) when a trial replicates experts from it."""

    @property
    def running_bytes(self) -> int:
        """Peak while trials run: per running trial Tune's ``keep`` copies, the new one being
        persisted and the trial's own local copy."""
        return self.concurrent * (self.keep + 2) * self.checkpoint_bytes


def disk_estimate(spec: SweepSpec, plan: SweepPlan) -> DiskEstimate:
    """Checkpoint and cache bytes of the plan, from parameter counts and dtypes."""
    gpus = resolve_gpus(spec.resources.gpus, local_cluster())  # auto: as on this machine

    def size(cfg: TrainConfig) -> tuple[int, int]:
        m = cfg.model_config()
        n = count_params(m).total
        # per parameter: the weights and AdamW's two fp32 moments, 4 + 8 = 12 in fp32 and under
        # torch_autocast; with bf16 weights DeepSpeed's fp32 master besides them, 2 + 4 + 8 = 14
        return n, n * (14 if bf16_weights(cfg, gpus) else 12) + tied_copy_bytes(m)

    sizes = [size(t.config) for t in plan.trials] or [(0, 0)]
    params, biggest = max(sizes, key=lambda x: x[1])
    keep = spec.checkpoint.keep
    parent_bytes = store = 0
    for p in plan.parents.values():  # fp32 weights (the numpy export) + the optimizer state
        if p.child.parent.from_pretrained is not None:  # fp32 weights only
            pm = p.child.model_config(moe="parent")
            parent_bytes += count_params(pm).total * 4 + tied_copy_bytes(pm)
            store += count_params(pm).total * 4 + tied_copy_bytes(pm)
            continue
        pc = p.child.parent_run()
        pm, bf16 = pc.model_config(), bf16_weights(pc, gpus)
        parent_bytes += count_params(pm).total * (12 + 4 * bf16)
        store += count_params(pm).total * (4 + (8 + 4 * bf16) * p.needs_optimizer) + \
            tied_copy_bytes(pm)
    stable_bytes = sum(len(g.steps) * size(g.representative.config)[1]
                       for g in plan.branch_groups.values())
    return DiskEstimate(
        checkpoint_bytes=biggest, params=params,
        bytes_per_param=biggest // params if params else 0, keep=keep,
        trials=plan.num_trials, concurrent=min(plan.num_trials,
                                               spec.max_concurrent or plan.num_trials),
        kept_bytes=keep * plan.num_samples * sum(b for _, b in sizes),
        parent_bytes=parent_bytes, stable_bytes=stable_bytes, object_store_bytes=store)


def _branchable(cfg: TrainConfig) -> bool:
    return cfg.schedule.kind == "wsd" and not (
        cfg.upcycle is not None and cfg.upcycle.lr_policy.policy == "constant")


def _branch_groups(spec: SweepSpec, trials: list[TrialPlan]) -> dict[str, BranchGroup]:
    """Groups of two or more distinct budgets with the same config otherwise (WSD, no
    constant-LR policy)."""
    if not spec.wsd_branches:
        # algorithm=law has the same groups, but trains no stable run up front: its trials
        # extend it on demand
        return {}
    members: dict[str, list[TrialPlan]] = {}
    for t in trials:
        # a stable run trains on one rank; a multi-rank branch re-cuts its checkpoint for its
        # ranks, which ZeRO 1/2 partitions do not allow: those train each budget on its own
        if _branchable(t.config) and (spec.resources.ranks == 1 or
                                      t.config.optim.zero_stage == 0):
            members.setdefault(t.stable_key, []).append(t)
    groups = {}
    for key, ts in members.items():
        starts = {t.config.tokens: t.decay_start for t in ts}
        if len(starts) > 1:
            rep = max(ts, key=lambda t: t.config.tokens)  # first of the largest budget
            groups[key] = BranchGroup(key=key, representative=rep, starts=starts)
    return groups


def extends_stable(spec: SweepSpec, t: TrialPlan) -> bool:
    """An algorithm that trains nothing up front (``Algorithm.trains_up_front``): ``t`` decays from
    its branch group's stable run (keyed by ``t.stable_key``), which the first trial that needs it
    trains, or extends, to ``t``'s decay start (``sweeps.run.parents.extend_stable``); a grid point
    or not, as long as its config branches (WSD with a decay, no constant-LR policy) on one rank."""
    return (not plugin(spec.algorithm).trains_up_front and spec.wsd_branches
            and spec.resources.ranks == 1 and _branchable(t.config)
            and t.decay_start < t.config.steps)


def on_demand_starts(spec: SweepSpec, trials: Iterable[TrialPlan]) -> dict[str, dict[int, int]]:
    """{stable_key: {token budget: decay start}} of those of ``trials`` (a law search's
    candidates, grid points or not) that extend a stable run on demand: where that stable run
    saves a checkpoint as it passes, so no later trial of the group retrains a step."""
    out: dict[str, dict[int, int]] = {}
    for t in trials:
        if extends_stable(spec, t):
            out.setdefault(t.stable_key, {})[t.config.tokens] = t.decay_start
    return out


def build_plan(spec: SweepSpec) -> SweepPlan:
    """The plan of a spec (grid points × num_samples). Building it is the validation of the
    search: every trial config is built here, once (``sweeps.spec.trials.build_configs``)."""
    built = build_configs(spec)
    trials = [plan_trial(spec, pt, built) for pt in spec.space.tune_points()]
    parents: dict[str, ParentPlan] = {}
    for t in trials:
        if t.parent_key is None:
            continue
        p = parents.get(t.parent_key)
        if p is None:
            tokens, flops = 0, 0.0  # a parent.from_pretrained parent: loaded, not trained
            if t.config.parent.from_pretrained is None:
                pc = t.config.parent_run()
                tokens = pc.steps * pc.tokens_per_step
                flops = 6 * count_params(pc.model_config()).non_embedding_active * tokens
            p = ParentPlan(key=t.parent_key, child=t.config, tokens=tokens, flops=flops, trials=0)
        expands = t.config.upcycle is not None and t.config.upcycle.method == "expand_experts"
        parents[t.parent_key] = dataclasses.replace(
            p, trials=p.trials + spec.num_samples, needs_optimizer=p.needs_optimizer or expands)
    index = {point_key(t.point): t for t in reversed(trials)}  # the first of equal points
    return SweepPlan(trials=tuple(trials), parents=parents,
                     branch_groups=_branch_groups(spec, trials), num_samples=spec.num_samples,
                     sampled=tuple(p.key for p in spec.sampled_params()),
                     kernels=experts_kernels(built), _index=index)

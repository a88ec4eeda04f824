"""The cost forecast of ``--dry-run``: GPU-hours, wall time and money, from the throughput table
``sweeps/plan/throughput.json`` (written by ``bench/update_throughput.py``; nobody edits measured
figures by hand). A trial's throughput is measured, scaled or assumed, in that order
(:func:`rate`; docs/preflight-and-cost.md), and every figure says which it used.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moe_core.config import ModelConfig
from moe_core.errors import ConfigError
from moe_core.params import count_params
from sweeps.plan import schedule
from sweeps.plan.resources import parent_ranks

TABLE = Path(__file__).with_name("throughput.json")
ASSUMED_MFU = 0.35
"""Model FLOPs utilisation assumed where no entry on the device was measured."""


@dataclass(frozen=True, slots=True)
class Device:
    name: str
    bf16_tflops: float | None
    """Dense bf16 peak per accelerator (vendor datasheets, no sparsity); None: a CPU."""
    memory_gb: float | None


DEVICES: dict[str, Device] = {
    "h100": Device("NVIDIA H100 SXM", 989.0, 80.0),
    "h200": Device("NVIDIA H200 SXM", 989.0, 141.0),
    "b200": Device("NVIDIA B200", 2250.0, 180.0),
    "a100": Device("NVIDIA A100 SXM 80GB", 312.0, 80.0),
    "a10g": Device("NVIDIA A10G", 70.0, 24.0),
    "l4": Device("NVIDIA L4", 121.0, 24.0),
    "cpu": Device("CPU", None, None),
}


def moe_shape(moe: Any) -> str:
    """``dense``, or ``E{experts}top{K}`` (+ ``s{shared}`` with shared experts): the table's
    MoE-shape key."""
    if moe is None:
        return "dense"
    shared = getattr(moe, "num_shared_experts", 0) or 0
    return f"E{moe.num_experts}top{moe.top_k}" + (f"s{shared}" if shared else "")


def flops_per_token(cfg: ModelConfig, seq: int) -> float:
    """Training FLOPs per token (PaLM App. B): 6·N_active + 6·V·d + 12·L·d·S."""
    n_act = count_params(cfg).non_embedding_active
    return 6.0 * n_act + 6.0 * cfg.vocab_size * cfg.d_model + 12.0 * cfg.n_layer * cfg.d_model * seq


def load_table(path: str | Path = TABLE) -> list[dict[str, Any]]:
    """The throughput entries; a malformed file is one ``ConfigError`` naming it."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"throughput table {path}: {e}") from None
    entries = raw.get("entries") if isinstance(raw, dict) else None
    if not isinstance(entries, list):
        raise ConfigError(f"throughput table {path} must be {{\"entries\": [...]}}")
    need = ("preset", "moe", "device", "tokens_per_s")
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or any(k not in e for k in need):
            raise ConfigError(f"throughput table {path}: entries[{i}] needs {', '.join(need)}")
    return entries


@dataclass(frozen=True, slots=True)
class Rate:
    """A trial's throughput on a device and where it comes from."""

    tokens_per_s: float
    source: str
    """measured | scaled | assumed"""
    note: str
    peak_mem_gb: float | None = None


def _achieved(e: Mapping[str, Any]) -> float | None:
    f = e.get("flops_per_token")
    return float(e["tokens_per_s"]) * float(f) if f else None


def rate(table: Iterable[Mapping[str, Any]], device: str, preset: str, shape: str,
         fpt: float) -> Rate:
    """Tokens/s of one accelerator (or one CPU trial) for ``preset`` × ``shape``: its own
    measured entry, else scaled from the nearest measured one, else ``ASSUMED_MFU`` of the peak."""
    dev = [e for e in table if e["device"] == device]
    for e in dev:  # an entry with measured: null is a placeholder (assumed until measured)
        if e["preset"] == preset and e["moe"] == shape and e.get("measured"):
            m = e["measured"]
            return Rate(float(e["tokens_per_s"]), "measured",
                        f"measured on {m.get('where', '?')} at {m.get('when', '?')}",
                        e.get("peak_mem_gb"))
    measured = [e for e in dev if e.get("measured") and _achieved(e)]
    if measured:
        # the nearest measured entry by FLOPs per token sustains the most similar FLOP/s
        e = min(measured, key=lambda x: abs(math.log(float(x["flops_per_token"]) / fpt)))
        fps = _achieved(e)
        return Rate(fps / fpt, "scaled",
                    f"scaled from {e['preset']} {e['moe']} measured on "
                    f"{e['measured'].get('where', '?')} ({fps / 1e12:.3g} TFLOP/s sustained)")
    d = DEVICES.get(device)
    if d is None or d.bf16_tflops is None:
        raise ConfigError(f"--gpu {device}: no measured throughput and no known peak; use one "
                          f"of {', '.join(k for k, v in DEVICES.items() if v.bf16_tflops)}, or "
                          "measure it (bench/update_throughput.py)")
    return Rate(ASSUMED_MFU * d.bf16_tflops * 1e12 / fpt, "assumed",
                f"assumed ({ASSUMED_MFU * 100:g} % MFU of the {d.name}'s {d.bf16_tflops:g} "
                "TFLOP/s bf16 peak)")


def sustained_tflops(device: str, table: Iterable[Mapping[str, Any]] | None = None
                     ) -> tuple[float, str]:
    """One accelerator's sustained TFLOP/s (``analysis.decide``'s GPU-hours) and its source:
    the best FLOP/s a measured entry on ``device`` reached, else ``ASSUMED_MFU`` of its peak."""
    table = load_table() if table is None else table
    measured = [e for e in table if e["device"] == device and e.get("measured") and
                _achieved(e)]
    if measured:
        e = max(measured, key=_achieved)
        return _achieved(e) / 1e12, (f"measured: {e['preset']} {e['moe']} on "
                                     f"{e['measured'].get('where', '?')}")
    d = DEVICES.get(device)
    if d is None or d.bf16_tflops is None:
        raise ConfigError(f"--gpu {device}: not a known GPU; use one of "
                          f"{', '.join(k for k, v in DEVICES.items() if v.bf16_tflops)}")
    return ASSUMED_MFU * d.bf16_tflops, (f"assumed: {ASSUMED_MFU:.0%} MFU of the {d.name}'s "
                                         f"{d.bf16_tflops:g} TFLOP/s bf16 peak")


def makespan(durations: Iterable[float], slots: int) -> float:
    """Wall time of jobs on ``slots`` parallel slots, longest first onto the least loaded slot
    (Graham's LPT list schedule)."""
    loads = [0.0] * max(1, slots)
    for d in sorted(durations, reverse=True):
        heapq.heapreplace(loads, loads[0] + d)
    return max(loads)


@dataclass(frozen=True, slots=True)
class Job:
    """One thing the sweep trains: a trial, a parent or a WSD stable run."""

    kind: str
    tokens: int
    cfg: ModelConfig
    preset: str
    seq: int
    accelerators: float
    """GPUs (or CPU trials: 1) it holds while it trains."""
    key: str | None = None
    """A parent's key; a trial's parent's key (None: no trained parent)."""


@dataclass(frozen=True, slots=True)
class Forecast:
    device: str
    gpu_hours: float
    wall_h: float
    concurrency: int
    price: float | None
    sources: dict[str, int]
    notes: tuple[str, ...]
    peak_mem_gb: float | None
    reserved_gpus: float = 0.0
    """Accelerators the sweep holds for its whole wall time: ``concurrency`` trials' worth."""
    pre_wall_h: float = 0.0
    """Wall time of the parents and stable runs, before the first trial starts (``policy``
    own_parent: until the last parent is ready)."""
    policy: str = schedule.BARRIER
    """How trials wait for parents (``sweeps.plan.schedule``)."""

    @property
    def cost(self) -> float | None:
        return None if self.price is None else self.gpu_hours * self.price

    @property
    def reserved_gpu_hours(self) -> float:
        return self.reserved_gpus * self.wall_h

    @property
    def idle_share(self) -> float:
        """Share of the reserved GPU-hours (``reserved_gpus`` × wall) no job trains on: the
        GPUs that wait while the parents and stable runs train, and the last wave's tail."""
        r = self.reserved_gpu_hours
        return max(0.0, 1.0 - self.gpu_hours / r) if r > 0 else 0.0

    def lines(self) -> list[str]:
        unit = "CPU-trial-hours" if self.device == "cpu" else f"{self.device.upper()} GPU-hours"
        cost = "" if self.cost is None else f"   cost ${self.cost:,.2f} at ${self.price:g}/h"
        src = ", ".join(f"{n} {k}" for k, n in sorted(self.sources.items()))
        what = "trial slots" if self.device == "cpu" else "GPUs"
        when = (f"each trial starts once its own parent is ready, the last parent after "
                f"{_hours(self.pre_wall_h)}" if self.policy == schedule.OWN_PARENT else
                f"the parents and stable runs train first, for {_hours(self.pre_wall_h)}, "
                "the trials waiting")
        return [f"cost forecast ({self.device}): {self.gpu_hours:,.3g} {unit}   wall "
                f"{_hours(self.wall_h)} at {self.concurrency} concurrent trials{cost}",
                f"  idle: {self.idle_share:.1%} of the {self.reserved_gpu_hours:,.3g} reserved "
                f"{unit} ({self.reserved_gpus:g} {what} × wall; {when})",
                f"  throughput per job: {src} (sweeps/plan/throughput.json)",
                *(f"  {n}" for n in self.notes)]


def _hours(h: float) -> str:
    if h < 1 / 60:
        return f"{h * 3600:.1f} s"
    return f"{h * 60:.1f} min" if h < 1 else f"{h:.2f} h"


def forecast(jobs: list[Job], device: str, *, concurrency: int, parents_parallel: int,
             price: float | None = None, table: list[Mapping[str, Any]] | None = None,
             policy: str = schedule.BARRIER) -> Forecast:
    """GPU-hours (each job's seconds × the accelerators it holds), wall time, cost, and the reserved
    accelerators: ``concurrency`` trials' worth, for the whole wall time (``Forecast.idle_share``).
    Wall time under ``policy`` barrier: the parents and stable runs first, ``parents_parallel`` at
    once, then the trials on ``concurrency`` slots (LPT); under own_parent: ``sweeps.plan.schedule``
    over the reserved accelerators, each trial once its own parent is ready."""
    table = load_table() if table is None else table
    secs: dict[str, list[float]] = {"trial": [], "pre": []}
    tasks: list[schedule.Task] = []
    sources: dict[str, int] = {}
    notes: dict[str, None] = {}
    gpu_s, peak, per_trial = 0.0, None, 1.0
    for i, j in enumerate(jobs):
        r = rate(table, device, j.preset, moe_shape(j.cfg.moe), flops_per_token(j.cfg, j.seq))
        s = j.tokens / (r.tokens_per_s * max(1.0, j.accelerators))  # ranks scale linearly
        secs["trial" if j.kind == "trial" else "pre"].append(s)
        tasks.append(schedule.Task(f"parent:{j.key}" if j.kind == "parent" else f"{j.kind}:{i}",
                                   s, max(1.0, j.accelerators),
                                   f"parent:{j.key}" if j.kind == "trial" and j.key else None))
        if j.kind == "trial":
            per_trial = max(per_trial, j.accelerators)
        gpu_s += s * max(1.0, j.accelerators)
        sources[r.source] = sources.get(r.source, 0) + 1
        notes[f"{j.preset} {moe_shape(j.cfg.moe)}: {r.note}"] = None
        if r.peak_mem_gb is not None:
            peak = max(peak or 0.0, float(r.peak_mem_gb))
    if policy == schedule.OWN_PARENT:
        spans = schedule.schedule(tasks, concurrency * per_trial, policy)
        wall = schedule.makespan(spans)
        pre = max((e for n, (_, e) in spans.items() if not n.startswith("trial:")), default=0.0)
    else:
        pre = makespan(secs["pre"], parents_parallel)
        wall = pre + makespan(secs["trial"], concurrency)
    return Forecast(device, gpu_s / 3600, wall / 3600, concurrency, price, sources,
                    tuple(notes), peak, concurrency * per_trial, pre / 3600, policy)


def _preset(cfg: Any) -> str:
    """The table's preset key of a config: its ``model.preset``, or ``hf:<folder name>`` for a
    ``parent.from_pretrained`` model (never measured: scaled or assumed)."""
    if cfg.parent is not None and cfg.parent.from_pretrained is not None:
        return f"hf:{Path(cfg.parent.from_pretrained).name}"
    return cfg.model.preset


def trial_gpus(spec: Any, device: str) -> float:
    """Accelerators one trial holds: ``resources.gpus`` (at least 1) × ranks; a CPU trial: 1."""
    r = spec.resources
    return 1.0 if device == "cpu" else max(1.0, r.gpus) * r.ranks


def parent_rank_counts(spec: Any, plan: Any, device: str, concurrency: int | None = None
                       ) -> dict[str, int]:
    """Ranks each trained parent of the plan trains on (``sweeps.plan.resources.parent_ranks``):
    ``auto`` fills the GPUs its waiting trials would hold (``concurrency`` trials at most, None:
    every trial at once); on the CPU one rank unless the spec names a number."""
    r, per_trial = spec.resources, trial_gpus(spec, device)
    gpus = 0.0 if device == "cpu" else 1.0 if r.gpus == "auto" else float(r.gpus)
    return {key: parent_ranks(spec, p.child, gpus,
                              min(p.trials, concurrency or p.trials) * per_trial)
            for key, p in plan.parents.items() if p.child.parent.from_pretrained is None}


def jobs_from_plan(spec: Any, plan: Any, device: str, concurrency: int | None = None
                   ) -> list[Job]:
    """What the plan trains: every trial in the order Tune starts them (``plan.trials``, each sample
    of them in turn; a WSD branch only its decay: its stable phase is the group's stable run), each
    trained parent once, each stable run once (per sample). A trial holds :func:`trial_gpus`
    accelerators, a stable run one rank's (``sweeps.plan.resources.task_options``), a parent
    :func:`parent_rank_counts` ranks' (a CPU job counts as one trial slot)."""
    acc = trial_gpus(spec, device)
    task = 1.0 if device == "cpu" else max(1.0, spec.resources.gpus)  # one rank's
    trials = []
    for t in plan.trials:
        tps = t.config.tokens_per_step
        own = t.tokens - (t.decay_start * tps if plan.branch_of(t) is not None else 0)
        trials.append(Job("trial", own, t.config.model_config(), _preset(t.config),
                          t.config.seq_len, acc, t.parent_key))
    jobs = trials * plan.num_samples  # as Tune starts them: every point, then every point again
    for g in plan.branch_groups.values():
        t = g.representative
        jobs += [Job("stable", max(g.starts.values()) * t.config.tokens_per_step,
                     t.config.model_config(), _preset(t.config), t.config.seq_len, task)
                 ] * plan.num_samples
    ranks = parent_rank_counts(spec, plan, device, concurrency)
    for key, p in plan.parents.items():
        if key not in ranks:
            continue  # loaded, not trained
        pc = p.child.parent_run()
        jobs.append(Job("parent", p.tokens, pc.model_config(), _preset(pc), pc.seq_len,
                        task * (1 if device == "cpu" else ranks[key]), key))
    return jobs

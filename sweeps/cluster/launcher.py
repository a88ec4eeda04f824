"""``--dry-run --cluster CONFIG``: a spec checked against a Ray cluster launcher config's node types
(``sweeps/cluster/aws.yaml``, ``gcp.yaml``) without contacting a cloud; each refusal is one line
naming the knob to change. No Ray, no torch. docs/cluster.md lists the checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from moe_core.errors import SearchSpaceError
from sweeps.plan.build import SweepPlan, disk_estimate
from sweeps.plan.preflight import Problem, human_bytes, max_trial_memory

GIB = 1024 ** 3


@dataclass(frozen=True)
class Instance:
    cpus: int
    memory_gib: float
    gpus: int = 0
    gpu: str | None = None
    """The GPU type (``sweeps.plan.cost.DEVICES`` key where it has one)."""
    gpu_memory_gb: float = 0.0


INSTANCES: dict[str, Instance] = {
    # AWS (aws.amazon.com/ec2/instance-types)
    "p5.48xlarge": Instance(192, 2048, 8, "h100", 80),
    "p5e.48xlarge": Instance(192, 2048, 8, "h200", 141),
    "p4d.24xlarge": Instance(96, 1152, 8, "a100", 40),
    "p4de.24xlarge": Instance(96, 1152, 8, "a100", 80),
    "g6e.xlarge": Instance(4, 32, 1, "l40s", 48),
    "g6.xlarge": Instance(4, 16, 1, "l4", 24),
    "g5.xlarge": Instance(4, 16, 1, "a10g", 24),
    "m7i.2xlarge": Instance(8, 32),
    # GCP (cloud.google.com/compute/docs/gpus, accelerator-optimized machines)
    "a3-highgpu-8g": Instance(208, 1872, 8, "h100", 80),
    "a3-megagpu-8g": Instance(208, 1872, 8, "h100", 80),
    "a2-highgpu-1g": Instance(12, 85, 1, "a100", 40),
    "a2-highgpu-8g": Instance(96, 680, 8, "a100", 40),
    "a2-ultragpu-8g": Instance(96, 1360, 8, "a100", 80),
    "g2-standard-8": Instance(8, 32, 1, "l4", 24),
    "n2-standard-8": Instance(8, 32),
}


@dataclass(frozen=True)
class NodeType:
    name: str
    instance: str
    cpus: float
    gpus: float
    gpu: str | None
    gpu_memory_gb: float
    memory_bytes: float
    disk_bytes: float | None
    max_workers: int
    custom: Mapping[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        gpu = f"{self.gpus:g}×{self.gpu} {self.gpu_memory_gb:g} GB, " if self.gpus else ""
        disk = f", disk {human_bytes(self.disk_bytes)}" if self.disk_bytes else ""
        return (f"{self.name} ({self.instance}: {gpu}{self.cpus:g} CPUs, "
                f"{human_bytes(self.memory_bytes)}{disk})")


def _disk(cfg: Mapping[str, Any]) -> float | None:
    for m in cfg.get("BlockDeviceMappings") or []:
        size = (m.get("Ebs") or {}).get("VolumeSize")
        if size:
            return float(size) * GIB
    for d in cfg.get("disks") or []:
        size = (d.get("initializeParams") or {}).get("diskSizeGb")
        if size and d.get("boot", True):
            return float(size) * 1e9
    return None


def _node_type(path: str, name: str, body: Mapping[str, Any]) -> NodeType:
    cfg = body.get("node_config") or {}
    kind = cfg.get("InstanceType") or cfg.get("machineType")
    res = dict(body.get("resources") or {})
    inst = INSTANCES.get(str(kind))
    if inst is None and not {"CPU", "GPU"} <= set(res):
        raise SearchSpaceError(
            f"--cluster {path}: node type {name} is {kind!r}, not a known instance type "
            f"({', '.join(sorted(INSTANCES))}); give its resources: {{CPU: n, GPU: n}} in the "
            "config")
    inst = inst or Instance(0, 0)
    return NodeType(
        name=name, instance=str(kind), cpus=float(res.pop("CPU", inst.cpus)),
        gpus=float(res.pop("GPU", inst.gpus)), gpu=inst.gpu, gpu_memory_gb=inst.gpu_memory_gb,
        memory_bytes=float(res.pop("memory", inst.memory_gib * GIB)), disk_bytes=_disk(cfg),
        max_workers=int(body.get("max_workers", 0) or 0),
        custom={k: float(v) for k, v in res.items() if k != "object_store_memory"})


def read_launcher(path: str) -> list[NodeType]:
    """The node types of a Ray cluster launcher YAML; one line naming what is wrong."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        why = " ".join(str(e).split())[:200]
        raise SearchSpaceError(f"--cluster {path}: cannot read it ({why})") from None
    types = raw.get("available_node_types") if isinstance(raw, dict) else None
    if not isinstance(types, dict) or not types:
        raise SearchSpaceError(
            f"--cluster {path}: not a Ray cluster launcher config (no available_node_types); "
            "give sweeps/cluster/aws.yaml, gcp.yaml or your own; a KubeRay cluster is checked "
            "once running, with --dry-run --address")
    head = raw.get("head_node_type")
    out = [_node_type(path, n, b or {}) for n, b in types.items()]
    return [replace(t, max_workers=t.max_workers + 1) if t.name == head else t for t in out]


def ray_nodes(types: list[NodeType]) -> list[dict[str, float]]:
    """One Ray resources mapping per node type (``sweeps.plan.preflight.check_cluster``'s form)."""
    return [{"CPU": t.cpus, "GPU": t.gpus, "memory": t.memory_bytes, **t.custom} for t in types]


def per_node(spec: Any, t: NodeType) -> int:
    """How many trials one node of type ``t`` holds at once (a resolved spec)."""
    r = spec.resources
    fits = [t.cpus // (r.cpus * r.ranks) if r.cpus else 10 ** 6]
    if r.gpus:
        fits.append(t.gpus // (r.gpus * r.ranks))
    return int(min(fits))


def check_launcher(spec: Any, plan: SweepPlan, types: list[NodeType],
                   where: str) -> tuple[list[Problem], list[str]]:
    """(problems, report lines) of a resolved spec on the node types of ``where`` (custom
    resources such as ``trial_driver``: ``sweeps.plan.preflight.check_cluster`` on
    :func:`ray_nodes`)."""
    r = spec.resources
    need = f"{r.ranks} rank{'s' * (r.ranks > 1)} × ({r.gpus:g} GPU, {r.cpus:g} CPUs)"
    fit = [(t, per_node(spec, t)) for t in types]
    fit = [(t, n) for t, n in fit if n >= 1]
    if not fit:
        big = max(types, key=lambda t: (t.gpus, t.cpus))
        knob = "resources.ranks" if r.ranks > 1 else "resources.gpus"
        return [Problem(knob, f"one trial needs {need} on one node but the largest node type of "
                        f"{where} is {big.describe()}; lower {knob} / resources.cpus or add a "
                        "larger node type")], []
    out, lines = [], []
    mem = max_trial_memory(spec, plan)
    if r.ranks > 1 and any(t.config.moe is not None for t in plan.trials):
        mem //= r.ranks  # experts and ZeRO state spread over the ranks (as check_capacity)
    d = disk_estimate(spec, plan)
    ckpt = d.checkpoint_bytes * (spec.checkpoint.keep + 2)  # kept + being saved + local copy
    total = 0
    for t, n in fit:
        if r.gpus and t.gpu_memory_gb and mem > t.gpu_memory_gb * 1e9 * min(r.gpus, 1.0):
            out.append(Problem("base.batch.micro_batch", f"one trial needs about "
                               f"{human_bytes(mem)} per GPU (estimate) but {t.describe()} has "
                               f"{t.gpu_memory_gb:g} GB per GPU; lower batch.micro_batch or "
                               "raise resources.ranks"))
        if t.disk_bytes and n * ckpt + d.parent_bytes > t.disk_bytes:
            out.append(Problem("checkpoint.keep", f"{n} trial(s) on a {t.instance} node write "
                               f"about {human_bytes(n * ckpt + d.parent_bytes)} of checkpoints "
                               f"and parents but its disk is {human_bytes(t.disk_bytes)}; lower "
                               f"checkpoint.keep or raise the disk of {t.name}"))
        total += n * t.max_workers
        lines.append(f"cluster {where}: {t.describe()}: {n} trial(s) of {need} per node, "
                     f"≤{t.max_workers} node(s)")
    want = spec.max_concurrent
    lines.append(f"cluster {where}: at most {total} trial(s) at once"
                 + (f" (max_concurrent {want})" if want else ""))
    if want and want > total:
        out.append(Problem("max_concurrent", f"max_concurrent={want} but at most {total} trial(s) "
                           f"fit at once on {where}; set max_concurrent: {total} or raise "
                           "max_workers of its GPU node type"))
    return out, lines


def cluster_gpu(types: list[NodeType]) -> str | None:
    """The GPU type of the node type with the most GPUs (the forecast's ``--gpu`` default)."""
    gpu = max(types, key=lambda t: t.gpus)
    return gpu.gpu if gpu.gpus else None

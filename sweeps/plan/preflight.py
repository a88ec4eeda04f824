"""Checks run by ``--dry-run`` and before every launch: mistakes that would otherwise surface only
inside trials (after minutes, on GPU nodes started for nothing). Each failure is one line naming
the spec's YAML key and the fix (:class:`Problem`; the table in docs/preflight-and-cost.md). No
Ray, no torch work here: it reads file headers only.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from safetensors import safe_open

from moe_core.data.config import _hf_vocab_size
from moe_core.errors import ConfigError, SearchSpaceError, one_line
from moe_core.hf_config import weight_files
from moe_core.location import is_url, join_uri, local_form
from sweeps.plan import resources
from sweeps.plan.build import DiskEstimate, SweepPlan, disk_estimate
from sweeps.plan.cost import DEVICES, parent_rank_counts
from sweeps.plan.memory import (  # noqa: F401 (RUNTIME_BYTES, trial_memory_bytes re-exported)
    RUNTIME_BYTES,
    fits_line,
    memory_fixes,
    model_memory_bytes,
    trial_memory_bytes,
)
from sweeps.run.console import human_bytes
from sweeps.spec.sweep import SweepSpec
from sweeps.store.storage import probe


def resolved(spec: SweepSpec, nodes: Iterable[Mapping[str, float]] | None = None) -> SweepSpec:
    """``spec`` with ``resources.gpus: auto`` as it will resolve: on ``nodes`` (a cluster's),
    else on this machine (``sweeps.plan.resources``)."""
    if spec.resources.gpus != resources.AUTO:
        return spec
    nodes = list(nodes or [])
    return resources.resolve(spec, {"GPU": sum(n.get("GPU", 0) for n in nodes)} if nodes
                             else resources.local_cluster())


@dataclass(frozen=True, slots=True)
class Problem:
    key: str
    """The spec's YAML key (``base.data.path``, ``search.data.path``, ``resources.gpus``)."""
    message: str
    fatal: bool = True

    def line(self) -> str:
        return f"{'error' if self.fatal else 'warning'}: {self.key}: {one_line(self.message)}"


def spec_key(spec: SweepSpec, key: str) -> str:
    """Where a config key is set in the spec: ``search.<key>`` when it is searched."""
    return f"search.{key}" if any(p.key == key for p in spec.search) else f"base.{key}"


def _configs(plan: SweepPlan) -> list[Any]:
    """Every distinct trial config of the plan (the parents' share the trials' data)."""
    out: dict[str, Any] = {}
    for t in plan.trials:
        out.setdefault(json.dumps(t.config.to_dict(), sort_keys=True, default=str), t.config)
    return list(out.values())


def _readable(p: Path) -> str | None:
    """Why ``p`` cannot be read, or None."""
    if not p.exists():
        return "does not exist"
    if not os.access(p, os.R_OK) or (p.is_dir() and not os.access(p, os.X_OK)):
        return "is not readable (check its permissions)"
    return None


def check_data(spec: SweepSpec, cfg: Any) -> list[Problem]:
    d, out = cfg.data, []
    if d.source in ("tokens", "text"):
        k, p = spec_key(spec, "data.path"), Path(d.path)
        why = _readable(p)
        if why:
            want = ("token file (.bin) or a folder with train.bin and val.bin"
                    if d.source == "tokens" else ".txt file or folder")
            return [Problem(k, f"{d.path} {why}; give the {want} (a relative path is read from "
                            "where sweeps.run starts)")]
        if d.source == "tokens" and p.is_dir():
            for f in ("train.bin", "val.bin"):
                why = _readable(p / f)
                if why:
                    out.append(Problem(k, f"{p / f} {why}; a token folder holds train.bin and "
                                       "val.bin (or give one .bin file)"))
        if d.source == "text" and p.is_dir() and not any(p.rglob("*.txt")):
            out.append(Problem(k, f"{p} has no .txt files; give a .txt file or a folder of them"))
    if d.hf_tokenizer:
        why = _readable(d.tokenizer_file)
        if why:
            out.append(Problem(spec_key(spec, "data.tokenizer"), f"{d.tokenizer_file} {why}; "
                               "give bytes, bpe or a folder holding tokenizer.json"))
    return out


MAX_SCAN = 1 << 31
"""Token files up to this many bytes are scanned for their largest id (vocabulary check)."""


@functools.lru_cache(maxsize=16)
def _st_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape from the safetensors headers (no tensor data read)."""
    shapes = {}
    for f in weight_files(folder):
        with safe_open(str(f), "pt") as h:
            for k in h.keys():  # noqa: SIM118 - safe_open has keys(), not __iter__
                shapes[k] = tuple(h.get_slice(k).get_shape())
    return shapes


def check_pretrained(spec: SweepSpec, cfg: Any) -> list[Problem]:
    """The checkpoint's weight files against its config.json (embedding, layers, head) and its
    vocabulary against the tokenizer's."""
    src = cfg.parent.from_pretrained
    k = spec_key(spec, "parent.from_pretrained")
    try:
        model = cfg.model_config()
        shapes = _st_shapes(Path(src))
    except (ConfigError, OSError) as e:
        return [Problem(k, f"{src}: {e}")]
    except Exception as e:  # noqa: BLE001 - a corrupt safetensors header, in one line
        return [Problem(k, f"{src}: its safetensors cannot be read ({type(e).__name__}: {e})")]
    out = []
    emb = shapes.get("model.embed_tokens.weight")
    want = (model.vocab_size, model.d_model)
    if emb != want:
        out.append(Problem(k, f"{src}: model.embed_tokens.weight is {emb} but config.json "
                           f"implies {want}; the weight files do not match config.json"))
    layers = {int(n.split(".")[2]) for n in shapes if n.startswith("model.layers.")}
    if layers != set(range(model.n_layer)):
        out.append(Problem(k, f"{src}: the weight files hold {len(layers)} layers, config.json "
                           f"says num_hidden_layers={model.n_layer}"))
    if not model.tie_embeddings and "lm_head.weight" not in shapes:
        out.append(Problem(k, f"{src}: no lm_head.weight and tie_word_embeddings is false"))
    out += check_vocab(spec, cfg, model.vocab_size, Path(src))
    return out


def _data_vocab(d: Any) -> tuple[int | None, str]:
    """(the largest token id + 1 the data can hold, what sets it)."""
    if d.source == "tokens":
        if d.token_vocab_size:
            return d.token_vocab_size, f"data.token_vocab_size={d.token_vocab_size}"
        p = Path(d.path)
        files = [p / "train.bin", p / "val.bin"] if p.is_dir() else [p]
        if not all(f.is_file() for f in files) or sum(f.stat().st_size for f in files) > MAX_SCAN:
            return None, ""  # too large to scan here: the trial finds max + 1 itself
        try:
            top = max(int(np.memmap(f, dtype=d.dtype, mode="r").max(initial=0)) for f in files)
        except (ValueError, OSError):  # an empty or odd-sized file: the trial says why
            return None, ""
        return top + 1, f"the largest token id in data.path ({top})"
    if d.source == "synthetic":
        return d.synthetic_vocab, f"data.synthetic_vocab={d.synthetic_vocab}"
    if d.hf_tokenizer:
        return _hf_vocab_size(str(d.tokenizer_file)), f"data.tokenizer={d.tokenizer}"
    if d.tokenizer == "bytes":
        return 256, "data.tokenizer=bytes (256 ids)"
    return d.bpe_vocab_size, f"data.bpe_vocab_size={d.bpe_vocab_size}"


def check_vocab(spec: SweepSpec, cfg: Any, model_vocab: int, ckpt: Path) -> list[Problem]:
    """The tokenizer's ids must index the checkpoint's embedding; a checkpoint that ships its own
    tokenizer and a spec that tokenizes otherwise is flagged (its ids would mean other tokens)."""
    n, what = _data_vocab(cfg.data)
    key = spec_key(spec, "data.tokenizer")
    if n is not None and n > model_vocab:
        return [Problem(key, f"{what} gives {n:,} token ids but the parent.from_pretrained "
                        f"checkpoint's embedding has {model_vocab:,} rows; use the checkpoint's "
                        f"tokenizer (data.tokenizer: {ckpt})")]
    own = ckpt / "tokenizer.json"
    mine = cfg.data.tokenizer_file.resolve() if cfg.data.hf_tokenizer else None
    if own.is_file() and cfg.data.source in ("text", "stdlib") and mine != own.resolve():
        return [Problem(key, f"{what} differs from the tokenizer {ckpt} ships "
                        f"(tokenizer.json): the checkpoint's embedding rows mean its own "
                        f"tokens; set data.tokenizer: {ckpt} unless this is intended",
                        fatal=False)]
    return []


def check_calibration(spec: SweepSpec) -> list[Problem]:
    c = spec.asha.calibration
    if not (spec.scheduler == "asha" and spec.asha.rung_metric and c):
        return []
    p = Path(c)
    why = _readable(p)
    if why is None and p.is_dir() and not (p / "results.parquet").is_file():
        why = "holds no results.parquet"
    return [Problem("scheduler.calibration", f"{c} {why}; give the results.parquet (or the "
                    "sweep folder) of finished WSD runs")] if why else []


def _existing_parent(p: Path) -> Path:
    p = p.resolve()
    while not p.exists():
        p = p.parent
    return p


def check_results_dir(spec: SweepSpec) -> list[Problem]:
    """The results folder and a shared parent cache (``storage.parent_cache``) can be written;
    on object storage a HEAD on the bucket and a probe write and delete with the credential
    chain the nodes use (``moe_core.location.probe``: one attempt, a short timeout)."""
    out = []
    for key, path, fix in (("results", spec.results, "--results DIR"),
                           ("storage.parent_cache", spec.storage.parent_cache, "another folder")):
        if path is None:
            continue
        if "://" in str(path):
            try:
                probe(str(path), key)
            except ConfigError as e:
                out.append(Problem(key, str(e).removeprefix(f"{key}=")))
            continue
        root = _existing_parent(Path(path))
        if not os.access(root, os.W_OK | os.X_OK):
            out.append(Problem(key, f"{root} is not writable; give a folder you can write "
                               f"({fix})"))
    return out


NODE_LOCAL_FS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "bcachefs",
                           "jfs", "reiserfs", "vfat", "exfat", "ntfs", "ntfs3", "tmpfs", "ramfs",
                           "overlay", "squashfs"})
"""Filesystem types (``/proc/mounts``) that live on one machine: another node does not see a
folder on them. Any other type (nfs, lustre, gpfs, cephfs, a FUSE-mounted bucket...) is taken
as shared."""


def mount_type(path: str, mounts: str) -> str | None:
    """Type of the filesystem holding the absolute ``path``: that of the longest mount point
    above it in ``mounts`` (``/proc/mounts``' text); None where no line is above it."""
    best, kind = -1, None
    for line in mounts.splitlines():
        f = line.split()
        if len(f) < 3:
            continue
        point = f[1].replace("\\040", " ")
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= best:
            best, kind = len(point), f[2]  # a later mount on the same point hides the earlier
    return kind


def fs_type(path: Path) -> str | None:
    """Type of the filesystem that holds ``path`` (its nearest existing folder, resolved), or
    None where it is unknown (no ``/proc/mounts``: not Linux)."""
    try:
        mounts = Path("/proc/mounts").read_text()
    except OSError:
        return None
    return mount_type(str(_existing_parent(path)), mounts)


def hosts_of(nodes: Iterable[Mapping[str, float]]) -> int:
    """Machines among Ray nodes (``ray.nodes()``' resources: one ``node:IP`` key each), so that
    the local fake cluster's raylets, all on 127.0.0.1, count as one."""
    return len({k for n in nodes for k in n
                if k.startswith("node:") and k != "node:__internal_head__"})


def check_parent_cache(cache: str, hosts: int, ranks: int, fstype: str | None) -> list[Problem]:
    """A parent trained on ``ranks`` > 1 ranks (``resources.parent_ranks``) writes itself into
    the parent cache from its rank 0, and the parent's task, maybe on another node, reads it back
    from there: on ``hosts`` > 1 machines a cache folder on a node-local filesystem (``fstype``,
    :data:`NODE_LOCAL_FS`) is refused; a bucket or shared storage passes."""
    if ranks <= 1 or hosts <= 1 or is_url(cache) or fstype not in NODE_LOCAL_FS:
        return []
    return [Problem("storage.parent_cache", f"{cache} is on this node's own disk ({fstype}) but "
                    f"parents train on {ranks} ranks on a cluster of {hosts} machines: rank 0 "
                    "writes the parent there and its task reads it back, maybe on another "
                    "node; set storage.parent_cache (default <results>/parents) to a bucket "
                    "(s3://..., gs://...) or a folder every node mounts (NFS, Lustre), or "
                    "resources.parent_ranks: 1")]


def parent_cache_problems(cache: str, hosts: int, ranks: int) -> list[Problem]:
    """:func:`check_parent_cache` of ``cache`` (a bucket URL or a local folder, whose
    filesystem type is read here), for ``--dry-run`` and the driver once connected."""
    return check_parent_cache(cache, hosts, ranks, None if is_url(cache) else fs_type(Path(cache)))


def check_capacity(spec: SweepSpec, plan: SweepPlan, *, gpu: str | None = None,
                   concurrent: int | None = None, free_disk: int | None = None,
                   host_memory: int | None = None) -> list[Problem]:
    """Disk (checkpoints while running + kept + parents + stable runs) against the free space
    under ``results``; one trial's memory against the accelerator's (``gpu``, or CUDA here)
    or, for CPU trials, ``concurrent`` trials (each ``resources.ranks`` processes) against the
    host's memory. A refusal names the knobs that make the sweep fit, with the figure each
    gives (``sweeps.plan.memory.memory_fixes``, :func:`disk_fixes`)."""
    spec = resolved(spec)
    out = []
    d = disk_estimate(spec, plan)
    need = disk_need(d)
    on_disk = "://" not in str(spec.results)  # object storage: no free-space figure to check
    if free_disk is None and on_disk:
        free_disk = shutil.disk_usage(_existing_parent(spec.results_dir)).free
    if on_disk and need > free_disk:
        out.append(Problem("results", f"the sweep needs about {human_bytes(need)} of disk "
                           f"(checkpoints, parents, stable runs) but "
                           f"{_existing_parent(spec.results_dir)} has {human_bytes(free_disk)} "
                           f"free; {fits_line(disk_fixes(d, free_disk))}, or point results at "
                           "larger storage"))
    if spec.resources.gpus > 0 or gpu:
        return out + _device_capacity(spec, plan, gpu)
    r, mem, n, host = _cpu_load(spec, plan, concurrent, host_memory)
    if host and mem * n * r > host:
        fixes = memory_fixes(_configs(plan), spec.resources.gpus, r, n, host)
        out.append(Problem("max_concurrent", f"{n} concurrent CPU trials need about "
                           f"{human_bytes(mem * n * r)} (estimate, {human_bytes(mem)} each"
                           f"{f' × {r} ranks' if r > 1 else ''}) but this machine has "
                           f"{human_bytes(host)}; {fits_line(fixes)}"))
    return out


def _cpu_load(spec: SweepSpec, plan: SweepPlan, concurrent: int | None,
              host_memory: int | None) -> tuple[int, int, int, int]:
    """(ranks per trial, one rank's peak RSS, concurrent trials, the host's memory)."""
    r = spec.resources.ranks
    n = concurrent or min(plan.num_trials, spec.max_concurrent or plan.num_trials)
    host = host_memory if host_memory is not None else psutil.virtual_memory().total
    return r, max_trial_memory(spec, plan, ranks=r), n, host


def memory_line(spec: SweepSpec, plan: SweepPlan, concurrent: int | None = None,
                host_memory: int | None = None) -> str:
    """The memory estimate ``--dry-run`` prints (the figure :func:`check_capacity` checks):
    CPU trials, one trial's peak RSS and ``concurrent`` of them against the host's memory;
    accelerator trials, one trial's device memory."""
    if resolved(spec).resources.gpus > 0:
        return (f"memory (estimate): {human_bytes(max_trial_memory(spec, plan, device=True))} "
                "of accelerator memory per trial")
    r, mem, n, host = _cpu_load(spec, plan, concurrent, host_memory)
    return (f"memory (estimate): peak RSS {human_bytes(mem)} per CPU trial"
            f"{f' rank × {r} ranks' if r > 1 else ''}; {human_bytes(mem * n * r)} at {n} "
            f"concurrent (max_concurrent); this machine has "
            f"{human_bytes(host) if host else 'an unknown amount'}")


def _device_capacity(spec: SweepSpec, plan: SweepPlan, gpu: str | None) -> list[Problem]:
    """One trial's accelerator memory against the ``gpu``'s (a share of it)."""
    mem = max_trial_memory(spec, plan, device=True)
    dev = DEVICES.get(gpu or "")
    cap = dev.memory_gb * 1e9 if dev and dev.memory_gb else None
    if cap is None:
        return []
    share = spec.resources.gpus if 0 < spec.resources.gpus < 1 else 1.0
    if spec.resources.ranks > 1 and any(c.moe is not None for c in _configs(plan)):
        mem = mem // spec.resources.ranks  # experts and ZeRO state spread over the ranks
    if mem <= cap * share:
        return []
    fixes = memory_fixes(_configs(plan), spec.resources.gpus, 1, 1, cap * share,
                         estimate=model_memory_bytes)
    return [Problem("resources.gpus", f"one trial needs about {human_bytes(mem)} (estimate) but "
                    f"a {dev.name} share of {share:g} has {human_bytes(cap * share)}; "
                    f"{fits_line(fixes)}, or use more resources.ranks or a larger GPU")]


def disk_need(d: DiskEstimate) -> int:
    """The disk a sweep needs at its peak (every term of ``d`` but the object store's)."""
    return d.running_bytes + d.kept_bytes + d.parent_bytes + d.stable_bytes


def disk_fixes(d: DiskEstimate, free: float) -> list[str]:
    """``checkpoint.keep`` and ``max_concurrent`` values that make ``d`` fit ``free`` bytes,
    each with the disk it then needs (the largest that fits)."""
    out = []
    for keep in range(d.keep - 1, 0, -1):
        alt = dataclasses.replace(d, keep=keep, kept_bytes=d.kept_bytes * keep // d.keep)
        if disk_need(alt) <= free:
            out.append(f"checkpoint.keep: {keep} ({human_bytes(disk_need(alt))})")
            break
    for conc in range(d.concurrent - 1, 0, -1):
        alt = dataclasses.replace(d, concurrent=conc)
        if disk_need(alt) <= free:
            out.append(f"max_concurrent: {conc} ({human_bytes(disk_need(alt))})")
            break
    return out


def custom_resources(spec: SweepSpec) -> dict[str, float]:
    """Custom resources each Tune trial's bundle (its driver) asks for: ``resources.trial_driver``
    adds the resource of that name (on the cluster configs, only on-demand nodes have it)."""
    t = spec.resources.trial_driver
    return {"trial_driver": float(t)} if t else {}


def trial_bundle(spec: SweepSpec) -> dict[str, float]:
    """The resources each Tune trial (its driver) asks Ray for (``sweeps.run.driver``'s bundle)."""
    r = resolved(spec).resources
    b = {"CPU": r.cpus, "GPU": r.gpus} if r.ranks == 1 else {"CPU": 0.0}
    return {**b, **custom_resources(spec)}


def max_trial_memory(spec: SweepSpec, plan: SweepPlan, device: bool = False,
                     ranks: int = 1) -> int:
    """The largest per-trial memory estimate of the plan (:func:`trial_memory_bytes`; with
    ``device``, the accelerator's part only: no runtime, no parent copy on the host), one
    rank's with ZeRO-1/2 state split over ``ranks``."""
    gpus = resolved(spec).resources.gpus
    est = model_memory_bytes if device else trial_memory_bytes
    return max((est(c, gpus, ranks) for c in _configs(plan)), default=0)


def check_cluster(spec: SweepSpec, nodes: Iterable[Mapping[str, float]],
                  where: str = "the Ray cluster", fit: bool = True,
                  trial_bytes: int | None = None) -> list[Problem]:
    """Each custom resource a trial asks for exists on some node, (``trial_bytes``, CPU trials)
    some node's memory holds one trial, and (``fit``: a fixed set of nodes, not an autoscaling
    cluster that may add larger ones) some node can hold a whole trial bundle (``nodes``: each
    alive node's total resources, as ``ray.nodes()`` reports)."""
    nodes = [dict(n) for n in nodes]
    spec = resolved(spec, nodes)
    bundle = {k: v for k, v in trial_bundle(spec).items() if v}
    out = []
    biggest = max((n.get("memory", 0) for n in nodes), default=0)
    if trial_bytes and spec.resources.gpus == 0 and biggest and trial_bytes > biggest:
        out.append(Problem("resources", f"one CPU trial needs about {human_bytes(trial_bytes)} "
                           f"(estimate) but the largest node of {where} has "
                           f"{human_bytes(biggest)} of memory for Ray; lower "
                           "batch.micro_batch or use larger nodes"))
    for k, v in bundle.items():
        if k in ("CPU", "GPU"):
            continue
        if not any(n.get(k, 0) >= v for n in nodes):
            out.append(Problem(f"resources.{k}", f"trials ask for the custom resource {k}={v:g}"
                               f" but no node of {where} has it; start its on-demand nodes with "
                               f"--resources='{{\"{k}\": 8}}' (sweeps/cluster/*.yaml do), or "
                               f"drop resources.{k}"))
    if out or not fit:
        return out
    if not any(all(n.get(k, 0) >= v for k, v in bundle.items()) for n in nodes):
        have = "; ".join(", ".join(f"{k}={n.get(k, 0):g}" for k in bundle) for n in nodes)
        out.append(Problem("resources", f"no node of {where} can hold one trial ("
                           f"{', '.join(f'{k}={v:g}' for k, v in bundle.items())}); nodes have "
                           f"{have}; lower resources.cpus / gpus or add a larger node"))
    return out


def run_checks(spec: SweepSpec, plan: SweepPlan, *, gpu: str | None = None,
               concurrent: int | None = None, nodes: list[Mapping[str, float]] | None = None,
               local: bool = True, hosts: int | None = None) -> list[Problem]:
    """Every check. ``nodes``: a connected cluster's (``--dry-run --address``); ``hosts``: the
    machines the sweep runs on (None: counted in ``nodes``); ``local``: the sweep runs on this
    machine (no ``--address``), whose memory bounds CPU trials and which has no custom resources;
    neither: a launch on a cluster, checked once connected (``sweeps.run.driver``).
    ``resources.gpus: auto`` is checked as it will resolve: on ``nodes``, else on this machine."""
    spec = resolved(spec, nodes)
    out = check_results_dir(spec) + check_calibration(spec)
    found: dict[tuple[str, str], Problem] = {}
    for cfg in _configs(plan):
        pretrained = cfg.parent is not None and cfg.parent.from_pretrained is not None
        for p in check_data(spec, cfg) + (check_pretrained(spec, cfg) if pretrained else []):
            found.setdefault((p.key, p.message), p)
    out += found.values()
    if not any(p.fatal for p in out):  # sizes only mean something once the files are there
        out += check_capacity(spec, plan, gpu=gpu, concurrent=concurrent,
                              host_memory=None if local else 0)
    if nodes is not None:
        out += check_cluster(spec, nodes, fit=False, trial_bytes=max_trial_memory(spec, plan))
    hosts = hosts_of(nodes) if hosts is None and nodes is not None else hosts
    if hosts and hosts > 1:
        ranks = parent_rank_counts(spec, plan, "cpu" if spec.resources.gpus == 0 else "gpu",
                                   concurrent)
        # the parents' cache: storage.parent_cache, else <results>/<sweep>/parents (as the driver)
        cache = spec.storage.parent_cache or join_uri(spec.results_uri, "parents")
        out += parent_cache_problems(local_form(cache, "storage.parent_cache"), hosts,
                                     max(ranks.values(), default=1))
    elif local and spec.resources.trial_driver:
        out += check_cluster(spec, [{"CPU": os.cpu_count() or 1}], "this machine (no --address)")
    return out


def enforce(problems: list[Problem], emit: Any) -> None:
    """One line per problem: warnings and all fatal problems but the last through ``emit``; the
    last fatal one is raised (the command line prints it as its ``error:`` line)."""
    fatal = [p for p in problems if p.fatal]
    for p in problems:
        if not fatal or p is not fatal[-1]:
            emit(p.line())
    if fatal:
        raise SearchSpaceError(f"{fatal[-1].key}: {fatal[-1].message}")


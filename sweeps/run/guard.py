"""One run per results folder (:func:`held`), a resume that runs what it says
(:func:`check_resume_spec`), and checks before anything moves (:func:`preflight`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from moe_core.errors import SearchSpaceError, UpcycleError, shown
from moe_core.hf_config import check_checkpoint
from moe_core.outdir import confined
from sweeps.run.curves import load_calibration
from sweeps.spec.algorithm import settings_records
from sweeps.store.lease import (  # noqa: F401 - the holder record, shared with the lease
    LOCK_FILE,
    FolderInUseError,
    ObjectRunLock,
    describe_holder,
    holder_info,
)
from sweeps.store.storage import Location, staging_for
from sweeps.store.trust import UntrustedStateError

SPEC_FILE = "spec.json"
WRITER_DIRS = ("export", "parents", "rows", "parts", "tune", "stable", "train", "previous",
               "wandb")
"""Folders under ``results/<sweep>/`` the run writes into (checked by :func:`preflight`)."""
STAGING_DIRS = ("wandb", "rank_checkpoints")
"""Folders of the local staging folder (``sweeps.store.storage.staging_dir``) of a run whose
results go to object storage: W&B's files and the ranks' checkpoints are written there."""


class RunLock(Protocol):
    def acquire(self) -> str | None: ...  # a takeover message, or None
    def release(self) -> None: ...


class LocalRunLock:
    """``flock`` on ``<folder>/.run.lock`` (its content: the holder as JSON)."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder) / LOCK_FILE
        self.fd: int | None = None

    def _read(self) -> dict[str, Any]:
        try:
            d = json.loads(self.path.read_text()[:4096] or "{}")
            return d if isinstance(d, dict) else {}
        except (OSError, ValueError):
            return {}

    def acquire(self) -> str | None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise FolderInUseError(
                f"{self.path.parent} is in use by another run ({describe_holder(self._read())}); "
                "wait for it to end or stop it, or give this run another --results folder"
            ) from None
        old = self._read()
        me = holder_info()
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        os.fsync(fd)
        self.fd = fd
        if old.get("pid") and not old.get("released"):  # its holder died holding it
            return (f"took over the lock of {self.path.parent} from {describe_holder(old)}, "
                    f"which is gone")
        return None

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, (json.dumps({**holder_info(), "released": True}) + "\n")
                      .encode(), 0)
        finally:
            os.close(self.fd)  # drops the flock
            self.fd = None


LOCKS: dict[str, Callable[[str], RunLock]] = {"s3": ObjectRunLock, "gs": ObjectRunLock}
"""URL scheme → lock class for results on object storage."""


def run_lock(folder: str | Path) -> RunLock:
    """The lock for a results folder: :class:`LocalRunLock`, or the one registered for its URL
    scheme."""
    s = str(folder)
    if "://" in s:
        scheme = s.split("://", 1)[0]
        if scheme not in LOCKS:
            raise UpcycleError(f"results {s}: no run lock for {scheme}:// storage")
        return LOCKS[scheme](s)
    return LocalRunLock(folder)


@contextlib.contextmanager
def held(folder: str | Path, say: Callable[[str], None] = print) -> Iterator[RunLock]:
    """:func:`run_lock` held for the block (its takeover message passed to ``say``)."""
    lock = run_lock(folder)
    msg = lock.acquire()
    if msg:
        say(msg)
    try:
        yield lock
    finally:
        lock.release()


LOCAL_RAY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch for single-machine Ray (its default on Windows and macOS): with it off, Ray takes
the loopback address as the node's, so GCS, raylet, workers and the driver listen on 127.0.0.1
only. Read when ``ray`` is imported."""


def ray_address(address: str | None) -> str | None:
    """What ``ray.init`` is given. No ``--address`` and no ``RAY_ADDRESS`` (a Ray job's driver
    has it) means a Ray of the sweep's own, ``"local"``: given ``None``, Ray would join the
    newest cluster started on this machine by ``ray start`` or ``ray.cluster_utils.Cluster``
    (its address file, ``/tmp/ray/ray_current_cluster``), one the dry run did not check the
    sweep against and whose owner did not lend it."""
    if address is None and not os.environ.get("RAY_ADDRESS"):
        return "local"
    return address


def local_only_ray(address: str | None) -> bool:
    """A sweep that starts its own Ray (no ``--address``, no ``RAY_ADDRESS``) keeps every Ray
    port on 127.0.0.1 (unless the user set :data:`LOCAL_RAY_ENV` themselves); must run before
    ``import ray``. Returns whether it applies."""
    if ray_address(address) != "local":
        return False
    os.environ.setdefault(LOCAL_RAY_ENV, "0")
    return True


# ---- the recorded spec ------------------------------------------------------------------------


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict) and d:
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): d}


def spec_record(spec: Any) -> dict[str, Any]:
    """What decides which trials a run trains and how they are judged: the search space, seeds,
    algorithm, samples, the base config, the algorithm's own settings, and (:data:`RUN_ADDED`)
    the metric and its mode, the scheduler with its settings, the prune rules and WSD branching
    (as JSON)."""
    rec = {
        "search": {p.key: {"kind": p.kind, "values": list(p.values), "expr": p.expr,
                           "when": {k: list(v) for k, v in p.when}} for p in spec.search},
        "seeds": list(spec.seeds), "algorithm": spec.algorithm,
        "num_samples": spec.num_samples, "base": spec.base_config.to_dict(),
        **settings_records(spec),  # each algorithm's own settings block
    }
    run = {"metric": spec.metric, "mode": spec.mode, "scheduler": spec.scheduler,
           "asha": {k: v for k, v in dataclasses.asdict(spec.asha).items()
                    if k not in RUN_ADDED["asha"] or v != RUN_ADDED["asha"][k]},
           "prune": {name: dataclasses.asdict(rule) for name, rule in spec.prune.rules},
           "wsd_branches": spec.wsd_branches}
    rec.update({k: v for k, v in run.items() if v != RUN_ADDED[k] and v != {}})
    return json.loads(json.dumps(rec, default=str))


RUN_ADDED: dict[str, Any] = {
    "metric": "val_loss", "mode": "min", "scheduler": "fifo",
    "asha": {"grace_period": 2, "reduction_factor": 3.0, "max_t": None, "rung_metric": None,
             "predictor": "multi_power", "calibration": None},
    "prune": {}, "wsd_branches": True}
"""Keys recorded since issue 43 (the ranking and stopping of trials), with their defaults (for
``asha``: each of its fields): a key at its default is left out, so the record of a spec that
keeps them is as before; a run recorded before them that used another value is refused on
``--resume`` (``--force-spec`` records it)."""


def _spec_file(results_dir: Any) -> Any:
    """``spec.json`` of a results folder: a Path, or on object storage a signed Location (its
    HMAC is checked when read, ``sweeps.store.signing``)."""
    if "://" in str(results_dir):
        return Location.of(results_dir).signed() / SPEC_FILE
    return Path(str(results_dir)) / SPEC_FILE


def record_spec(spec: Any, results_dir: Any) -> None:
    """``spec.json`` in the results folder (a local path, a URL or a ``Location``)."""
    Location.of(_spec_file(results_dir)).write_text(json.dumps(spec_record(spec), indent=1))


def spec_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Every difference between two :func:`spec_record` s, each as ``key was old, now new``."""
    a, b = _flat(old), _flat(new)
    return [f"{k} was {shown(a.get(k, '<absent>'), 80)}, now {shown(b.get(k, '<absent>'), 80)}"
            for k in sorted(set(a) | set(b)) if a.get(k, "<absent>") != b.get(k, "<absent>")]


STATE_NAMES = ("tune", "rows", "results.parquet", "summary.json")
"""What a run leaves in its results folder: with any of them there, there is a run to resume."""


def _recorded(path: Any) -> dict[str, Any] | None:
    """The recorded spec, None when absent; a file that is no record is refused in one line."""
    if not path.exists():
        return None
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SearchSpaceError(
            f"--resume: {path} is unreadable ({type(e).__name__}: {shown(str(e), 80)}), so "
            "what the run started with is unknown; restore it, start afresh without --resume, "
            "or pass --resume --force-spec to record this spec") from None
    if not isinstance(old, dict) or "search" not in old:
        raise SearchSpaceError(
            f"--resume: {path} is not a spec record; restore it, start afresh without --resume, "
            "or pass --resume --force-spec to record this spec")
    return old


def check_resume_spec(spec: Any, results_dir: str | Path, force: bool,
                      say: Callable[[str], None] = print) -> None:
    """On ``--resume``: refuse a spec that differs from the one the run recorded, naming every
    changed key, and a run whose record is missing or unreadable (unless ``force``; then the
    new one is recorded). A folder with nothing to resume records the spec and starts."""
    path = _spec_file(results_dir)
    new = spec_record(spec)
    try:
        old = _recorded(path)
    except (SearchSpaceError, UntrustedStateError):  # unreadable; on S3 also: unsigned
        if not force:
            raise
        old = None
    if old is None:
        if any((Location.of(results_dir) / n).exists() for n in STATE_NAMES) and not force:
            raise SearchSpaceError(
                f"--resume: {path} is missing, so what the run started with is unknown (a run "
                "of an older version, or a deleted file); start afresh without --resume (the "
                "old run moves to previous/), or pass --resume --force-spec to resume with this "
                "spec")
        say(f"{path} is missing or unreadable: recording this spec")
        record_spec(spec, results_dir)
        return
    diffs = spec_differences(old, new)
    if not diffs:
        return
    changed = "; ".join(diffs[:6]) + (f"; and {len(diffs) - 6} more" if len(diffs) > 6 else "")
    if not force:
        raise SearchSpaceError(
            f"--resume: the spec differs from the one this run started with ({changed}); resume "
            "with the spec unchanged, start afresh without --resume (the old run moves to "
            "previous/), or pass --resume --force-spec to resume with the new spec")
    say(f"--force-spec: resuming with a changed spec ({changed})")
    record_spec(spec, results_dir)


# ---- preflight ---------------------------------------------------------------------------------


def _check_scheduler_and_rules(spec: Any, plan: Any) -> None:
    """Settings that would be silently ignored, or would stop every trial at its first eval."""
    if spec.asha.rung_metric is not None and spec.scheduler != "asha":
        raise SearchSpaceError(
            f"scheduler.rung_metric={spec.asha.rung_metric} needs scheduler.kind: asha (a "
            f"{spec.scheduler} scheduler has no rungs, so it would be ignored); use kind: asha "
            "or remove rung_metric")
    for name, rule in spec.prune.rules:
        if name != "max_load_fraction":
            continue
        experts = {t.config.moe.num_experts for t in plan.trials if t.config.moe is not None}
        for e in sorted(experts, reverse=True):
            if rule.above < 1 / e:
                raise SearchSpaceError(
                    f"prune.max_load_fraction.above={rule.above:g} fires on every eval: with "
                    f"{e} experts the largest load is at least 1/{e} = {1 / e:.3g}; give a "
                    "threshold above it")


def preflight(spec: Any, plan: Any) -> list[str]:
    """Everything checkable before a run starts or previous results move (also for
    ``--dry-run``); returns the lines to print. Refusals are one-line errors."""
    lines = []
    folders = sorted({t.config.parent.from_pretrained for t in plan.trials
                      if t.config.parent is not None and t.config.parent.from_pretrained})
    for f in folders:
        lines.append(check_checkpoint(f, what=f"parent.from_pretrained={f!r}").summary())
    _check_scheduler_and_rules(spec, plan)
    if spec.asha.rung_metric == "predicted_final" and spec.asha.calibration:
        if not Path(spec.asha.calibration).exists():
            raise SearchSpaceError(f"scheduler.calibration={spec.asha.calibration!r} does not "
                                   "exist; point it at a finished WSD sweep's results")
        try:
            load_calibration(spec.asha.calibration)
        except UpcycleError:
            raise
        except (OSError, ValueError, KeyError) as e:
            raise SearchSpaceError(
                f"scheduler.calibration={spec.asha.calibration!r} is unreadable "
                f"({type(e).__name__}: {str(e)[:200]}); point it at a finished WSD sweep's "
                "results.parquet") from None
        lines.append(f"calibration {spec.asha.calibration}: readable")
    if spec.results_uri.startswith("file:"):
        return lines
    if "://" in str(spec.results):  # a bucket has no symbolic links, its staging folder may
        rd, names = staging_for(spec.results_uri), STAGING_DIRS  # (W&B's files are there)
        confined(rd, rd.parent, f"staging folder of {spec.results_uri}")
    else:
        rd, names = spec.results_dir, WRITER_DIRS
    for name in names:
        if (rd / name).exists() or (rd / name).is_symlink():
            confined(rd / name, rd, f"results folder {rd}")
    return lines

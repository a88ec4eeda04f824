"""A fake multi-node autoscaling Ray cluster on this machine, driven by Ray's real autoscaler (v1,
or v2) with its fake multi-node provider: each worker node is a real raylet with logical GPUs,
removed when idle. Everything binds 127.0.0.1, lives under one folder and is stopped by PID, never
``ray stop`` (docs/cluster.md; ``python -m sweeps.cluster local up|down``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from moe_core.errors import ConfigError, UpcycleError
from moe_core.fsio import load_json

HEAD_TYPE = "ray.head.default"
WORKER_TYPE = "ray.worker.gpu"
# Ray's floor for a node's object store (ray_constants.OBJECT_STORE_MINIMUM_MEMORY_BYTES)
MIN_OBJECT_STORE = 75 * 2**20
STATE_FILE = "cluster.json"
MAX_ROOT = 38  # + "/ray/session_<date>_<time>_<pid>/sockets/plasma_store" <= 107 characters
FAKE_PROVIDER = "ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider"
# Ray turns 127.0.0.1 in an address into this machine's outward IP (services.
# resolve_ip_for_localhost), where nothing of this cluster listens; its single-machine
# (laptop) mode keeps every node and driver on loopback. Every process of the cluster gets it,
# and so must the driver that connects (``python -m sweeps.run --address``).
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
# Every node of the fake cluster is a handful of processes on one machine: Ray's metrics export
# (each raylet and agent, every few seconds) and usage-stats reports only take CPU from them, and
# so do the workers a raylet prestarts (PRESTART_ENV, one per CPU), which never host a trial.
PRESTART_ENV = "RAY_prestart_worker_first_driver"
"""Ray's switch (2.60: ``prestart_worker_first_driver``, on by default) for starting one idle
Python worker per CPU when the first driver connects. Tune starts every trial actor with a
``runtime_env`` (its ``PL_DISABLE_FORK``, ray.tune.execution.class_cache), which a prestarted
worker has not, so none of them ever hosts a trial: each only imports Ray and idles (a 2-CPU
sweep test: 15.2-17.3 core-seconds with them, 13.3-14.2 without). The sweep's own small actors
start a worker when they need one instead."""
LIGHT_ENV = {"RAY_enable_metrics_collection": "0", "RAY_USAGE_STATS_ENABLED": "0",
             PRESTART_ENV: "0"}


@dataclass(frozen=True, kw_only=True, slots=True)
class LocalClusterConfig:
    """The fake cluster: a head without GPUs, one worker type scaled from 0 to ``max_workers``."""

    head_cpus: int = 1
    """CPUs of the head (it drives the sweep; trials reserving a GPU never land there)."""
    worker_cpus: int = 1
    worker_gpus: int = 1
    """Logical GPUs per worker node (there is no CUDA behind them: see ``sweeps.plan.devices``)."""
    max_workers: int = 3
    object_store_bytes: int = 100 * 2**20
    """Object store of every node (the head's too); Ray's floor is 75 MiB."""
    idle_timeout_s: float = 6.0
    """A worker node idle this long is removed by the autoscaler."""
    autoscaler_v2: bool = False
    """Ray's autoscaler v2 (``RAY_enable_autoscaler_v2=1``) instead of v1."""
    port: int = 0
    """GCS port on 127.0.0.1; 0 picks a free one."""
    autoscale: bool = True
    """False: no autoscaler; worker nodes are added by hand (:meth:`LocalCluster.add_node`)."""

    def __post_init__(self) -> None:
        for k in ("head_cpus", "worker_cpus", "worker_gpus"):
            if getattr(self, k) < 0:
                raise ConfigError(f"local cluster {k}={getattr(self, k)} must be >= 0")
        if self.autoscale and self.max_workers < 1:
            raise ConfigError(f"local cluster max_workers={self.max_workers} must be >= 1")
        if self.object_store_bytes < MIN_OBJECT_STORE:
            raise ConfigError(f"local cluster object_store_bytes={self.object_store_bytes} is "
                              f"below Ray's floor of {MIN_OBJECT_STORE} (75 MiB); raise it")
        if not 0 < self.idle_timeout_s <= 86400:  # NaN too
            raise ConfigError(f"local cluster idle_timeout_s={self.idle_timeout_s} (--idle-"
                              "timeout-s) must lie in (0, 86400] seconds")
        if self.max_workers > 64:
            raise ConfigError(f"local cluster max_workers={self.max_workers} (--max-workers) "
                              "must be at most 64: each is a Ray node on this machine")


def autoscaling_config(cfg: LocalClusterConfig, gcs_address: str) -> dict[str, Any]:
    """The autoscaling config of the fake cluster, with the fields of Ray's
    ``fake_multi_node/example.yaml`` (absent from the 2.60 wheel)."""
    from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID

    provider: dict[str, Any] = {
        "type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
        "disable_launch_config_check": True,
        "gcs_address": gcs_address,  # the provider's default is port 6379: not ours
    }
    if cfg.autoscaler_v2:  # as ray.cluster_utils.AutoscalingCluster sets them for v2
        provider.update(launch_multiple=True, head_node_id=FAKE_HEAD_NODE_ID)
        # v2 fills the config's defaults from the provider type's default file, which for
        # fake_multinode is the missing example.yaml; as an "external" provider (the same
        # class, named by module) its defaults are built in
        provider.update(type="external", module=FAKE_PROVIDER)
    return {
        "cluster_name": "upcycle_local", "max_workers": cfg.max_workers,
        "provider": provider,
        "available_node_types": {
            HEAD_TYPE: {"resources": {"CPU": cfg.head_cpus, "GPU": 0}, "node_config": {},
                        "max_workers": 0},
            WORKER_TYPE: {"resources": {"CPU": cfg.worker_cpus, "GPU": cfg.worker_gpus,
                                        "object_store_memory": cfg.object_store_bytes},
                          "node_config": {}, "min_workers": 0,
                          "max_workers": cfg.max_workers},
        },
        "head_node_type": HEAD_TYPE, "auth": {}, "upscaling_speed": 1.0,
        "idle_timeout_minutes": cfg.idle_timeout_s / 60, "docker": {},
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
        "worker_setup_commands": [], "head_start_ray_commands": [],
        "worker_start_ray_commands": [], "file_mounts": {}, "cluster_synced_files": [],
        "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": [],
    }


def head_env(cfg: LocalClusterConfig) -> dict[str, str]:
    """Environment of the head's processes (the autoscaler reads it; the worker nodes it starts
    inherit it)."""
    from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID

    env = {**LOOPBACK_ENV, **LIGHT_ENV, "RAY_FAKE_CLUSTER": "1",
           "AUTOSCALER_UPDATE_INTERVAL_S": "1"}
    if cfg.autoscaler_v2:
        env.update(RAY_enable_autoscaler_v2="1", RAY_CLOUD_INSTANCE_ID=FAKE_HEAD_NODE_ID,
                   RAY_OVERRIDE_NODE_ID_FOR_TESTING=FAKE_HEAD_NODE_ID)
    else:
        env["RAY_enable_autoscaler_v2"] = "0"
    return env


@contextmanager
def _environ(update: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``update`` inside; the keys it set are put back after (what else
    changed stays)."""
    old = {k: os.environ.get(k) for k in update}
    os.environ.update(update)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def check_owned(path: Path, what: str) -> None:
    """``path`` (a folder or file ``local up`` / ``down`` acts on) is this user's own: not a
    symbolic link, owned by this user, not writable by others (who could plant a
    ``cluster.json`` naming processes to kill). An absent path is fine (it will be ours)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"{what} {path} is a symbolic link; give the real folder (nothing "
                          "was started or stopped)")
    if st.st_uid != os.geteuid():
        raise ConfigError(f"{what} {path} belongs to another user (uid {st.st_uid}); local "
                          "up/down act only on your own folders (nothing was started or "
                          "stopped)")
    if st.st_mode & 0o022:
        raise ConfigError(f"{what} {path} is writable by other users (mode "
                          f"{stat.S_IMODE(st.st_mode):o}); chmod go-w it or give another --dir")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tree(roots: list[tuple[int, float]], marks: tuple[str, ...] = ()) -> list[psutil.Process]:
    """The recorded processes (pid, create time: a reused pid is not ours) and their
    descendants, still alive; only processes of this user, and (``marks``) whose command line
    names one of ``marks`` (the cluster's own Ray folder: a process another cluster.json lists
    is never ours)."""
    out: dict[int, psutil.Process] = {}
    for pid, created in roots:
        with contextlib.suppress(psutil.NoSuchProcess):
            p = psutil.Process(pid)
            if abs(p.create_time() - created) > 1e-3 or p.uids().real != os.getuid():
                continue
            if marks and not any(m in " ".join(p.cmdline()) for m in marks):
                continue
            for q in [p, *p.children(recursive=True)]:
                out[q.pid] = q
    return list(out.values())


def kill_processes(procs: list[psutil.Process], grace_s: float = 5.0) -> None:
    """SIGTERM these processes, then SIGKILL what is left after ``grace_s``."""
    _signal(_signal(procs, signal.SIGTERM, grace_s), signal.SIGKILL, grace_s)


def _signal(procs: list[psutil.Process], sig: int, timeout_s: float) -> list[psutil.Process]:
    """Send ``sig`` to these processes; those still alive after ``timeout_s``."""
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(sig)
    return psutil.wait_procs(procs, timeout=timeout_s)[1]


class LocalCluster:
    """Start with :meth:`start` (or ``with LocalCluster(cfg) as c:``); ``c.address`` is what
    ``python -m sweeps.run --address`` takes. :meth:`stop` ends the processes it started."""

    def __init__(self, cfg: LocalClusterConfig | None = None, root: str | Path | None = None):
        self.cfg = cfg or LocalClusterConfig()
        # short: Ray's unix socket paths live under it (at most 107 characters)
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="ucl-"))
        if len(str(self.root.resolve())) > MAX_ROOT:
            raise ConfigError(f"local cluster directory {self.root} is longer than {MAX_ROOT} "
                              "characters (Ray's socket paths under it would pass the 107 "
                              "allowed); choose a shorter --dir")
        self.address = ""
        self._roots: list[tuple[int, float]] = []
        self._gcs: Any = None
        self._timers: list[threading.Timer] = []

    def start(self) -> LocalCluster:
        port = self.cfg.port or free_port()
        self.address = f"127.0.0.1:{port}"
        config = self.root / "autoscaling.json"
        self.root.mkdir(parents=True, exist_ok=True)
        config.write_text(json.dumps(autoscaling_config(self.cfg, self.address)))
        self._node(True, head_env(self.cfg) if self.cfg.autoscale else {},
                   gcs_server_port=port, num_cpus=self.cfg.head_cpus, num_gpus=0,
                   autoscaling_config=str(config) if self.cfg.autoscale else None,
                   temp_dir=str(self.root / "ray"), include_dashboard=False,
                   dashboard_host="127.0.0.1", dashboard_port=free_port())
        return self

    def add_node(self, cpus: int = 1, gpus: int = 0,
                 resources: dict[str, float] | None = None) -> psutil.Process:
        """Start a worker node by hand (a cluster without ``autoscale``), with custom
        ``resources`` (e.g. ``{"trial_driver": 2}``) if given; its raylet, which :meth:`preempt`
        takes."""
        from ray._private import ray_constants

        node = self._node(False, {}, gcs_address=self.address, redis_address=self.address,
                          num_cpus=cpus, num_gpus=gpus, resources=dict(resources or {}),
                          include_log_monitor=False)
        return psutil.Process(
            node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid)

    def _node(self, head: bool, env: dict[str, str], **params: Any) -> Any:
        """A Ray node of this cluster on loopback (``env`` over the light, loopback one), its
        processes recorded."""
        import ray._private.node
        import ray._private.parameter

        params = ray._private.parameter.RayParams(
            node_ip_address="127.0.0.1", object_store_memory=self.cfg.object_store_bytes,
            min_worker_port=0, max_worker_port=0, dashboard_agent_listen_port=0, **params)
        with _environ({**LOOPBACK_ENV, **LIGHT_ENV, **env}):
            node = ray._private.node.Node(params, head=head, shutdown_at_exit=False,
                                          spawn_reaper=False)
        self._roots += [(p.process.pid, psutil.Process(p.process.pid).create_time())
                        for infos in node.all_processes.values() for p in infos]
        (self.root / STATE_FILE).write_text(json.dumps({
            "address": self.address, "pids": self._roots, "config": asdict(self.cfg)}))
        return node

    @classmethod
    def attach(cls, root: str | Path) -> LocalCluster:
        """The cluster whose state ``start`` wrote under ``root`` (for ``local down``): the
        folder and its ``cluster.json`` must be this user's own (:func:`check_owned`)."""
        f = Path(root) / STATE_FILE
        check_owned(Path(root), "--dir")
        check_owned(f, "cluster state")
        state = load_json(f, 1 << 20, "cluster state")
        try:
            pids = [(int(p), float(t)) for p, t in state["pids"]]
            c = cls(LocalClusterConfig(**state["config"]), root)
            c.address, c._roots = str(state["address"]), pids
        except ConfigError:
            raise
        except (TypeError, ValueError, KeyError) as e:
            raise ConfigError(f"cluster state {f} is damaged ({e!r}); stop its processes by "
                              "hand and remove it") from None
        return c

    def processes(self) -> list[psutil.Process]:
        """Every live process of this cluster: the head's and their descendants (the worker
        nodes' processes are children of the head's autoscaler); only this user's, and only
        head processes started for this folder (their command lines name its Ray folder)."""
        ray_dir = self.root / "ray"
        return _tree(self._roots, marks=(str(ray_dir), str(ray_dir.resolve())))

    def stop(self) -> None:
        """End this cluster's processes (by PID, the whole tree at once), nothing else; then
        drop the GCS client that starting the head in this process left in Ray's internal KV
        (``ray._private.node.Node`` initialises it). Left pointing at the dead GCS, the next
        usage record (creating any Tune scheduler does one) retries it and Ray then exits this
        process with status 1."""
        import ray
        import ray.experimental.internal_kv as internal_kv

        for t in self._timers:  # drained nodes' kills not yet due
            t.cancel()
        kill_processes(self.processes())
        self._gcs = None
        if not ray.is_initialized():  # a driver connected to this cluster owns the client
            internal_kv._internal_kv_reset()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---- observing and disturbing the cluster ---------------------------------------------

    def nodes(self) -> list[dict[str, Any]]:
        """The GCS's view: one dict per node (``node_id``, ``alive``, ``head``,
        ``node_manager_port``), dead nodes included."""
        from ray._raylet import GcsClient

        if self._gcs is None:
            self._gcs = GcsClient(address=self.address)
        return [{"node_id": nid.hex(), "alive": info.state == 0, "head": info.is_head_node,
                 "node_manager_port": info.node_manager_port}
                for nid, info in self._gcs.get_all_node_info(timeout=10).items()]

    def worker_count(self) -> int:
        """Live worker nodes (the head not counted)."""
        return sum(n["alive"] and not n["head"] for n in self.nodes())

    def wait_for(self, pred: Callable[[int], bool], timeout_s: float, what: str) -> int:
        """Poll :meth:`worker_count` until ``pred(count)``; the count. Raises after
        ``timeout_s`` naming ``what``."""
        deadline = time.monotonic() + timeout_s
        while True:
            n = self.worker_count()
            if pred(n):
                return n
            if time.monotonic() > deadline:
                raise UpcycleError(f"local cluster: {what} not reached in {timeout_s:.0f} s "
                                   f"({n} worker nodes)")
            time.sleep(0.5)

    def raylet_of(self, pid: int) -> psutil.Process | None:
        """The raylet of the node a worker process ``pid`` (a task or actor) runs on, if it is
        one of this cluster's processes."""
        ours = {p.pid for p in self.processes()}
        with contextlib.suppress(psutil.NoSuchProcess):
            p = psutil.Process(pid)
            while p is not None and p.pid in ours:
                if "raylet" in p.name():
                    return p
                p = p.parent()
        return None

    def node_of(self, raylet: psutil.Process) -> dict[str, Any]:
        """The GCS's record (:meth:`nodes`) of the node whose raylet this is."""
        ids = [a.removeprefix("--node_id=") for a in raylet.cmdline()
               if a.startswith("--node_id=")]
        for n in self.nodes():
            if n["node_id"] in ids:
                return n
        raise UpcycleError(f"local cluster: raylet {raylet.pid} is no node of this cluster")

    def drain(self, raylet: psutil.Process, deadline_s: float) -> float:
        """A spot reclaim with notice, as the autoscaler relays it: the node is drained through
        the GCS (``DrainNode``, reason ``DRAIN_NODE_REASON_PREEMPTION``, deadline
        ``deadline_s`` from now), then killed at the deadline (:meth:`preempt`) unless it has
        exited by then (a drained raylet exits once idle). The deadline, seconds since the
        epoch. The head is refused."""
        from ray.core.generated import autoscaler_pb2

        node = self.node_of(raylet)
        if node["head"]:
            raise UpcycleError("local cluster: refusing to drain the head node")
        deadline = time.time() + deadline_s
        accepted, why = self._gcs.drain_node(
            node["node_id"], autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
            "spot instance reclaimed", int(deadline * 1000))
        if not accepted:
            raise UpcycleError(f"local cluster: the GCS refused to drain node "
                               f"{node['node_id'][:12]}: {why}")
        timer = threading.Timer(max(0.0, deadline - time.time()), self._kill_if_alive, (raylet,))
        timer.daemon = True
        timer.start()
        self._timers.append(timer)
        return deadline

    def _kill_if_alive(self, raylet: psutil.Process) -> None:
        with contextlib.suppress(psutil.NoSuchProcess, UpcycleError):  # exited meanwhile
            if raylet.is_running() and raylet.status() != psutil.STATUS_ZOMBIE:
                self.preempt(raylet)

    def preempt(self, raylet: psutil.Process) -> None:
        """A worker node vanishes as a reclaimed spot instance does: its raylet and every
        process under it are killed at once (SIGKILL), with no drain. The head is refused."""
        if self.node_of(raylet)["head"]:
            raise UpcycleError("local cluster: refusing to preempt the head node")
        _signal([raylet, *raylet.children(recursive=True)], signal.SIGKILL, 10)

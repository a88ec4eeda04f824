"""A real Ray autoscaler on one machine (``sweeps.cluster.local``).

Under autoscaler v1 (the default of ``local up`` and of Ray's cluster launcher), a sweep whose
trials each reserve a (logical) GPU makes the cluster grow from its GPU-less head to several
worker nodes and shrink back to the head after the sweep; a worker node is killed mid-trial
(after the trial's first checkpoint), as a reclaimed spot instance is, and its trial resumes
from its last checkpoint on another node; every reported row is in ``results.parquet``
exactly once and the shared parent is trained once. The sweep writes to a bucket on the local
S3 server (moto), its endpoint and fake keys in the environment the cluster's nodes inherit;
every read below goes through ``pyarrow.fs``. (A node killed mid-trial with results in a local
folder, without autoscaler: the node killed without notice in ``test_preemption_notice.py``.)

Under autoscaler v2 (KubeRay's) the cheaper check: a placement group of two GPU bundles that
must land on different nodes makes the cluster grow from the head alone to two workers, and
it shrinks back to the head after the group is gone. The sweep-level behaviour above does not
depend on which autoscaler added the nodes; running the whole sweep under both cost about
two minutes of the suite's wall time.

The cluster's processes are the only ones started or stopped. The sweep test prints (``-s``)
the head's start time, the node-count timeline, the driver's exit, the bytes written under
``results:``, the CPU seconds of the cluster, driver and S3 server, and the load average; the
same go to ``timeline.json`` in its temp folder, next to the autoscaler's log. No timing is
asserted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time

import psutil
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import yaml

from sweeps.cluster.local import LIGHT_ENV, LOOPBACK_ENV, LocalCluster, LocalClusterConfig
from sweeps.plan.devices import ALLOW_CPU_ENV
from tests import s3_server
from tests.sweeps.test_sweep_e2e import SPEC

s3 = s3_server.s3  # the moto server fixture

EVERY = 8  # eval every 8 steps, a checkpoint at every other eval (16, 32, 48, 64)
STEPS = 64


@pytest.fixture
def results_root(tmp_path, s3, monkeypatch) -> str:
    """The sweep's ``results:``, a bucket on the local S3 server (moto), its endpoint and fake
    keys in this process's environment before the cluster starts, so that the fake nodes'
    workers reach it too."""
    for k, v in s3.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("UPCYCLE_SWEEPS_HMAC_KEY_FILE", str(tmp_path / "cfg" / "hmac.key"))
    monkeypatch.setenv("UPCYCLE_STAGING", str(tmp_path / "staging"))
    return f"s3://{s3.bucket()}/results"


class Timeline(threading.Thread):
    """Samples the number of live nodes (the head included) every ``every_s``; keeps the
    changes as (seconds since start, nodes). Also sums the CPU seconds of the cluster's
    processes and of the ones :meth:`watch` names (the driver, the S3 server): a measure of
    the test's work that the machine's load does not change (a process's last ``every_s``
    before it ends is missed)."""

    def __init__(self, cluster: LocalCluster, every_s: float = 0.5):
        super().__init__(daemon=True)
        self.cluster, self.every_s = cluster, every_s
        self.t0 = time.monotonic()
        self.points: list[tuple[float, int]] = []
        self.halt = threading.Event()
        self.watched: list[psutil.Process] = []
        self.cpu: dict[tuple[int, float], float] = {}
        self.names: dict[tuple[int, float], str] = {}

    def watch(self, pid: int) -> None:
        self.watched.append(psutil.Process(pid))

    def cpu_s(self) -> float:
        return sum(self.cpu.values())

    def cpu_by_kind(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, s in self.cpu.items():
            out[self.names[key]] = round(out.get(self.names[key], 0.0) + s, 1)
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def sample(self) -> None:
        n = 1 + self.cluster.worker_count()
        if not self.points or self.points[-1][1] != n:
            self.points.append((round(time.monotonic() - self.t0, 1), n))
        procs = self.cluster.processes()
        for w in self.watched:
            try:
                procs += [w, *w.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
        for p in procs:
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    key = (p.pid, p.create_time())
                    self.cpu[key] = t.user + t.system
                    if key not in self.names:
                        self.names[key] = _process_kind(p)
            except psutil.NoSuchProcess:
                continue

    def run(self) -> None:
        while not self.halt.is_set():
            self.sample()
            self.halt.wait(self.every_s)

    def stop(self) -> list[tuple[float, int]]:
        self.halt.set()
        self.join(timeout=30)
        self.sample()
        return self.points


def _process_kind(p: psutil.Process) -> str:
    """A short name for what a process is (Ray's worker processes name themselves)."""
    cmd = p.cmdline()
    if not cmd:
        return p.name()
    if cmd[0].startswith("ray::"):
        return cmd[0].split()[0]
    for part in cmd[:4]:
        if part.endswith(".py") or part in ("sweeps.run", "moto_server"):
            return os.path.basename(part)
    return os.path.basename(cmd[0])


def _fs(uri: str) -> tuple[pafs.FileSystem, str]:
    return pafs.FileSystem.from_uri(uri)


def _trial_results(fs: pafs.FileSystem, tune_dir: str) -> dict[str, list[dict]]:
    """Tune's ``result.json`` of every trial: its reports in order (with ``pid`` and
    ``checkpoint_dir_name``), keyed by trial id."""
    out: dict[str, list[dict]] = {}
    try:  # the trial folders only (not every checkpoint file: this is polled)
        infos = fs.get_file_info(pafs.FileSelector(tune_dir, allow_not_found=True))
    except OSError:
        return out
    for info in infos:
        if info.type != pafs.FileType.Directory:
            continue
        try:
            with fs.open_input_stream(f"{info.path}/result.json") as f:
                lines = f.read().decode().splitlines()
        except (FileNotFoundError, OSError):
            continue
        rows = []
        for line in lines:
            try:
                rows.append(json.loads(line))
            except ValueError:  # a line being written
                break
        if rows:
            out[rows[0]["trial_id"]] = rows
    return out


def _preempt_a_running_trial(cluster: LocalCluster, fs, tune_dir: str, proc,
                             timeout_s: float = 240) -> dict:
    """Wait for a trial that has reported a checkpoint and is not finished, then kill the
    worker node it runs on. What was done: trial id, its last checkpointed step, the pid."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        for tid, rows in _trial_results(fs, tune_dir).items():
            ck = [r["step"] for r in rows if r.get("checkpoint_dir_name")]
            last = rows[-1]
            if not ck or last["step"] > STEPS - 2 * EVERY:  # a window of 5 evals of 9 (16-48)
                continue
            raylet = cluster.raylet_of(last["pid"])
            if raylet is None:
                continue
            cluster.preempt(raylet)
            return {"trial_id": tid, "ckpt_step": max(ck), "pid": last["pid"],
                    "raylet": raylet.pid}
        # each poll lists the trials on the S3 server and reads their result.json: requests
        # the (pure Python) moto server spends CPU on (every 0.2 s before); a second is still
        # short against the window (the 32 steps after a trial's first checkpoint)
        time.sleep(1.0)
    raise AssertionError("no running trial with a checkpoint was seen to preempt")


TRIALS = 3
"""SPEC's first three trials, all pending at once (``max_concurrent``): the same demand of three
GPUs the autoscaler scales up for; a fourth only ran once one of them had finished."""


def _sweep_spec(results_root: str) -> dict:
    base = dict(SPEC["base"], tokens=STEPS * 8 * 32, eval={"every_steps": EVERY, "batches": 2})
    grid = SPEC["search"]["upcycle.lr_policy"]["grid"][:TRIALS]
    return dict(SPEC, base=base, search={"upcycle.lr_policy": {"grid": grid}},
                results=results_root, resources={"cpus": 1, "gpus": 1},
                max_concurrent=TRIALS, storage={"flush_s": 0.5},
                logging={"wandb": {"enabled": False}},
                failure={"max_failures": 3},
                checkpoint={"every_evals": 2, "every_minutes": None})


@pytest.mark.slow
@pytest.mark.distributed
def test_autoscaled_sweep_scales_up_and_down_and_survives_preemption(tmp_path, results_root,
                                                                     s3, request):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_sweep_spec(results_root)))
    env = dict(os.environ, WANDB_MODE="disabled", UPCYCLE_CACHE=str(tmp_path / "cache"),
               **LOOPBACK_ENV, **LIGHT_ENV, **{ALLOW_CPU_ENV: "1"})
    env.pop("RAY_ADDRESS", None)
    fs, root = _fs(results_root)
    sweep_dir = f"{root}/e2e"
    t0 = time.monotonic()
    cluster = LocalCluster(LocalClusterConfig())  # autoscaler v1; a short /tmp/ucl-* root
    request.addfinalizer(lambda: _keep_autoscaler_log(cluster.root, tmp_path))
    with cluster:
        head_s = time.monotonic() - t0
        timeline = Timeline(cluster)
        timeline.start()
        log = open(tmp_path / "driver.log", "w")
        proc = subprocess.Popen([sys.executable, "-m", "sweeps.run", str(spec), "--address",
                                 cluster.address], env=env, stdout=log, stderr=subprocess.STDOUT)
        timeline.watch(proc.pid)
        timeline.watch(s3.pid)
        try:
            hit = _preempt_a_running_trial(cluster, fs, f"{sweep_dir}/tune", proc)
            proc.wait(timeout=420)
            driver_s = time.monotonic() - timeline.t0
        finally:
            if proc.poll() is None:
                proc.kill()
            log.close()
        assert proc.returncode == 0, (tmp_path / "driver.log").read_text()[-3000:]
        cluster.wait_for(lambda n: n == 0, 120, "scale-down to the head alone")
        points = timeline.stop()
        assert not psutil_alive(hit["raylet"])
    wall = time.monotonic() - t0
    written = _bytes_under(fs, sweep_dir)
    print(f"\nautoscaler v1 (results on S3): "
          f"head up in {head_s:.1f} s; node-count timeline from the driver's start (s, nodes "
          f"incl. head): {points}; driver exited at {driver_s:.1f} s; preempted trial "
          f"{hit['trial_id']} after its checkpoint at step {hit['ckpt_step']}; "
          f"{written[0]:,} bytes in {written[1]} objects written under {results_root}; "
          f"{wall:.0f} s in all, {timeline.cpu_s():.0f} CPU s (cluster, driver"
          f", S3 server), load {os.getloadavg()[0]:.1f}")
    (tmp_path / "timeline.json").write_text(json.dumps(
        {"points": points, "wall_s": wall, "head_s": head_s, "driver_s": driver_s,
         "cpu_s": timeline.cpu_s(), "cpu_by_kind": timeline.cpu_by_kind(),
         "load": os.getloadavg(),
         "bytes": written[0], "objects": written[1]}))

    # scale-up from the head alone to more than one worker, and back to the head alone
    assert points[0][1] == 1, points
    assert max(n for _, n in points) >= 3, points  # the head and at least two workers
    assert points[-1][1] == 1, points

    # every reported row is in results.parquet exactly once, every trial complete
    with fs.open_input_file(f"{sweep_dir}/results.parquet") as f:
        rows = pq.read_table(f).to_pylist()
    keys = [(r["trial_id"], r["step"]) for r in rows]
    reported = {(t, r["step"]) for t, rs in _trial_results(fs, f"{sweep_dir}/tune").items()
                for r in rs}
    assert len(keys) == len(set(keys)) and set(keys) == reported
    trials = {r["trial_id"] for r in rows}
    assert len(trials) == TRIALS
    for t in trials:
        steps = sorted(r["step"] for r in rows if r["trial_id"] == t)
        assert steps == list(range(0, STEPS + 1, EVERY)), (t, steps)
        assert {r["status"] for r in rows if r["trial_id"] == t} == {"ok"}

    # the preempted trial resumed from its last checkpoint, in a new process on another node
    reports = _trial_results(fs, f"{sweep_dir}/tune")[hit["trial_id"]]
    pids = [r["pid"] for r in reports]
    cut = next(i for i, p in enumerate(pids) if p != hit["pid"] and i > pids.index(hit["pid"]))
    before = [r["step"] for r in reports[:cut] if r.get("checkpoint_dir_name")]
    assert reports[cut]["step"] == max(before) + EVERY > EVERY, [r["step"] for r in reports]
    assert max(before) >= hit["ckpt_step"]

    # the parent was trained once: one cached parent, and no trial trained it again (the
    # fallback path takes the parent's lock file)
    cached = [i for i in fs.get_file_info(pafs.FileSelector(f"{sweep_dir}/parents"))]
    assert len([i for i in cached if i.type == pafs.FileType.Directory  # .setup: set-up boards
                and not i.base_name.startswith(".")]) == 1, cached
    assert not [i for i in cached if i.base_name.endswith(".lock")], cached


SPREAD_TWO_GPUS = """
import sys, ray
from ray.util.placement_group import placement_group, placement_group_table
ray.init(address=sys.argv[1], log_to_driver=False)
pg = placement_group([{"CPU": 1, "GPU": 1}] * 2, strategy="STRICT_SPREAD")
ray.get(pg.ready(), timeout=240)
print(sorted(set(placement_group_table(pg)["bundles_to_node_id"].values())))
"""
"""A placement group of two 1-GPU bundles on two different nodes (the head has no GPU): the
autoscaler must add two worker nodes before it is ready; printed: the bundles' node ids. The
group goes when the script's job ends."""


@pytest.mark.slow
@pytest.mark.distributed
def test_autoscaler_v2_scales_up_to_pending_gpus_and_back_down(tmp_path, request):
    env = dict(os.environ, **LOOPBACK_ENV, **LIGHT_ENV)
    env.pop("RAY_ADDRESS", None)
    cluster = LocalCluster(LocalClusterConfig(autoscaler_v2=True))
    request.addfinalizer(lambda: _keep_autoscaler_log(cluster.root, tmp_path))
    with cluster:
        timeline = Timeline(cluster)
        timeline.start()
        out = subprocess.run([sys.executable, "-c", SPREAD_TWO_GPUS, cluster.address], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        cluster.wait_for(lambda n: n == 0, 120, "scale-down to the head alone")
        points = timeline.stop()
    print(f"\nautoscaler v2: node-count timeline (s, nodes incl. head): {points}")
    nodes = json.loads(out.stdout.strip().splitlines()[-1].replace("'", '"'))
    assert len(nodes) == 2, out.stdout  # two workers, one bundle on each
    assert points[0][1] == 1, points
    assert max(n for _, n in points) >= 3, points  # the head and at least two workers
    assert points[-1][1] == 1, points


def _bytes_under(fs: pafs.FileSystem, root: str) -> tuple[int, int]:
    """Bytes and files (objects) under ``root``."""
    files = [i for i in fs.get_file_info(pafs.FileSelector(root, recursive=True))
             if i.type == pafs.FileType.File]
    return sum(i.size for i in files), len(files)


def _keep_autoscaler_log(root, tmp_path) -> None:
    """The autoscaler's log (node launches and removals, with times) into the test's folder,
    then the cluster's folder removed."""
    for f in root.glob("ray/session_*/logs/monitor.*"):
        shutil.copy(f, tmp_path / f.name)
    shutil.rmtree(root, ignore_errors=True)


def psutil_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False

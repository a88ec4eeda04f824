"""Secrets and trust at the sweep's edges (docs/storage.md).

- ``hide_wandb_key`` and ``hide_cloud_keys`` move the W&B and AWS keys out of the environment
  (Ray writes it into its session logs) into private files that wandb and pyarrow's AWS SDK read.
- ``verify_experiment_state``: ``--resume`` unpickles Tune's state, so a file another user could
  have written is code they could run: all under ``tune/`` must be ours, writable by no other.
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile
from pathlib import Path
from urllib.parse import urlparse

import psutil

from moe_core.errors import UpcycleError

WANDB_KEY_ENV = "WANDB_API_KEY"


NETRC_PREFIX = "upcycle-wandb-"
"""``<tmp>/upcycle-wandb-<owner pid>-<owner start>-XXXX/netrc``: the folder names the process
that wrote it, by PID *and* start time (a PID alone is reused by the system)."""


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in hundredths of a second since the epoch (the kernel's
    clock-tick resolution); None when there is no such process."""
    try:
        return round(psutil.Process(pid).create_time() * 100)
    except psutil.NoSuchProcess:
        return None
    except psutil.Error:  # another user's process: alive, start time unknown
        return -1


def owner_tag() -> str:
    """``<pid>-<start>``: this process, as :func:`owner_alive` tells it apart from a later one
    given the same PID."""
    return f"{os.getpid()}-{process_start(os.getpid())}"


def owner_alive(name: str, made: float) -> bool:
    """Whether the owner named by ``name`` (``<pid>-<start>-…``, or ``<pid>-…`` as written
    before start times were recorded) still runs. A live process with that PID is the owner
    only if it started when the name says (within 0.02 s), or, for a name without a start
    time, no later than the folder was made (``made``, seconds since the epoch)."""
    parts = name.split("-")
    if not parts[0].isdigit():
        return True  # not ours to judge: kept
    started = process_start(int(parts[0]))
    if started is None:
        return False
    if started < 0:
        return True
    if len(parts) > 2 and parts[1].isdigit():
        return abs(started - int(parts[1])) <= 2
    return started <= round(made * 100) + 2


def clean_stale_netrc(tmp: str | Path | None = None, prefix: str = NETRC_PREFIX) -> list[Path]:
    """Remove the secret folders (the W&B netrc; with ``prefix`` :data:`AWS_PREFIX`, the AWS
    credentials) that a driver killed with -9 left behind: ours (same uid) whose owner (PID
    plus start time, :func:`owner_alive`) is gone. Returns what was removed."""
    gone = []
    for d in Path(tmp or tempfile.gettempdir()).glob(f"{prefix}*"):
        try:
            st = d.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() \
                or owner_alive(d.name[len(prefix):], st.st_mtime):
            continue
        shutil.rmtree(d, ignore_errors=True)
        gone.append(d)
    return gone


def hide_wandb_key() -> Path | None:
    """Move the W&B key from the environment into a private netrc file; returns its path."""
    key = os.environ.pop(WANDB_KEY_ENV, None)
    clean_stale_netrc()
    if not key:
        return None
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    path = _private_file(NETRC_PREFIX, "netrc",
                         f"machine {host}\n  login user\n  password {key}\n")
    os.environ["NETRC"] = str(path)
    return path


def _private_file(prefix: str, name: str, text: str) -> Path:
    """``text`` in a new file (0600) of a new folder (0700) ``<tmp>/<prefix><owner tag>-XXXX``,
    removed at exit."""
    d = Path(tempfile.mkdtemp(prefix=f"{prefix}{owner_tag()}-"))
    atexit.register(shutil.rmtree, d, True)
    fd = os.open(d / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return d / name


AWS_KEY_ENVS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
AWS_PREFIX = "upcycle-aws-"
"""``<tmp>/upcycle-aws-<owner pid>-<owner start>-XXXX/credentials``: removed at exit, and by
the next run when its owner was killed (:func:`clean_stale_netrc`)."""


def hide_cloud_keys() -> Path | None:
    """Move AWS keys from the environment into a private credentials file (the profile
    ``$AWS_PROFILE``, default ``default``); returns its path. Call before any S3 filesystem is
    built (the SDK picks its providers then)."""
    keys = {k: os.environ.get(k) for k in AWS_KEY_ENVS}
    clean_stale_netrc(prefix=AWS_PREFIX)  # a killed run's credentials: never left behind
    if not keys["AWS_ACCESS_KEY_ID"] or not keys["AWS_SECRET_ACCESS_KEY"]:
        return None
    for k in AWS_KEY_ENVS:
        os.environ.pop(k, None)
    lines = [f"[{os.environ.get('AWS_PROFILE') or 'default'}]",
             f"aws_access_key_id = {keys['AWS_ACCESS_KEY_ID']}",
             f"aws_secret_access_key = {keys['AWS_SECRET_ACCESS_KEY']}"]
    if keys["AWS_SESSION_TOKEN"]:
        lines.append(f"aws_session_token = {keys['AWS_SESSION_TOKEN']}")
    path = _private_file(AWS_PREFIX, "credentials", "\n".join(lines) + "\n")
    os.environ["AWS_SHARED_CREDENTIALS_FILE"] = str(path)
    return path


class UntrustedStateError(UpcycleError):
    """The experiment state to resume from could have been written by someone else."""


def verify_experiment_state(exp_dir: str | Path) -> None:
    """Refuse (one line) unless ``exp_dir`` and everything in it is ours and not writable by
    group or others. Symbolic links are refused too (they could point anywhere)."""
    exp_dir = Path(exp_dir)
    uid = os.geteuid()
    for p in [exp_dir, *exp_dir.rglob("*")]:
        st = p.lstat()
        why = None
        if stat.S_ISLNK(st.st_mode):
            why = "is a symbolic link"
        elif st.st_uid != uid:
            why = f"is owned by uid {st.st_uid}, not by you (uid {uid})"
        elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            why = "is writable by group or others"
        if why:
            raise UntrustedStateError(
                f"refusing to resume: {p} {why}, and --resume would unpickle it; if you trust "
                f"it, fix it (chown/chmod go-w), else start the sweep afresh without --resume"
            )

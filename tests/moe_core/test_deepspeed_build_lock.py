"""A stale DeepSpeed build lock never hangs a run (issue #32): with a ``lock`` file left in the
torch extensions cache by a build killed midway, setting up training still returns, builds
nothing and leaves the lock alone (``moe_core.train.dsops``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from moe_core.train.dsops import UNNEEDED_OPS

CODE = """
from moe_core.train.engine import init_distributed
print("ranks", init_distributed())
"""
# A rank of a multi-rank trial: Ray Train has set up the process group before training starts,
# and deepspeed.initialize still starts DeepSpeed's comm layer (which asks for the op).
RAY_TRAIN_CODE = """
import os, socket
import torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", LOCAL_RANK="0",
                  WORLD_SIZE="1")
dist.init_process_group("gloo", rank=0, world_size=1)
from moe_core.train.engine import init_distributed
print("ranks", init_distributed())
import deepspeed.comm
deepspeed.comm.init_distributed(dist_backend="gloo", verbose=False)  # as deepspeed.initialize
"""


@pytest.mark.slow
@pytest.mark.parametrize("code", [CODE, RAY_TRAIN_CODE], ids=["lone", "ray_train_group"])
def test_planted_stale_build_lock_does_not_hang_init(tmp_path, code):
    ext = tmp_path / "torch_extensions"
    locks = []
    for name in UNNEEDED_OPS:
        (ext / name).mkdir(parents=True)
        locks.append(ext / name / "lock")
        locks[-1].write_text("")  # what a build killed midway leaves behind
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(ext), PYTHONPATH=os.getcwd())
    env.pop("WORLD_SIZE", None)
    # before the fix this waited on the lock for ever: the timeout is the failure
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=240, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "ranks (0, 1)" in p.stdout
    assert "built successfully" not in p.stdout + p.stderr
    assert all(x.exists() for x in locks)  # not ours to remove

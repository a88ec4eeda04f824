"""DeepSpeed's just-in-time op builds, kept out of training.

On a CPU accelerator ``deepspeed.init_distributed`` JIT-builds ``deepspeed_shm_comm``
(``ShareMemCommBuilder``, through ``torch.utils.cpp_extension.load``) into the torch extensions
cache, shared across environments, behind a ``lock`` file there. A process killed mid-build
leaves that file, and every later ``load`` waits on it forever, even when the built module is
present. The op serves only ``inference_all_reduce`` (DeepSpeed inference's tensor parallelism),
which training never calls, so :func:`skip_unneeded_ops` marks it incompatible in DeepSpeed's
own table (``deepspeed.ops.__compatible_ops__``, kept for the process: DeepSpeed's comment
says edits to it persist): nothing is built and no lock is waited on.
"""

from __future__ import annotations

UNNEEDED_OPS = ("deepspeed_shm_comm",)
"""Ops training never calls (see the module docstring)."""


def skip_unneeded_ops() -> None:
    """Mark :data:`UNNEEDED_OPS` incompatible before DeepSpeed builds them (CPU only: on CUDA
    no accelerator builder asks for them, and reading the table would probe every op)."""
    import torch

    if torch.cuda.is_available():
        return
    import deepspeed.ops

    table = deepspeed.ops.__compatible_ops__  # DeepSpeed's probe of every op, run once
    for name in UNNEEDED_OPS:
        table[name] = False

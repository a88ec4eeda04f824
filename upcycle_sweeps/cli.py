"""``upcycle-sweeps COMMAND [ARGS]``: the project's command lines under one installed name.

Each sub-command is the ``python -m`` form it names, which keeps working; its module is imported
only when it runs, so ``upcycle-sweeps --help`` and a refused spec answer without loading torch
or Ray. Every command's errors go through the one boundary (``moe_core.errors.cli_boundary`` /
the commands' own ``main``): one line on stderr, exit status 2.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from moe_core.errors import UpcycleError, cli_boundary


@dataclass(frozen=True)
class Command:
    module: str
    function: str
    help: str
    prefix: tuple[str, ...] = ()
    m: str | None = None
    """The ``python -m`` module when it is not ``module`` (``analysis.cli``'s commands)."""

    @property
    def python_m(self) -> str:
        mod = self.m or self.module.removesuffix(".__main__")
        return f"python -m {mod} {' '.join(self.prefix)}".rstrip()


COMMANDS: dict[str, Command] = {
    "run": Command("sweeps.run.cli", "main", "run (or --dry-run) a sweep from a spec YAML",
                   m="sweeps.run"),
    "compare": Command("analysis.compare", "main", "compare sweeps: knobs, two-way tables, plots"),
    "best": Command("analysis.best", "main", "the best trial of a sweep; --export DIR as HF"),
    "cluster": Command("sweeps.cluster.__main__", "main",
                       "a local fake autoscaling cluster: local up|down"),
    "verify": Command("sweeps.run.verify", "main",
                      "re-train sampled trials: bit-exact, or the difference"),
    "report": Command("analysis.report", "main", "the Markdown report of a sweep's results"),
    "wandb-workspace": Command("analysis.wandb_workspace", "main",
                               "a W&B workspace of sweeps' runs (the wandb extra)"),
    "decide": Command("analysis.cli", "decide_main", "should I upcycle? (and --plan)",
                       m="analysis.decide"),
    "fit": Command("analysis.cli", "fit_main", "fit one of the seeds' scaling laws",
                    m="analysis.fit"),
    "derived": Command("analysis.cli", "derived_main", "D*, compute-optimal splits, eta",
                        m="analysis.derived"),
    "noise": Command("analysis.cli", "noise_main", "seed noise of a replicated sweep",
                      m="analysis.noise"),
    "upcycle": Command("moe_core.hf.__main__", "main", "an HF checkpoint -> an HF MoE",
                       ("upcycle",)),
    "export": Command("moe_core.hf.__main__", "main", "a training checkpoint -> an HF folder",
                      ("export",)),
    "train": Command("moe_core.train.__main__", "main", "one training run from a config YAML"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: upcycle-sweeps COMMAND [ARGS ...]   (COMMAND --help for its options)",
             "", "commands:"]
    lines += [f"  {n:<{width}}  {c.help}  [{c.python_m}]" for n, c in COMMANDS.items()]
    return "\n".join(lines)


@cli_boundary()
def _unknown(name: str) -> int:
    raise UpcycleError(f"unknown command {name!r}; one of {', '.join(COMMANDS)} "
                       "(upcycle-sweeps --help)")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    cmd = COMMANDS.get(args[0])
    if cmd is None:
        return _unknown(args[0])
    if args[0] == "run":
        os.environ.setdefault("WANDB_MODE", "offline")  # as python -m sweeps.run does
    fn = getattr(importlib.import_module(cmd.module), cmd.function)
    return int(fn([*cmd.prefix, *args[1:]]) or 0)


if __name__ == "__main__":
    sys.exit(main())

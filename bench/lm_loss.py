"""LM head + cross-entropy, fwd+bwd: the plain path (logits, their fp32 copy, F.cross_entropy)
vs ``moe_core.loss.linear_cross_entropy`` (``model.chunked_loss``), side by side in one run; on
CUDA with liger-kernel installed also Liger's fused kernel (``model.fused_head``, "fused").

Prints each path's median time and the peak memory it adds over its inputs (CUDA:
``torch.cuda.max_memory_allocated``; CPU: the growth of the process's peak RSS, each path in a
fresh process), the ratios, and a JSON line. Defaults: the 0.1B preset's width (768) and the
32,768-word vocabulary of bench/train_step.py, 32 × 1,024 tokens in bf16 on CUDA, 4 × 1,024 in
fp32 on CPU.

    python bench/lm_loss.py [--tokens N] [--d 768] [--vocab 32768] [--repeats 5] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import statistics
import time

import torch
import torch.nn.functional as F

from moe_core.loss import fused_linear_cross_entropy, liger_available, linear_cross_entropy


def plain(h, w, t):
    return F.cross_entropy((h @ w.t()).float(), t)


PATHS = {"plain": plain, "chunked": linear_cross_entropy,
         "fused": fused_linear_cross_entropy}  # Liger FLCE (model.fused_head): CUDA only


def measure(name: str, n: int, d: int, vocab: int, repeats: int, device: str) -> dict:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    h = (torch.randn(n, d, generator=g, device=device) * 0.5).to(dtype).requires_grad_()
    w = (torch.randn(vocab, d, generator=g, device=device) * 0.02).to(dtype).requires_grad_()
    t = torch.randint(0, vocab, (n,), generator=g, device=device)
    fn = PATHS[name]

    def step():
        h.grad = w.grad = None
        fn(h, w, t).backward()
        if device == "cuda":
            torch.cuda.synchronize()

    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    step()  # warm-up, and the peak
    peak = (torch.cuda.max_memory_allocated() if device == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) - base
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"path": name, "time_s": statistics.median(times), "peak_extra_gib": peak / 2**30}


def _child(args, q):
    q.put(measure(*args))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    n = a.tokens or (32 * 1024 if a.device == "cuda" else 4 * 1024)
    rows = {}
    fused = a.device == "cuda" and liger_available()
    for name in ("plain", "chunked", "fused") if fused else ("plain", "chunked"):
        args = (name, n, a.d, a.vocab, a.repeats, a.device)
        if a.device == "cuda":
            rows[name] = measure(*args)
        else:  # a fresh process per path: peak RSS only grows
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            p = ctx.Process(target=_child, args=(args, q))
            p.start()
            rows[name] = q.get()
            p.join()
        r = rows[name]
        print(f"{name:>8}: {r['time_s'] * 1e3:8.1f} ms fwd+bwd   "
              f"peak +{r['peak_extra_gib']:.2f} GiB", flush=True)
    out = {"bench": "lm_loss", "device": a.device, "tokens": n, "d": a.d, "vocab": a.vocab,
           "dtype": "bf16" if a.device == "cuda" else "fp32", "rows": rows,
           "chunked_vs_plain_time": rows["chunked"]["time_s"] / rows["plain"]["time_s"],
           "chunked_vs_plain_peak": rows["chunked"]["peak_extra_gib"]
           / max(rows["plain"]["peak_extra_gib"], 1e-9)}
    if fused:
        out["fused_vs_chunked_time"] = rows["fused"]["time_s"] / rows["chunked"]["time_s"]
        out["fused_vs_plain_peak"] = (rows["fused"]["peak_extra_gib"]
                                      / max(rows["plain"]["peak_extra_gib"], 1e-9))
    print(f"chunked / plain: time {out['chunked_vs_plain_time']:.2f}x, "
          f"peak memory {out['chunked_vs_plain_peak']:.2f}x")
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""LM head + cross-entropy, forward+backward: the plain path (logits, their fp32 copy,
``F.cross_entropy``), ``moe_core.loss.linear_cross_entropy`` (``model.chunked_loss``) and, when
``liger_kernel`` imports, Liger's ``LigerFusedLinearCrossEntropyLoss`` (the fused head of the
``gpu`` extra). Same inputs for all; each path's loss and gradients are compared with the plain
path's, so a fast but wrong head shows.

Prints median time, the peak memory each path adds over its inputs (CUDA only), and one JSON
line. Defaults: the 0.1B preset's width (768), a 32,768-word vocabulary, 32 × 1,024 tokens in
bf16 on CUDA; on CPU fp32 and small sizes. Liger needs Triton: on CPU it runs only under
``TRITON_INTERPRET=1`` (slowly; the rehearsal's tiny sizes), else it is reported as skipped.

    python bench/head.py [--tokens N] [--d 768] [--vocab 32768] [--repeats 5] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

from moe_core.loss import linear_cross_entropy


def plain(h, w, t):
    return F.cross_entropy((h @ w.t()).float(), t)


def liger_path(device: str):
    """Liger's fused linear cross-entropy, or (None, why) when it cannot run here."""
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return None, "needs CUDA (or TRITON_INTERPRET=1 on CPU)"
    try:
        from liger_kernel.transformers.fused_linear_cross_entropy import (
            LigerFusedLinearCrossEntropyLoss,
        )
    except Exception as e:  # noqa: BLE001 -- not installed, or no Triton
        return None, f"liger_kernel not importable ({type(e).__name__})"
    loss = LigerFusedLinearCrossEntropyLoss()
    return (lambda h, w, t: loss(w, h, t)), None


def measure(fn, h, w, t, repeats: int, device: str) -> dict:
    h = h.detach().clone().requires_grad_()
    w = w.detach().clone().requires_grad_()

    def step():
        h.grad = w.grad = None
        loss = fn(h, w, t)
        loss.backward()
        if device == "cuda":
            torch.cuda.synchronize()
        return loss

    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    loss = step()  # warm-up (and the peak)
    out = {"loss": float(loss), "grads": (h.grad.float(), w.grad.float())}
    if device == "cuda":
        out["peak_extra_gib"] = (torch.cuda.max_memory_allocated() - base) / 2**30
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    out["time_s"] = statistics.median(times)
    return out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    dev = a.device
    n = a.tokens or (32 * 1024 if dev == "cuda" else 2 * 1024)
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    g = torch.Generator(device=dev).manual_seed(0)
    h = (torch.randn(n, a.d, generator=g, device=dev) * 0.5).to(dtype)
    w = (torch.randn(a.vocab, a.d, generator=g, device=dev) * 0.02).to(dtype)
    t = torch.randint(0, a.vocab, (n,), generator=g, device=dev)
    paths = {"plain": plain, "chunked": linear_cross_entropy}
    fused, why = liger_path(dev)
    if fused is not None:
        paths["liger"] = fused
    rows, ref = {}, None
    for name, fn in paths.items():
        r = measure(fn, h, w, t, a.repeats, dev)
        gh, gw = r.pop("grads")
        if ref is None:
            ref = (r["loss"], gh, gw)
        r.update(loss_diff=abs(r["loss"] - ref[0]), dh_rel=_rel(gh, ref[1]),
                 dw_rel=_rel(gw, ref[2]))
        rows[name] = r
        print(f"{name:>8}: {r['time_s'] * 1e3:8.1f} ms fwd+bwd"
              + (f"   peak +{r['peak_extra_gib']:.2f} GiB" if "peak_extra_gib" in r else "")
              + f"   |dloss| {r['loss_diff']:.1e} dh {r['dh_rel']:.1e} dw {r['dw_rel']:.1e}",
              flush=True)
    out = {"bench": "head", "device": dev, "tokens": n, "d": a.d, "vocab": a.vocab,
           "dtype": str(dtype).removeprefix("torch."), "rows": rows,
           "liger": "measured" if fused is not None else f"skipped: {why}",
           **{f"{k}_vs_plain_time": rows[k]["time_s"] / rows["plain"]["time_s"]
              for k in rows if k != "plain"}}
    print(json.dumps(out))


if __name__ == "__main__":
    main()

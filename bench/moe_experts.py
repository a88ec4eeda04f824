"""Fine-grained experts (E >= 64): Liger's fused MoE (``LigerFusedMoEFunction``, liger-kernel
0.8.5: gather + gate/up GEMM + SwiGLU fused, atomic-free weighted combine) against grouped
matmul (``torch._grouped_mm``) plus a compiled SwiGLU, forward + backward, per shape; prints
which is faster for each shape (``choice``), the per-shape selection of the MoE layer's
``moe.experts_kernel: auto``, and with ``--record`` writes it to the table ``auto`` reads
(``moe_core/moe/kernel_choice.json``; ``moe_core.moe.kernel_choice``).

Both sides start from the same tokens [T, d], top-K expert ids and weights [T, K], and end with
the [T, d] weighted sum, so routing metadata, the gather and the combine are inside both
timings. Grouped side: sort the T·K assignments by expert, counts by ``searchsorted`` (no host
sync), ``_grouped_mm`` for gate, up and down, the SwiGLU and the routing weight in one
``torch.compile``d function, ``index_copy`` back to token order and a sum over K (as
``moe_core.moe.layer.combine``). Weights are the project's [E, d, f] / [E, f, d]. Liger's side
is the layer's own ``moe_core.moe.layer.liger_experts``, which builds Liger's layout ([E, 2f, d]
gate‖up, [E, d, f]) from them in every call, as the layer pays it (``liger_s``, the time
``choice`` uses); ``liger_prelaid_s`` (CUDA) times Liger with that layout built once, outside
the timing (what the layout copies cost).

FLOPs (matmuls, forward + backward = 3 × forward): 18·T·K·d·f.

Liger's kernels are Triton: they run on CUDA. On a CPU only the grouped side is timed (Liger
is reported "not measured"), unless the Triton interpreter is on (``TRITON_INTERPRET=1`` and
``LIGER_FUSED_MOE_AUTOTUNE=0`` set before Python starts; the rehearsal of
``bench/gpu_session.sh``, with ``--shapes tiny``), whose times say nothing about a GPU: a CPU
row's ``choice`` is always ``grouped``. ``--check`` runs both once at a tiny shape under the
interpreter (or on CUDA) and compares outputs and gradients, so the comparison on a GPU
compares equal maths. The GPU comparison is the ``experts`` step of ``bench/gpu_session.sh``.

``--record PATH`` merges this run's CUDA rows (both sides timed) into the table at PATH (created
if absent; by default the committed table); a CPU run records nothing. ``--merge FILE`` merges
the entries of another table (a GPU session's ``$OUT/kernel_choice.json``) into PATH and
measures nothing: after a session, ``python bench/moe_experts.py --merge
gpu_out/kernel_choice.json`` fills the committed table.

    python bench/moe_experts.py [--device cpu|cuda] [--tokens T] [--repeats 5] [--check]
                                [--shapes default|tiny] [--record [PATH]] [--merge FILE]

Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

from moe_core.moe import kernel_choice as kc
from moe_core.moe.layer import liger_experts

CPU_SHAPES = {"fine E64": dict(d=256, f=128, E=64, K=8),
              "qwen-like E128": dict(d=256, f=96, E=128, K=8)}
CUDA_SHAPES = {"fine E64": dict(d=2048, f=1024, E=64, K=8),
               "Qwen3-30B-A3B E128": dict(d=2048, f=768, E=128, K=8),
               "0.1B G8 E64": dict(d=640, f=320, E=64, K=8)}
TINY_SHAPES = {"tiny E8": dict(d=32, f=16, E=8, K=2)}


def _act(g: torch.Tensor, u: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return F.silu(g) * u * s.unsqueeze(-1).to(g.dtype)


_ACT = {"fn": _act, "compiled": False}


def compile_act() -> bool:
    """The SwiGLU and routing scale as one compiled kernel (eager if compilation fails)."""
    try:
        fn = torch.compile(_act, dynamic=True)
        g = torch.randn(4, 8)
        fn(g, g, torch.ones(4))
        _ACT.update(fn=fn, compiled=True)
    except Exception as e:  # noqa: BLE001 -- no compiler: eager, and say so
        print(f"torch.compile failed ({type(e).__name__}); the SwiGLU runs eager")
    return _ACT["compiled"]


def grouped(x, idx, w, wg, wu, wd):
    """[T, d] = sum_k w[t, k] · SwiGLU_{idx[t, k]}(x[t]) by grouped matmul."""
    T, K = idx.shape
    E = wg.shape[0]
    flat = idx.flatten()
    order = torch.argsort(flat, stable=True)  # slot t·K + k, in expert order
    sorted_ids = flat[order]
    bounds = torch.searchsorted(sorted_ids, torch.arange(E + 1, device=x.device))
    offs = bounds[1:].to(torch.int32)
    xs = x.index_select(0, order // K)
    h = _ACT["fn"](torch._grouped_mm(xs, wg, offs=offs), torch._grouped_mm(xs, wu, offs=offs),
                   w.flatten()[order])
    y = torch._grouped_mm(h, wd, offs=offs)
    return y.new_empty((T * K, y.shape[1])).index_copy(0, order, y).view(T, K, -1).sum(1)


def liger(x, idx, w, gate_up, down):
    """Liger on weights already in its layout (``liger_prelaid_s``)."""
    from liger_kernel.ops.fused_moe import LigerFusedMoEFunction

    return LigerFusedMoEFunction.apply(x, gate_up, down, idx.to(torch.int32), w)


def liger_runs(device: str) -> bool:
    return kc.liger_available() and (device == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")


def make(shape: dict, T: int, device: str, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    d, f, E, K = shape["d"], shape["f"], shape["E"], shape["K"]
    x = torch.randn(T, d, generator=g).to(device, dtype)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).to(device)
    w = torch.softmax(torch.randn(T, K, generator=g), -1).to(device, dtype)
    wg, wu = ((torch.randn(E, d, f, generator=g) * d ** -0.5).to(device, dtype)
              for _ in range(2))
    wd = (torch.randn(E, f, d, generator=g) * f ** -0.5).to(device, dtype)
    return x, idx, w, wg, wu, wd


def liger_weights(wg, wu, wd):
    """Liger's layout: gate_up [E, 2f, d] (gate rows first), down [E, d, f]."""
    return (torch.cat([wg.transpose(1, 2), wu.transpose(1, 2)], 1).contiguous(),
            wd.transpose(1, 2).contiguous())


def fwd_bwd(fn, x, w, weights, gy):
    x = x.detach().requires_grad_()
    ws = [t.detach().requires_grad_() for t in weights]
    y = fn(x, w, ws)
    y.backward(gy)
    return y.detach(), x.grad, [t.grad for t in ws]


def time_it(fn, device: str, repeats: int) -> float:
    fn()  # warm-up (compiles, autotunes)
    out = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def check() -> dict:
    """Liger vs grouped at a tiny shape, fp32, under the Triton interpreter."""
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        raise SystemExit("--check on a CPU needs TRITON_INTERPRET=1 set before Python starts")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu":  # the interpreter has no device to autotune on: liger's escape hatch
        os.environ.setdefault("LIGER_FUSED_MOE_AUTOTUNE", "0")
    x, idx, w, wg, wu, wd = make(dict(d=32, f=16, E=8, K=2), 24, dev, torch.float32)
    gy = torch.randn_like(x)
    ref = fwd_bwd(lambda x, w, ws: grouped(x, idx, w, *ws), x, w, (wg, wu, wd), gy)
    got = fwd_bwd(lambda x, w, ws: liger_experts(x, idx, w, *ws), x, w, (wg, wu, wd), gy)
    rel = lambda a, b: float((a - b).abs().max() / b.abs().max())  # noqa: E731
    return {"y": rel(got[0], ref[0]), "dx": rel(got[1], ref[1]),
            **{f"d_{n}": rel(a, b) for n, a, b in zip(("gate", "up", "down"), got[2], ref[2])}}


def bench_shape(name: str, shape: dict, T: int, device: str, dtype, repeats: int) -> dict:
    x, idx, w, wg, wu, wd = make(shape, T, device, dtype)
    gy = torch.randn_like(x)
    flops = 18 * T * shape["K"] * shape["d"] * shape["f"]
    row = {"shape": name, **shape, "tokens": T}
    t = time_it(lambda: fwd_bwd(lambda x, w, ws: grouped(x, idx, w, *ws), x, w,
                                (wg, wu, wd), gy), device, repeats)
    row["grouped_s"], row["grouped_tflops"] = round(t, 5), round(flops / t / 1e12, 3)
    if liger_runs(device):
        gu, dn = liger_weights(wg, wu, wd)
        try:
            t = time_it(lambda: fwd_bwd(lambda x, w, ws: liger_experts(x, idx, w, *ws), x, w,
                                        (wg, wu, wd), gy), device, repeats)
            row["liger_s"], row["liger_tflops"] = round(t, 5), round(flops / t / 1e12, 3)
            if device == "cuda":  # (the interpreter's times say nothing of the copies)
                t = time_it(lambda: fwd_bwd(lambda x, w, ws: liger(x, idx, w, *ws), x, w,
                                            (gu, dn), gy), device, repeats)
                row["liger_prelaid_s"] = round(t, 5)
        except Exception as e:  # noqa: BLE001 -- reported, the grouped side still stands
            row["liger_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    else:
        row["liger_s"] = "not measured (Triton kernels need CUDA)"
    liger_t = row.get("liger_s")
    row["choice"] = ("liger" if device == "cuda" and isinstance(liger_t, float)
                     and liger_t < row["grouped_s"] else "grouped")
    return row


def table_entries(rows: list[dict], device_name: str, dtype: str, date: str) -> list[dict]:
    """The kernel-choice entries of a CUDA run's rows where both sides were timed."""
    keep = ("E", "K", "d", "f", "tokens", "grouped_s", "liger_s", "liger_prelaid_s", "choice")
    return [{"device": kc.device_class(device_name), "device_name": device_name,
             "dtype": dtype, "date": date, **{k: r[k] for k in keep if k in r}}
            for r in rows if isinstance(r.get("liger_s"), float)]


def record(path: str, new: list[dict]) -> int:
    """Merge ``new`` into the table at ``path`` (created if absent); returns its size."""
    old = kc.load_table(path) if os.path.exists(path) else []
    entries = kc.merge(old, new)
    kc.write_table(path, entries)
    return len(entries)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--shapes", choices=("default", "tiny"), default="default")
    ap.add_argument("--record", nargs="?", const=str(kc.TABLE), default=None, metavar="PATH")
    ap.add_argument("--merge", default=None, metavar="FILE")
    a = ap.parse_args()
    if a.merge:
        path = a.record or str(kc.TABLE)
        n = record(path, kc.load_table(a.merge))
        print(json.dumps({"bench": "moe_experts", "merged": a.merge, "table": path,
                          "entries": n}))
        return
    out: dict = {"bench": "moe_experts", "device": a.device}
    if a.check and not kc.liger_available():
        out["check_rel_err"] = "not run: liger-kernel and triton are not installed"
    elif a.check:
        out["check_rel_err"] = check()
        print("liger vs grouped, tiny shape, fp32:", out["check_rel_err"])
    cuda = a.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    T = a.tokens or (16384 if cuda else 2048)
    out.update(dtype=str(dtype).replace("torch.", ""), tokens=T,
               compiled_swiglu=compile_act(), torch_threads=torch.get_num_threads())
    shapes = TINY_SHAPES if a.shapes == "tiny" else CUDA_SHAPES if cuda else CPU_SHAPES
    rows = [bench_shape(n, s, T, a.device, dtype, a.repeats) for n, s in shapes.items()]
    for r in rows:
        print(f"{r['shape']:20} grouped {r['grouped_s']} s ({r['grouped_tflops']} TFLOP/s)  "
              f"liger {r.get('liger_s', r.get('liger_error'))}  -> {r['choice']}")
    out["per_shape"] = rows
    if a.record:
        name = torch.cuda.get_device_name() if cuda else "cpu"
        today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
        # a CPU time says nothing about a GPU: nothing recorded
        new = table_entries(rows, name, out["dtype"], today) if cuda else []
        out["recorded"] = {"table": a.record, "new": len(new), "entries": record(a.record, new)}
        print(f"recorded {len(new)} entries in {a.record}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()

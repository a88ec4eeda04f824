"""``python -m analysis.decide --plan --from-pretrained DIR --budget-tokens D2``: the proxy
experiment that answers "should I upcycle *my* checkpoint?" before spending its budget.

000 §5 (Eq. 12) writes the upcycled loss as
``L(D1, D2, N1) = A·D1^−α1 · D2^(−α2 + α3·ln D1) + B·N1^−β + E``: the data term has no N1 in
it, so its exponents (α1, α2, α3) and A, fitted on a D1 × D2 grid at a *small* N1 of the same
architecture (000 §5: "provided the MoE architecture is fixed"), hold at your N1. The level
B·N1^−β + E does not transfer from one size: β needs three or more N1 (the β ladder below), E
belongs to the data. D* (Eq. 13) and the compute-optimal split (Eq. 14) need both laws' N1
terms, so they come from the joint fit, never from the proxy's own D*.

The plan: the proxy (a project size preset, about ``ratio`` times smaller than the checkpoint
in non-embedding parameters N1), its D1 × D2 grid (5 × 5, log-spaced up to your D1 and budget,
as ``search_spaces/scaling_d1_d2.yaml``), from-scratch MoE baselines at the same budgets (as
``scaling_d1_d2_baseline.yaml``), a β ladder of the two next smaller presets (3 × 3 grids), each
with its FLOPs (6·N·D, 000 App. A); and every place where your checkpoint lies outside what the
proxy covers, with how far.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from analysis.decide.extrapolation import describe_outside
from analysis.derived import flops_6nd, gpu_hours
from moe_core.config import MoEConfig
from moe_core.errors import FitError
from moe_core.hf_config import DENSE_ARCHS, architecture, read_config
from moe_core.hf_config import model_config as hf_model_config
from moe_core.params import count_params
from moe_core.presets import model_config
from sweeps.plan.cost import sustained_tflops

LADDER = ("15M", "44M", "0.1B", "0.2B", "0.5B", "1B")
"""000 Table 3's dense sizes, the proxies' ladder (CPU presets below them: tiny, debug)."""
CPU_LADDER = ("debug", "tiny")
DECAY_FRAC = 0.1
"""A WSD decay branch's share of its budget (000 App. A.5): what a branch costs beyond the
shared stable run."""
THROUGHPUT_SOURCE = "given"
"""Where the GPU-hours' TFLOP/s came from when ``plan`` is called with a number; the command
line takes it from ``sweeps.plan.cost.sustained_tflops`` (the shipped throughput table: measured
entries for ``--gpu``, else a stated MFU of its peak) and says which."""


@dataclass(frozen=True)
class Proxy:
    """One model of the plan: its preset and parameter counts (non-embedding)."""

    preset: str
    N1: int
    N2: int

    @classmethod
    def of(cls, preset: str, vocab: int, moe: MoEConfig) -> Proxy:
        dense = count_params(model_config(preset, vocab_size=vocab))
        sparse = count_params(model_config(preset, vocab_size=vocab, moe=moe))
        return cls(preset, dense.non_embedding_total, sparse.non_embedding_active)


def log_grid(hi: float, n: int = 5, span: float = 16.0) -> list[int]:
    """``n`` log-spaced token counts from ``hi / span`` to ``hi`` (3 significant digits)."""
    vals = np.geomspace(hi / span, hi, n)
    return [int(float(f"{v:.3g}")) for v in vals]


def grid_flops(n1: float, n2: float, d1s: Sequence[float], d2s: Sequence[float]
               ) -> dict[str, float]:
    """FLOPs of a D1 × D2 grid (000 App. A: 6·N·D): the dense parents (one per D1), the
    upcycled trials trained alone, and as WSD branches of one stable run per parent (each
    other budget adds its decay, ``DECAY_FRAC`` of it)."""
    parents = sum(flops_6nd(n1, d) for d in d1s)
    alone = len(d1s) * sum(flops_6nd(n2, d) for d in d2s)
    top = max(d2s)
    branched = len(d1s) * flops_6nd(n2, top + DECAY_FRAC * (sum(d2s) - top))
    return {"parents": parents, "trials_alone": alone, "trials_branched": branched}


def scratch_flops(n2: float, budgets: Sequence[float]) -> float:
    """From-scratch MoE baselines at ``budgets`` as WSD branches of one stable run."""
    top = max(budgets)
    return flops_6nd(n2, top + DECAY_FRAC * (sum(budgets) - top))


def choose_proxy(target_n1: float, vocab: int, moe: MoEConfig, ratio: float) -> Proxy:
    """The largest preset with N1 ≤ target N1 / ``ratio`` (000's sizes, then CPU presets)."""
    sized = [Proxy.of(p, vocab, moe) for p in (*CPU_LADDER, *LADDER)]
    fits = [p for p in sized if p.N1 <= target_n1 / ratio]
    return max(fits, key=lambda p: p.N1) if fits else min(sized, key=lambda p: p.N1)


def _ladder_below(proxy: Proxy, vocab: int, moe: MoEConfig) -> list[Proxy]:
    order = [*CPU_LADDER, *LADDER]
    i = order.index(proxy.preset)
    return [Proxy.of(p, vocab, moe) for p in order[max(0, i - 2):i]][::-1]


def family(hf: Mapping[str, Any]) -> dict[str, Any]:
    """What of the checkpoint's architecture the proxy keeps (a pre-norm RoPE SwiGLU decoder,
    the MoE's E and top-K) and what it does not (the presets are multi-head, d_ff = 4·d,
    untied, without q/k norms or biases)."""
    cfg = hf_model_config(dict(hf))
    diffs = []
    if cfg.n_kv_heads not in (None, cfg.n_head):
        diffs.append(f"grouped-query attention ({cfg.n_head}:{cfg.n_kv_heads})")
    if cfg.d_ff is not None and cfg.d_ff != 4 * cfg.d_model:
        diffs.append(f"d_ff = {cfg.d_ff / cfg.d_model:.3g}·d_model (presets: 4·d)")
    for flag, name in ((cfg.tie_embeddings, "tied embeddings"), (cfg.qk_norm, "q/k norms"),
                       (cfg.qkv_bias, "q/k/v biases"), (cfg.rope_scaling, "RoPE scaling")):
        if flag:
            diffs.append(name)
    return {"architecture": architecture(hf), "config": cfg, "differs": diffs}


def plan(from_pretrained: str | Path, budget_tokens: float, *, d1: float | None = None,
         experts: int = 8, top_k: int = 2, ratio: float = 10.0,
         max_proxy_tokens: float | None = None, gpu_tflops: float = 400.0,
         price: float | None = None, throughput: str = THROUGHPUT_SOURCE) -> dict[str, Any]:
    """The proxy experiment for the dense checkpoint at ``from_pretrained`` (config.json only),
    to be upcycled to E``experts`` top-``top_k`` and trained ``budget_tokens`` more; ``d1``:
    the tokens it was trained on (not in config.json). ``max_proxy_tokens`` caps the grids'
    token counts (what is left beyond the cap is then extrapolated, and said so)."""
    hf = read_config(from_pretrained)
    arch = architecture(hf)
    if arch not in DENSE_ARCHS:
        raise FitError(f"--from-pretrained {from_pretrained}: {arch} is not a dense checkpoint; "
                       "the plan follows 000's dense → MoE law (an MoE's expert growth is 003's)")
    if not budget_tokens or budget_tokens <= 0:
        raise FitError("--plan needs --budget-tokens D2 > 0 (the tokens you mean to upcycle for)")
    if top_k > experts:
        raise FitError(f"--top-k {top_k} exceeds --experts {experts}")
    fam = family(hf)
    cfg = fam["config"]
    moe = MoEConfig(num_experts=experts, top_k=top_k)
    target = count_params(cfg)
    target_n2 = count_params(dataclasses.replace(cfg, moe=moe)).non_embedding_active
    vocab = cfg.vocab_size
    proxy = choose_proxy(target.non_embedding_total, vocab, moe, ratio)
    cap = max_proxy_tokens or math.inf
    d1_top = min(d1 if d1 else budget_tokens, cap)
    d2_top = min(budget_tokens, cap)
    d1s, d2s = log_grid(d1_top), log_grid(d2_top)
    ladder = _ladder_below(proxy, vocab, moe)
    runs = [_main_runs(proxy, d1s, d2s), *(_ladder_runs(p, d1s, d2s) for p in ladder)]
    total = sum(r["flops"] for r in runs)
    out = {
        "checkpoint": {"path": str(from_pretrained), "architecture": fam["architecture"],
                       "N1": target.non_embedding_total, "N2": target_n2, "D1": d1,
                       "budget_tokens": budget_tokens, "experts": experts, "top_k": top_k},
        "proxy": {"preset": proxy.preset, "N1": proxy.N1, "N2": proxy.N2,
                  "ratio": target.non_embedding_total / proxy.N1,
                  "keeps": "pre-norm RoPE SwiGLU decoder, RMSNorm; the MoE's E and top-K",
                  "differs": fam["differs"]},
        "grid": {"D1": d1s, "D2": d2s, "scratch": d2s},
        "runs": runs,
        "cost": {"flops": total, "gpu_tflops": gpu_tflops, "throughput": throughput,
                 "gpu_hours": gpu_hours(total, gpu_tflops),
                 "price": None if price is None else gpu_hours(total, gpu_tflops) * price},
        "target_cost": {"upcycle_flops": flops_6nd(target_n2, budget_tokens)},
        "extrapolated": _outside_lines(target.non_embedding_total, d1, budget_tokens, proxy,
                                       d1s, d2s),
    }
    out["cost"]["share_of_target"] = total / out["target_cost"]["upcycle_flops"]
    return out


def _main_runs(p: Proxy, d1s: list[int], d2s: list[int]) -> dict[str, Any]:
    g = grid_flops(p.N1, p.N2, d1s, d2s)
    sc = scratch_flops(p.N2, d2s)
    return {"name": f"D1 × D2 grid at {p.preset}", "preset": p.preset, "N1": p.N1, "N2": p.N2,
            "trials": len(d1s) * len(d2s), "parents": len(d1s), "scratch_runs": len(d2s),
            "flops": g["parents"] + g["trials_branched"] + sc,
            "flops_detail": {**g, "scratch": sc},
            "fits": "α1, α2, α3, A of Eq. 8/12 (they transfer); the from-scratch law at this N1"}


def _ladder_runs(p: Proxy, d1s: list[int], d2s: list[int]) -> dict[str, Any]:
    small1, small2 = [d1s[0], d1s[2], d1s[4]], [d2s[0], d2s[2], d2s[4]]
    g = grid_flops(p.N1, p.N2, small1, small2)
    sc = scratch_flops(p.N2, small2)
    return {"name": f"β ladder at {p.preset}", "preset": p.preset, "N1": p.N1, "N2": p.N2,
            "trials": 9, "parents": 3, "scratch_runs": 3,
            "flops": g["parents"] + g["trials_branched"] + sc,
            "flops_detail": {**g, "scratch": sc},
            "fits": "β (B·N1^−β) of Eq. 12 and of the from-scratch law, with the grid's size"}


def _outside_lines(n1: float, d1: float | None, d2: float, proxy: Proxy,
                   d1s: Sequence[int], d2s: Sequence[int]) -> list[str]:
    out = [describe_outside("N1", n1, proxy.N1, proxy.N1, "proxy")]
    if out[0]:
        out[0] += (": the level B·N1^−β + E is extrapolated this far (the β ladder fits β); "
                   "the exponents α are not (Eq. 12's data term has no N1)")
    if d1 is not None:
        out.append(describe_outside("D1", d1, min(d1s), max(d1s), "grid"))
    else:
        out.append("D1: your checkpoint's training tokens are not in config.json (pass --d1); "
                   "the grid's D1 spans the budget's range instead")
    out.append(describe_outside("D2", d2, min(d2s), max(d2s), "grid"))
    return [ln for ln in out if ln]


TRANSFERS = (
    "transfers (000 §5, Eq. 12): the data term A·D1^−α1·D2^(−α2+α3·ln D1) has no N1, so α1, "
    "α2, α3 and A fitted on the proxy's grid hold at your N1 — with the same MoE (E, top-K, "
    "granularity), data and tokenizer, and schedule (WSD, LR policy)",
    "does not transfer: B·N1^−β + E from one size (fit β on the β ladder, ≥ 3 sizes; E is the "
    "data's), the proxy's own D* (Eq. 13 depends on N1 through both laws: compute D* at your "
    "N1 from the joint fit), the compute-optimal split (Eq. 14 needs β), and hyperparameters "
    "tuned on the proxy (LR, aux coefficient: no law covers them)",
)


def format_plan(r: Mapping[str, Any]) -> list[str]:
    """The plan as text lines."""
    c, p, g = r["checkpoint"], r["proxy"], r["grid"]
    lines = [
        f"Proxy plan for {c['path']} ({c['architecture']}, N1 = {c['N1']:.4g} non-embedding; "
        f"upcycled to E{c['experts']} top-{c['top_k']}: N2 = {c['N2']:.4g} active), "
        f"budget D2 = {c['budget_tokens']:.4g} tokens",
        f"proxy: preset {p['preset']} (N1 = {p['N1']:.4g}, N2 = {p['N2']:.4g}; "
        f"{p['ratio']:.3g}x smaller); keeps: {p['keeps']}",
        "proxy differs from your checkpoint in: " + (", ".join(p["differs"]) or "nothing "
                                                      "the presets can express"),
        "D1 grid (dense parents): " + ", ".join(f"{d:,}" for d in g["D1"]),
        "D2 grid (upcycled, WSD branches of one stable run per parent): "
        + ", ".join(f"{d:,}" for d in g["D2"]),
        "from-scratch MoE baselines: " + ", ".join(f"{d:,}" for d in g["scratch"]),
    ]
    for run in r["runs"]:
        lines.append(f"  {run['name']}: {run['trials']} trials, {run['parents']} parents, "
                     f"{run['scratch_runs']} from-scratch runs, {run['flops']:.3g} FLOPs — "
                     f"fits {run['fits']}")
    k = r["cost"]
    lines.append(f"cost: {k['flops']:.3g} FLOPs = {k['share_of_target']:.2%} of upcycling your "
                 f"checkpoint ({r['target_cost']['upcycle_flops']:.3g} FLOPs); "
                 f"{k['gpu_hours']:.3g} GPU-h at {k['gpu_tflops']:g} TFLOP/s "
                 f"({k['throughput']})"
                 + (f", ${k['price']:.3g}" if k["price"] is not None else ""))
    if k["share_of_target"] > 0.1:
        lines.append("cheaper: --max-proxy-tokens caps the grids (Eq. 12's data term is in "
                     "absolute tokens, so the proxy must train on your D1 and D2 to avoid "
                     "extrapolating them); each halving of the cap about halves the cost and "
                     "doubles the factor below")
    lines += [*TRANSFERS]
    lines.append("extrapolated: " + ("; ".join(r["extrapolated"]) or "nothing (the grid covers "
                                     "your D1 and budget, and N1 is the proxy's)"))
    d1 = "D1" if c["D1"] is None else f"{c['D1']:.4g}"
    lines.append("then: python -m analysis.decide RESULTS --baseline BASELINE --n1 "
                 f"{c['N1']:.4g} --d1 {d1} --budget-tokens {c['budget_tokens']:.4g} "
                 "(the joint fit over the proxy and the β ladder)")
    return lines


def add_plan_args(ap: Any) -> None:
    """``analysis.decide``'s ``--plan`` options (with its --d1, --budget-tokens,
    --gpu-tflops, --price, --json)."""
    g = ap.add_argument_group("--plan: the proxy experiment for your own checkpoint")
    g.add_argument("--plan", action="store_true",
                   help="propose the proxy experiment (smaller N1, D1 × D2 grid, cost) for "
                        "--from-pretrained, instead of deciding from RESULTS")
    g.add_argument("--from-pretrained", default=None, metavar="DIR",
                   help="your dense checkpoint (a save_pretrained folder; config.json is read)")
    g.add_argument("--experts", type=int, default=8, help="E of the MoE (default 8, 000 §5)")
    g.add_argument("--top-k", type=int, default=2, help="top-K of the MoE (default 2)")
    g.add_argument("--proxy-ratio", type=float, default=10.0,
                   help="the proxy's N1 at most your N1 / this (default 10)")
    g.add_argument("--max-proxy-tokens", type=float, default=None,
                   help="cap the grids' token counts (beyond it: extrapolated, and said so)")


def plan_main(args: Any) -> int:
    """``python -m analysis.decide --plan``."""
    if not args.from_pretrained:
        raise FitError("--plan needs --from-pretrained DIR (your dense checkpoint's folder)")
    if args.budget_flops is not None:
        raise FitError("--plan takes --budget-tokens (the D2 you mean to spend), not "
                       "--budget-flops")
    if args.gpu_tflops is None:
        tflops, source = sustained_tflops(args.gpu)
    else:
        tflops, source = args.gpu_tflops, "given: --gpu-tflops"
    r = plan(args.from_pretrained, args.budget_tokens or 0, d1=args.d1, experts=args.experts,
             top_k=args.top_k, ratio=args.proxy_ratio, max_proxy_tokens=args.max_proxy_tokens,
             gpu_tflops=tflops, price=args.price, throughput=source)
    print(json.dumps(r, allow_nan=False) if args.json else "\n".join(format_plan(r)))
    return 0

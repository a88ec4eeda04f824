"""What ``analysis.decide``'s text output says beside its numbers: a prediction beyond
:data:`analysis.decide.MAX_EXTRAPOLATION` times the data is "not meaningful", each cost line names
what it prices and at which model size, and "crossings" and "—" are explained where printed."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from analysis.decide.extrapolation import interval_note

MAX_EXTRAPOLATION = 10.0
"""Beyond this many times the data in D or N (``analysis.decide.extrapolation``), a prediction is
printed as "not meaningful" (its number stays in ``--json``)."""


def _g(v: Any, fmt: str = ".4g") -> str:
    return "—" if v is None else format(v, fmt)


def loss_text(r: Mapping[str, Any], key: str, xf: Mapping[str, float], far: str) -> str | None:
    """"not meaningful beyond N× the data" for a predicted loss evaluated that far outside it;
    None when its number stands."""
    if f"loss.{key}" in (r.get("limits") or {}).get("beyond", ()):
        return f"{far} (evaluated {xf.get(key, 1.0):.3g}× outside it; --json has the number)"
    return None


def legend(r: Mapping[str, Any]) -> list[str]:
    """What "crossings" and "—" mean, said where they are printed."""
    ds, out = r["d_star"], []
    if len(ds["crossings"]) > 1:
        out.append("  crossings: every D2 at which the two laws' predicted losses cross; "
                   "\"→ X\": X is ahead from there on. D* is the crossing the verdict uses.")
    beyond = (r.get("limits") or {}).get("beyond", ())
    if "d_star" not in beyond and ds["value"] is not None and None in ds["ci"]:
        out.append("  —: an interval end with no value: in enough bootstrap fits the laws do not "
                   f"cross in {ds['range'][0]:.0e} … {ds['range'][1]:.0e} tokens (one path wins "
                   "everywhere), so that side is unbounded")
    return out


def cost_lines(r: Mapping[str, Any], far: str) -> list[str]:
    """The cost of each path, each line saying what it prices and at which model size."""
    i, c = r["inputs"], r["cost"]
    at = (r.get("limits") or {}).get("priced_at") or {"N2_active": i["N2"]}

    def priced(k: Mapping[str, Any]) -> str:
        return (f"{_g(k['flops'], '.3g')} FLOPs (6·N·D), {_g(k['gpu_hours'], '.3g')} GPU-h at "
                f"{i['gpu_tflops']:.4g} TFLOP/s" + (f", ${k['cost']:.3g}" if k["cost"]
                                                     is not None else ""))
    size = f"the MoE at N2 = {at['N2_active']:.4g} active parameters"
    out = [f"cost of training {size} on D2 = {_g(c['upcycled']['tokens'], '.3g')} tokens "
           f"(upcycled or from scratch: the same MoE, the same tokens, the same cost): "
           f"{priced(c['upcycled'])}"]
    if "fitted_N1" in at and math.isclose(at["fitted_N1"], i["N1"], rel_tol=1e-2):
        out[0] += (f" — priced at the size the laws were fitted at (N1 = {i['N1']:.4g}); "
                   "pass --n1 for another size only with data over several N1")
    if "cost.scratch_to_match" in (r.get("limits") or {}).get("beyond", ()):
        out.append(f"cost from scratch to match the upcycled loss: {far}")
    else:
        k = c["scratch_to_match"]
        out.append(f"cost from scratch to match the upcycled loss ({size}, "
                   f"{_g(k['tokens'], '.3g')} tokens): {priced(k)}")
    return out


def widen_lines(w: Mapping[str, Any]) -> list[str]:
    """The D* interval's widening, said always: its factor, what it did and where it comes from
    (``auto``: calibrated for the noise model; "given": ``--widen F``)."""
    if not w:
        return []
    src = w.get("source", "given")
    if w.get("factor", 1) == 1:
        return [f"D* interval not widened (×1, {src})"]
    return [f"D* interval widened ×{w['factor']:g} ({src}): {w['how']}"]


def _ci(d: Mapping[str, Any], fmt: str = ".4g", factor: float | None = None) -> str:
    """``value  [lo, hi]``, and ``(extrapolated 40x)`` inside it when the law was evaluated
    that far outside its data."""
    lo, hi = d["ci"]
    note = interval_note([factor or 1.0])
    return f"{_g(d['value'], fmt)}  [{_g(lo, fmt)}, {_g(hi, fmt)}]{note}"


def _loss(r: Mapping[str, Any], key: str, xf: Mapping[str, float], far: str) -> str:
    return loss_text(r, key, xf, far) or _ci(r["loss"][key], factor=xf.get(key))


def format_decision(r: Mapping[str, Any]) -> list[str]:
    """The decision as text lines (the CLI's and the report's)."""
    i, lvl = r["inputs"], f"{r['ci_level']:.0%}"
    xf = r.get("extrapolation_factor") or {}
    lim = r.get("limits") or {"beyond": [], "max_extrapolation": MAX_EXTRAPOLATION}
    far = f"not meaningful beyond {lim['max_extrapolation']:g}× the data"
    ds = r["d_star"]
    if "d_star" in lim["beyond"]:
        dline = f"D* (000 Eq. 13): {far} (the laws cross far outside the grid; --json has it)"
    elif ds["value"] is not None:
        dline = f"D* (000 Eq. 13): {_ci(ds, '.3g')} tokens"
    elif ds["winner_everywhere"]:
        dline = (f"D* (000 Eq. 13): no crossing in {ds['range'][0]:.0e} … {ds['range'][1]:.0e} "
                 f"tokens: {ds['winner_everywhere']} wins everywhere")
    else:
        dline = f"D* (000 Eq. 13): none; crossings {ds['crossings']}"
    if len(ds["crossings"]) > 1:
        cross = ", ".join(f"{c['D']:.3g} → {c['to']}" for c in ds["crossings"])
        dline += f" (crossings: {cross})"
    p_win = (f"P(upcycling wins) = {r['p_upcycle_wins']:.2f} ({r['bootstrap']['n']} bootstrap "
             f"fits {'by trial' if 'noise' not in r['bootstrap'] else 'with noise groups'})")
    # far outside the data the share of fits is the laws' evaluated there too: said with them
    verdict = (f"verdict: {far} (the laws, evaluated there, say {r['verdict']}; {p_win} "
               "there)" if {"loss.upcycled", "loss.scratch"} & set(lim["beyond"])
               else f"verdict: {r['verdict']}   {p_win}")
    lines = [
        f"Should I upcycle? N1 = {i['N1']:.4g} dense parameters trained on D1 = {i['D1']:.4g} "
        f"tokens, D2 = {i['D2']:.4g} more tokens (MoE N2 = {i['N2']:.4g} active)",
        verdict,
        *([] if "noise" not in r["bootstrap"] else [
            "noise (parametric, by group): " + "; ".join(
                f"{k} sigma {v['sigma']:.3g} in ln L, ICC {v['icc']:.2f}"
                f"{' (given)' if v['icc_given'] is not None else ''}"
                for k, v in r["bootstrap"]["noise"].items())]),
        *([] if "noise_model" not in r else [
            f"intervals assume: {r['noise_model']['assumes']}",
            f"  why: {r['noise_model']['why']}"]),
        *widen_lines(r.get("widen") or {}),
        f"predicted loss, upcycled:     {_loss(r, 'upcycled', xf, far)}   ({lvl} interval)",
        f"predicted loss, from scratch: {_loss(r, 'scratch', xf, far)}",
        dline, *legend(r),
    ]
    co = r["compute_optimal"]
    lines.append(f"compute-optimal split of C2 = {i['budget_flops']:.3g} FLOPs: "
                 + (f"D2 = {co['D2_opt']:.3g} tokens, N1 = {co['N1_opt']:.3g}" if co["available"]
                    else f"n/a ({co['reason']})"))
    lines += cost_lines(r, far)
    if "gpu_tflops_source" in i:
        lines.append(f"GPU throughput: {i['gpu_tflops']:.4g} TFLOP/s sustained per "
                     f"{i.get('gpu', 'GPU')}, {i['gpu_tflops_source']}")
    lines.append("extrapolated: " + ("; ".join(r["extrapolated"]) or "nothing (every input lies "
                                     "within the data)"))
    return lines

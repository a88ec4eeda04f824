"""What ``analysis.decide``'s text output says beside its numbers: a prediction beyond
:data:`analysis.decide.MAX_EXTRAPOLATION` times the data is "not meaningful", each cost line names
what it prices and at which model size, and "crossings" and "—" are explained where printed."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


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

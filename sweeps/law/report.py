"""The law search's progress and closing lines, and its outcome for the sweep's summary."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sweeps.law.design import CONFIRM


def _target_name(cfg) -> str:
    return {"dstar": "D*", "alpha3": "alpha3"}.get(cfg.target, "L at " + ", ".join(
        f"{k}={v:.3g}" for k, v in cfg.loss_at))


def _num(cfg, v: float | None) -> str:
    if v is None:
        return "inf" if cfg.target == "dstar" else "-"
    return f"{v:.3f}" if cfg.target == "alpha3" else f"{v:.4g}"


def _estimate_text(cfg, e: Mapping[str, Any]) -> str:
    """"D* = …, 90% interval […, …], relative width …" of an estimate (``Estimate.to_dict``)."""
    lo, hi = e["ci"]
    w = e["rel_width"]
    f = float(e.get("widen") or 1.0)
    src = e.get("widen_source") or "given"
    how = "law.widen" if src == "given" else f"law.widen {src.split(' (')[0]}"
    wide = (f" (widened ×{f:g} in ln {_target_name(cfg)}: {how})" if f != 1 else
            "" if src == "given" else f" (not widened: {how})")
    return (f"{_target_name(cfg)} = {_num(cfg, e['value'])}, {cfg.ci:.0%} interval "
            f"[{_num(cfg, lo)}, {_num(cfg, hi)}]{wide}, relative width "
            f"{'unbounded' if w is None else format(w, '.3g')}")


def describe_refit(cfg, h: Mapping[str, Any], narrow: int) -> str:
    """One progress line for a refit (an entry of ``LawDesign.history``)."""
    goal = "" if cfg.ci_width is None else (
        f"; stops at <= {cfg.ci_width:g} on {CONFIRM} refits in a row ({narrow}/{CONFIRM})")
    nz = h.get("noise")
    noise = "" if not nz or nz.get("by") != "groups" else (
        f"; noise {nz['sigma']:.3g} in ln L, ICC {nz['icc']:.2f} "
        f"({'given' if getattr(cfg, 'icc', None) is not None else 'estimated'})")
    return (f"law refit after {h['trials']} trials ({h['flops']:.3g} FLOPs): "
            f"{_estimate_text(cfg, h)}{noise}{goal}")


def outcome(cfg, state: Mapping[str, Any], n_candidates: int) -> dict[str, Any]:
    """How a law search ended (or stands), from its state: why it stopped, its last refit, and
    what it spent (the sweep's summary ``law`` entry)."""
    d = state["design"]
    issued = len(d["observed"]) + len(d["failed"]) + len(d["pending"])
    cap = min(cfg.max_trials or n_candidates, n_candidates)
    last = d["history"][-1] if d["history"] else None
    if int(d.get("narrow", 0)) >= CONFIRM:
        stop = "narrow"  # the interval was narrow enough on CONFIRM refits in a row
    elif d["pending"] or d["queue"]:
        stop = None  # still running (an interrupted sweep)
    elif issued >= cap:
        stop = "max_trials"
    else:
        stop = "exhausted"
    return {"target": cfg.target, "ci": cfg.ci, "ci_width": cfg.ci_width, "stop": stop,
            "widen": float(getattr(cfg, "widen_factor", getattr(cfg, "widen", 1.0))),
            "widen_source": getattr(cfg, "widen_source", "given"),
            "trials": issued, "max_trials": cap, "failed": len(d["failed"]),
            "refits": len(d["history"]), "flops": float(d["spent"]),
            "estimate": None if last is None else {
                **{k: last[k] for k in ("value", "ci", "rel_width", "trials")},
                "widen": last.get("widen", 1.0),
                "widen_source": last.get("widen_source", "given")}}


def describe_outcome(cfg, out: Mapping[str, Any]) -> str:
    """The closing line of a law sweep."""
    why = {"narrow": f"its interval was <= {cfg.ci_width:g} wide on {CONFIRM} refits in a row"
           if cfg.ci_width is not None else "narrow",
           "max_trials": f"max_trials ({out['max_trials']}) reached"
           + ("" if cfg.ci_width is None else
              f" before the interval was <= {cfg.ci_width:g} wide on {CONFIRM} refits in a row"),
           "exhausted": "no candidate left",
           None: "not finished (--resume continues it)"}[out["stop"]]
    e = out["estimate"]
    if e is None:
        return f"law search: no refit yet after {out['trials']} trials; {why}"
    return (f"law search: {_estimate_text(cfg, e)} from {e['trials']} trials; "
            f"{out['trials']} run, {out['flops']:.3g} FLOPs; stopped: {why}")

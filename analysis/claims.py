"""The seeds' claims a shipped sweep can test, each judged from the sweep's own numbers.

A comparison "A beats B on a metric" is paired by seed when both ran the same seeds (see
:func:`compare`); otherwise it is

- **reproduced** when the mean difference is in the claimed direction and larger than the noise
  threshold: twice the standard error of the difference over seeds (Welch), and never less than
  ``FLOOR`` (0.005 nats for losses; 2 % of the values for other statistics) when a configuration
  has a single seed (and never below 0.001 nats, or 0.5 %, with seeds);
- **not reproduced** when it is that large in the other direction;
- **inconclusive** otherwise.

Trends ("grows with λ") use Spearman's ρ over the configurations together with the same
threshold on the difference between the ends of the range.

Which claims a sweep tests follows from the knobs it varies (:data:`RULES`: the LR-policy claims
when ``upcycle.lr_policy`` varies, the top-K claim when ``moe.top_k`` does, ...), whatever the
sweep is called; groups are picked by their knob values, not by their labels.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.sweep import Group, Stat, Sweep

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
FLOOR = 0.005
MIN_LOSS = 0.001  # never call a loss difference below this real, whatever the seeds say


@dataclass
class Claim:
    claim: str
    source: str
    verdict: str
    numbers: str


def _threshold(a: Stat, b: Stat, metric: str) -> float:
    (ma, sa, na), (mb, sb, nb) = (a.mean, a.std, a.n), (b.mean, b.std, b.n)
    scale = max(abs(ma), abs(mb))
    if na > 1 and nb > 1 and math.isfinite(sa) and math.isfinite(sb):
        return max(2 * math.sqrt(sa ** 2 / na + sb ** 2 / nb),
                   MIN_LOSS if "loss" in metric else 0.005 * scale)
    return FLOOR if "loss" in metric else 0.02 * scale


def _by_seed(g: Group, metric: str) -> dict[Any, float]:
    out = {}
    for r in g.rows:
        v, seed = r.get(metric), r.get("seed")
        if seed is None or not isinstance(v, (int, float, np.number)) or not math.isfinite(v):
            continue
        out[seed] = float(v)
    return out if len(out) == len(g.rows) else {}


def compare(better: Group, worse: Group, metric: str = "val_loss",
            higher_is_better: bool = False) -> tuple[str, str]:
    """Verdict and numbers for "``better`` beats ``worse`` on ``metric``".

    When both configurations ran the same seeds (≥ 2), the comparison is paired by seed (a seed
    fixes the parent, the data order and the router initialisation, which move every
    configuration together): reproduced only if every seed's difference has the claimed sign and
    the mean difference exceeds max(2·SE, floor); "not reproduced" mirrors it.
    """
    a, b = better.stat(metric), worse.stat(metric)
    if not (a.finite and b.finite):
        return INCONCLUSIVE, f"{metric} missing"
    sign = 1 if higher_is_better else -1
    fmt = lambda g, s: (f"{g.label}: {s.mean:.4f}"  # noqa: E731
                        + (f" ± {s.std:.4f}" if math.isfinite(s.std) else "") + f" (n={s.n})")
    sa, sb = _by_seed(better, metric), _by_seed(worse, metric)
    common = sorted(set(sa) & set(sb), key=str)
    if len(common) >= 2:
        d = np.array([sign * (sa[k] - sb[k]) for k in common])
        mean = float(d.mean())
        se = float(d.std(ddof=1) / math.sqrt(len(d)))
        floor = MIN_LOSS if "loss" in metric else 0.005 * max(abs(a.mean), abs(b.mean))
        thr = max(2 * se, floor)
        if (d > 0).all() and mean > thr:
            verdict = REPRODUCED
        elif (d < 0).all() and mean < -thr:
            verdict = NOT_REPRODUCED
        else:
            verdict = INCONCLUSIVE
        per = ", ".join(f"{x:+.4f}" for x in d)
        return verdict, (f"{fmt(better, a)}; {fmt(worse, b)}; paired by seed Δ = {mean:+.4f} "
                         f"(per seed {per}; threshold {thr:.4f})")
    diff = sign * (a.mean - b.mean)
    thr = _threshold(a, b, metric)
    verdict = REPRODUCED if diff > thr else NOT_REPRODUCED if diff < -thr else INCONCLUSIVE
    return verdict, f"{fmt(better, a)}; {fmt(worse, b)}; Δ = {diff:+.4f} (threshold {thr:.4f})"


def spearman(x: list[float], y: list[float]) -> float:
    from scipy.stats import spearmanr

    if len(x) < 3:
        return math.nan
    return float(spearmanr(x, y).statistic)


def trend(groups: Sequence[Group], key: Callable[[Group], float], metric: str,
          increasing: bool = True) -> tuple[str, str]:
    """Verdict for "``metric`` grows (or falls) with ``key``"."""
    gs = sorted((g for g in groups if g.stat(metric).finite), key=key)
    if len(gs) < 3:
        return INCONCLUSIVE, f"only {len(gs)} configurations with {metric}"
    xs = [key(g) for g in gs]
    ys = [g.stat(metric).mean for g in gs]
    rho = spearman(xs, ys)
    sign = 1 if increasing else -1
    end = sign * (ys[-1] - ys[0])
    thr = _threshold(gs[-1].stat(metric), gs[0].stat(metric), metric)
    if sign * rho >= 0.8 and end > thr:
        v = REPRODUCED
    elif sign * rho <= -0.5 and end < -thr:
        v = NOT_REPRODUCED
    else:
        v = INCONCLUSIVE
    pts = ", ".join(f"{x:g}: {y:.4g}" for x, y in zip(xs, ys))
    return v, f"ρ = {rho:+.2f}; {pts}; end-to-end Δ = {end:+.4g} (threshold {thr:.4g})"


def _num(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


# ---- claims by the knobs a sweep varies -----------------------------------------------------


def _lr_policy(g: Group) -> Any:
    """The LR policy's name: ``upcycle.lr_policy.policy``, a knob or a key of the
    ``upcycle.lr_policy`` knob."""
    return g.knob("upcycle.lr_policy.policy")


def _upcycle_lr(s: Sweep, **_) -> list[Claim]:
    const = [g for g in s.groups if _lr_policy(g) == "constant"]
    resets = [g for g in s.groups if _lr_policy(g) == "reset"]
    if not const or not resets:
        return []
    best = min(resets, key=lambda g: g.stat("val_loss").mean)
    out = [Claim("Resetting the LR on upcycling beats a constant small LR",
                 "004 §3.2.1 Fig. 5; 000 App. A.6 Fig. 8", *compare(best, const[0]))]
    if any(g.stat("router.cos_to_parent").finite for g in const):
        out.append(Claim("The constant-LR run keeps a higher cosine similarity to the dense "
                         "parent", "004 Fig. 6",
                         *compare(const[0], best, "router.cos_to_parent", higher_is_better=True)))
    return out


def _upcycle_vs_dense(s: Sweep, **_) -> list[Claim]:
    dense = [g for g in s.groups if all(r.get("kind") == "dense" for r in g.rows)]
    moe = [g for g in s.groups if all(r.get("kind") == "upcycled" for r in g.rows)]
    if not dense or not moe:
        return []
    return [Claim("The upcycled MoE beats continued dense training on the same tokens",
                  "004 §3.1 Fig. 4a", *compare(moe[0], dense[0]))]


def _router_order(s: Sweep, **_) -> list[Claim]:
    sm = [g for g in s.groups if g.knob("moe.router.order") == "softmax_topk"]
    tk = [g for g in s.groups if g.knob("moe.router.order") == "topk_softmax"]
    if not sm or not tk:
        return []
    return [Claim("softmax-then-topK beats topK-then-softmax after upcycling", "004 §3.4",
                  *compare(sm[0], tk[0]))]


def _knob_num(path: str) -> Callable[[Group], float]:
    """A group's value of the knob at ``path`` as a number (NaN when null or not numeric)."""
    return lambda g: _num(g.knob(path))


def _gating_lambda(s: Sweep, **_) -> list[Claim]:
    key = _knob_num("moe.router.logit_norm_lambda")
    lam = [g for g in s.groups if math.isfinite(key(g))]
    null = [g for g in s.groups if not math.isfinite(key(g))]
    out = [Claim(f"{m} grows with λ", "002 §4.1 Fig. 3", *trend(lam, key, f"router.{m}"))
           for m in ("max1_max2", "max2_max3")]
    if null:
        res = [compare(g, null[0]) for g in lam]
        vs = [v for v, _ in res]
        v = REPRODUCED if all(x == REPRODUCED for x in vs) else (
            NOT_REPRODUCED if NOT_REPRODUCED in vs else INCONCLUSIVE)
        out.append(Claim("Every λ (normalised gating) has a lower loss than no normalisation",
                         "002 §4.1 Fig. 3", v, " / ".join(n for _, n in res)))
    return out


def _aux_coef(s: Sweep, **_) -> list[Claim]:
    key = _knob_num("moe.router.aux_coef")
    gs = sorted((g for g in s.groups if math.isfinite(key(g))), key=key)
    if len(gs) < 3:
        return []
    smallest, largest = gs[0], gs[-1]
    mid = [g for g in gs if 1e-3 <= key(g) <= 1e-2] or gs[1:-1]
    best = min(gs, key=lambda g: g.stat("val_loss").mean)
    return [
        Claim(f"Too small a coefficient ({key(smallest):g}) imbalances experts (higher max "
              f"expert load than at {key(mid[-1]):g})", "000 App. A.7 Fig. 9; 004 §3.3",
              *compare(mid[-1], smallest, "router.max_load")),
        Claim(f"Too large a coefficient ({key(largest):g}) hurts cross-entropy",
              "000 App. A.7 Fig. 9; 004 §3.3", *compare(best, largest)
              if best is not largest else (NOT_REPRODUCED, f"{largest.label} is the best")),
    ]


def _granularity(s: Sweep, **_) -> list[Claim]:
    key = _knob_num("moe.granularity")
    coarse = [g for g in s.groups if key(g) == 1]
    fine = [g for g in s.groups if key(g) > 1]
    if not coarse or not fine:
        return []
    best = min(fine, key=lambda g: g.stat("val_loss").mean)
    return [Claim("A granular MoE (virtual-group upcycling) beats the coarse E8G1T2 at the same "
                  "active FLOPs", "004 §3.6", *compare(best, coarse[0]))]


def _top_k(s: Sweep, **_) -> list[Claim]:
    key = _knob_num("moe.top_k")
    k1 = [g for g in s.groups if key(g) == 1]
    k2 = [g for g in s.groups if key(g) == 2]
    if not k1 or not k2:
        return []
    return [Claim("Top-2 beats top-1 after upcycling", "004 §3.7", *compare(k2[0], k1[0]))]


def _gap_claim(ok: list[dict]) -> Claim:
    """η measures how much of the Fixed-E → Fixed-mE gap upcycling closes: it needs a gap."""
    gaps = {r["T"]: r["L_fixed_E"] - r["L_fixed_mE"] for r in ok}
    gv = (REPRODUCED if all(g > MIN_LOSS for g in gaps.values()) else
          NOT_REPRODUCED if all(g < -MIN_LOSS for g in gaps.values()) else INCONCLUSIVE)
    E, mE = ok[0]["E"], ok[0]["mE"]
    return Claim(f"From scratch, {mE:g} experts beat {E:g} at the same tokens (the gap η measures)",
                 "003 §5.1, Fig. 1", gv, ", ".join(
                     f"T={t:,.0f}: L(Fixed-{E:g}) − L(Fixed-{mE:g}) = {g:+.4f}"
                     for t, g in sorted(gaps.items())))


def _eta_trend_claims(ok: list[dict], vary: str) -> list[Claim]:
    """Per duplication strategy: η against τ/T (``vary="tau"``) or CPT/τ (``"cpt"``)."""
    out = []
    for strat in sorted({r["strategy"] for r in ok}):
        sub = sorted((r for r in ok if r["strategy"] == strat), key=lambda r: r[vary])
        if len(sub) < 3:
            continue
        xs = [r["tau"] / r["T"] if vary == "tau" else r["cpt"] / r["tau"] for r in sub]
        ys = [r["eta"] for r in sub]
        rho = spearman(xs, ys)
        want = -1 if vary == "tau" else 1
        v = _rho_only(rho, want)
        name = "τ/T" if vary == "tau" else "CPT/τ"
        text = ("η falls as the transition comes later (less CPT) at a fixed total budget"
                if vary == "tau" else "η rises with the CPT budget")
        out.append(Claim(f"{text} ({strat})", "003 Table 3a" if vary == "tau" else
                         "003 Table 3b", v, f"ρ = {rho:+.2f}; " + ", ".join(
                             f"{name}={x:.2f}: η={y:.2f}" for x, y in zip(xs, ys))))
    return out


def _utility_claim(ok: list[dict]) -> Claim | None:
    """The best non-uniform duplication strategy against uniform, paired by (τ, CPT)."""
    by = {st: [r["eta"] for r in ok if r["strategy"] == st] for st in {r["strategy"] for r in ok}}
    if "uniform" not in by or len(by) < 2:
        return None
    util = max((k for k in by if k != "uniform"), key=lambda k: np.mean(by[k]))
    d = float(np.mean(by[util]) - np.mean(by["uniform"]))
    pair = [(a, b) for a, b in zip(
        sorted((r for r in ok if r["strategy"] == util), key=lambda r: (r["tau"], r["cpt"])),
        sorted((r for r in ok if r["strategy"] == "uniform"),
               key=lambda r: (r["tau"], r["cpt"])))]
    wins = sum(a["eta"] > b["eta"] for a, b in pair)
    v = REPRODUCED if wins == len(pair) and d > 0 else NOT_REPRODUCED if wins == 0 \
        else INCONCLUSIVE
    return Claim(f"Utility-based duplication ({util}) beats uniform", "003 Table 4", v,
                 f"mean η {util} {np.mean(by[util]):.2f} vs uniform "
                 f"{np.mean(by['uniform']):.2f}; wins {wins}/{len(pair)} paired points")


def _eta_claims(rows: list[dict], vary: str) -> list[Claim]:
    ok = [r for r in rows if math.isfinite(r["eta"])]
    if not ok:
        return []
    out = [_gap_claim(ok)]
    if out[0].verdict != REPRODUCED:
        out.append(Claim("η (expert upcycling efficiency) trends", "003 Tables 3–4", INCONCLUSIVE,
                         "η is not defined where the larger from-scratch MoE is not better: the "
                         "table's η values are not efficiencies at this scale"))
        return out
    out += _eta_trend_claims(ok, vary)
    util = _utility_claim(ok)
    return out + ([util] if util else [])


def _transition(s: Sweep, efficiency=(), transition=(), **_) -> list[Claim]:
    """Expert upcycling (``upcycle.method: expand_experts``, 003) at several τ or CPT budgets:
    the warm start at the transition, and η's trends."""
    out = []
    expanded = [r for r in transition if r.get("method") == "expand_experts"]
    if expanded:
        jumps = [r["jump"] for r in expanded]
        v = (REPRODUCED if all(abs(j) < 1e-2 for j in jumps) else
             NOT_REPRODUCED if all(j > 1e-2 for j in jumps) else INCONCLUSIVE)
        out.append(Claim("Expert upcycling is a warm start: the loss right after expansion is "
                         "within 1e-2 of the parent's", "003 Def. 3.1, §3.2", v,
                         ", ".join(f"{r['label']}: {r['jump']:+.3f}" for r in expanded)))
    rows = list(efficiency)
    if not rows:
        return out
    taus = {r["tau"] for r in rows}
    return out + _eta_claims(rows, "tau" if len(taus) > 1 else "cpt")


def _scaling(s: Sweep, law_info=None, **_) -> list[Claim]:
    if not law_info:
        return []
    fits = law_info["fits"]

    def verdict(unit: str) -> tuple[str, str]:
        loo = {n: f["loo_rms"][unit] for n, f in fits.items()}
        ordered = sorted(loo, key=loo.get)
        runner = ordered[1] if len(ordered) > 1 else ordered[0]
        margin = (loo[runner] - loo[ordered[0]]) / loo[ordered[0]] if len(ordered) > 1 else 0
        v = (REPRODUCED if ordered[0] == "upcycled_mul" and margin > 0.05 else
             INCONCLUSIVE if ordered[0] == "upcycled_mul" or loo.get("upcycled_mul", math.inf)
             <= 1.05 * loo[ordered[0]] else NOT_REPRODUCED)
        return v, f"{unit}: " + ", ".join(f"{n} {loo[n]:.4g}" for n in ordered)

    (v_ln, t_ln), (v_nats, t_nats) = verdict("ln"), verdict("nats")
    v = v_ln if v_ln == v_nats else INCONCLUSIVE
    out = [Claim("The multiplicative law with interaction (Eq. 8) has the lowest leave-one-out "
                 "RMS (in ln-loss and in nats; a lead under 5 % is a tie)", "000 Table 1", v,
                 f"{t_ln}; {t_nats}")]
    per = law_info.get("per_d1") or []
    if len(per) >= 3:
        d1 = [p[0] for p in per]
        out.append(Claim("A larger D1 lowers the loss at the start of upcycling", "000 §3.3",
                         *_rho_verdict(spearman(d1, [p[1] for p in per]), -1,
                                       d1, [p[1] for p in per], "L at min D2")))
        out.append(Claim("A larger D1 shrinks the D2 exponent (slope of ln L in ln D2)",
                         "000 §3.3, Eq. 10", *_rho_verdict(spearman(d1, [p[3] for p in per]), -1,
                                                           d1, [p[3] for p in per], "−slope")))
    mul = fits.get("upcycled_mul")
    if mul and mul.get("ci") and "alpha3" in mul["ci"]:
        lo, hi = mul["ci"]["alpha3"]
        a3 = mul["params"]["alpha3"]
        v = REPRODUCED if lo > 0 else NOT_REPRODUCED if hi < 0 else INCONCLUSIVE
        out.append(Claim("The interaction term is positive (α3 > 0)", "000 Eq. 8, Table 2", v,
                         f"α3 = {a3:.3g}, 95 % bootstrap interval [{lo:.3g}, {hi:.3g}]"))
    return out


def _rho_only(rho: float, want: int) -> str:
    """A rank trend alone: |ρ| ≥ 0.8 in the claimed direction reproduces, ρ ≤ −0.5 against it
    refutes (for trends without a per-point noise estimate)."""
    return (REPRODUCED if want * rho >= 0.8 else NOT_REPRODUCED if want * rho <= -0.5
            else INCONCLUSIVE)


def _rho_verdict(rho: float, want: int, xs, ys, name: str) -> tuple[str, str]:
    return _rho_only(rho, want), f"ρ = {rho:+.2f}; " + ", ".join(f"D1={x:,.0f}: {name} {y:.4g}"
                                              for x, y in zip(xs, ys))


@dataclass(frozen=True)
class Rule:
    """The claims ``test`` makes, for a sweep that varies any of ``knobs`` (every one of them
    with ``every``): YAML paths, a key inside a dict-valued knob included."""

    knobs: tuple[str, ...]
    test: Callable[..., list[Claim]]
    every: bool = False

    def applies(self, s: Sweep) -> bool:
        hits = [s.varies(k) for k in self.knobs]
        return all(hits) if self.every else any(hits)


RULES: tuple[Rule, ...] = (
    Rule(("upcycle.lr_policy.policy",), _upcycle_lr),
    Rule(("moe", "upcycle.method"), _upcycle_vs_dense),  # dense (moe: null) against an MoE
    Rule(("moe.router.order",), _router_order),
    Rule(("moe.router.logit_norm_lambda",), _gating_lambda),
    Rule(("moe.router.aux_coef",), _aux_coef),
    Rule(("moe.granularity",), _granularity),
    Rule(("moe.top_k",), _top_k),
    Rule(("parent.tokens", "tokens"), _transition),  # τ or the CPT budget (003 Table 3)
    Rule(("parent.tokens", "tokens"), _scaling, every=True),  # the D1 × D2 grid (000 §4.1)
)


def evaluate_claims(s: Sweep, *, law_info: dict | None = None,
                    efficiency: list[dict] | None = None,
                    transition: list[dict] | None = None) -> list[Claim]:
    """The claims of every rule whose knobs the sweep varies (whatever the sweep's name)."""
    out: list[Claim] = []
    for rule in RULES:
        if rule.applies(s):
            out += rule.test(s, law_info=law_info, efficiency=efficiency or [],
                             transition=transition or [])
    return out

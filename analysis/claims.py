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

**A claim about a knob holds the rest of the design fixed.** When a sweep varies other knobs too
(aux coefficient × top-K), the claim is judged within each stratum of cells that are equal on
every other varied knob (:func:`strata`), reported per stratum and pooled; cells of different
strata are never compared. A knob whose value follows the claim's knob in every cell (the expert
count and top-K of a granularity sweep, which keep the active FLOPs fixed) is part of the
treatment, not a stratum, and the claim says so.

**One seed is no evidence of a difference.** A comparison of configurations that ran one seed
each is ``needs ≥ 2 seeds`` unless the per-trial noise is stated (``seed_noise``: the standard
deviation of a trial's final loss, e.g. from ``python -m analysis.noise``, given to
``analysis.report --seed-noise``); the threshold is then twice the standard error of the
difference under that noise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from analysis.sweep import Group, Stat, Sweep, _short_names, format_knob

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
NEEDS_SEEDS = "needs ≥ 2 seeds"
FLOOR = 0.005
MIN_LOSS = 0.001  # never call a loss difference below this real, whatever the seeds say


@dataclass
class Claim:
    claim: str
    source: str
    verdict: str
    numbers: str
    stratum: str | None = None
    """The other varied knobs' values this verdict held fixed (``top_k=2``); None when the sweep
    varies nothing else, or for the verdict pooled over every stratum."""


def _threshold(a: Stat, b: Stat, metric: str, seed_noise: float | None = None) -> float | None:
    """max(2·SE of the difference, floor); None when a side has one seed and no noise is
    stated (no estimate of the noise: ``needs ≥ 2 seeds``)."""
    (ma, sa, na), (mb, sb, nb) = (a.mean, a.std, a.n), (b.mean, b.std, b.n)
    scale = max(abs(ma), abs(mb))
    floor = MIN_LOSS if "loss" in metric else 0.005 * scale
    if na > 1 and nb > 1 and math.isfinite(sa) and math.isfinite(sb):
        return max(2 * math.sqrt(sa ** 2 / na + sb ** 2 / nb), floor)
    if seed_noise is None or "loss" not in metric:
        return None
    return max(2 * seed_noise * math.sqrt(1 / na + 1 / nb), FLOOR)


def _by_seed(g: Group, metric: str) -> dict[Any, float]:
    out = {}
    for r in g.rows:
        v, seed = r.get(metric), r.get("seed")
        if seed is None or not isinstance(v, (int, float, np.number)) or not math.isfinite(v):
            continue
        out[seed] = float(v)
    return out if len(out) == len(g.rows) else {}


def paired_verdict(d: np.ndarray, floor: float) -> tuple[str, float, float]:
    """The paired-by-seed rule on per-seed differences ``d`` (claimed direction positive, ≥ 2
    seeds): reproduced only if every seed agrees in sign and the mean exceeds max(2·SE, floor);
    not reproduced mirrors it; else inconclusive. Returns (verdict, mean, threshold)."""
    mean = float(d.mean())
    thr = max(2 * float(d.std(ddof=1) / math.sqrt(len(d))), floor)
    if (d > 0).all() and mean > thr:
        return REPRODUCED, mean, thr
    if (d < 0).all() and mean < -thr:
        return NOT_REPRODUCED, mean, thr
    return INCONCLUSIVE, mean, thr


def compare(better: Group, worse: Group, metric: str = "val_loss",
            higher_is_better: bool = False, seed_noise: float | None = None) -> tuple[str, str]:
    """Verdict and numbers for "``better`` beats ``worse`` on ``metric``".

    When both configurations ran the same seeds (≥ 2), the comparison is paired by seed (a seed
    fixes the parent, the data order and the router initialisation, which move every
    configuration together): reproduced only if every seed's difference has the claimed sign and
    the mean difference exceeds max(2·SE, floor); "not reproduced" mirrors it. Otherwise Welch's
    threshold over the seeds; with one seed a side, ``needs ≥ 2 seeds`` unless ``seed_noise``
    (the σ of one trial's final loss, nats) is stated.
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
        floor = MIN_LOSS if "loss" in metric else 0.005 * max(abs(a.mean), abs(b.mean))
        verdict, mean, thr = paired_verdict(d, floor)
        per = ", ".join(f"{x:+.4f}" for x in d)
        return verdict, (f"{fmt(better, a)}; {fmt(worse, b)}; paired by seed Δ = {mean:+.4f} "
                         f"(per seed {per}; threshold {thr:.4f})")
    diff = sign * (a.mean - b.mean)
    thr = _threshold(a, b, metric, seed_noise)
    if thr is None:
        return NEEDS_SEEDS, (f"{fmt(better, a)}; {fmt(worse, b)}; Δ = {diff:+.4f} (one seed: no "
                             "noise estimate; run ≥ 2 seeds or state --seed-noise)")
    verdict = REPRODUCED if diff > thr else NOT_REPRODUCED if diff < -thr else INCONCLUSIVE
    noted = " under the stated seed noise" if min(a.n, b.n) < 2 else ""
    return verdict, (f"{fmt(better, a)}; {fmt(worse, b)}; Δ = {diff:+.4f} (threshold "
                     f"{thr:.4f}{noted})")


def spearman(x: list[float], y: list[float]) -> float:
    from scipy.stats import spearmanr

    if len(x) < 3:
        return math.nan
    return float(spearmanr(x, y).statistic)


def trend(groups: Sequence[Group], key: Callable[[Group], float], metric: str,
          increasing: bool = True, seed_noise: float | None = None) -> tuple[str, str]:
    """Verdict for "``metric`` grows (or falls) with ``key``"."""
    gs = sorted((g for g in groups if g.stat(metric).finite), key=key)
    if len(gs) < 3:
        return INCONCLUSIVE, f"only {len(gs)} configurations with {metric}"
    xs = [key(g) for g in gs]
    ys = [g.stat(metric).mean for g in gs]
    rho = spearman(xs, ys)
    sign = 1 if increasing else -1
    end = sign * (ys[-1] - ys[0])
    thr = _threshold(gs[-1].stat(metric), gs[0].stat(metric), metric, seed_noise)
    pts = ", ".join(f"{x:g}: {y:.4g}" for x, y in zip(xs, ys))
    if thr is None:
        thr = FLOOR if "loss" in metric else 0.02 * max(abs(ys[0]), abs(ys[-1]))
    if sign * rho >= 0.8 and end > thr:
        v = REPRODUCED
    elif sign * rho <= -0.5 and end < -thr:
        v = NOT_REPRODUCED
    else:
        v = INCONCLUSIVE
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


def _upcycle_lr(s: Sweep, seed_noise: float | None = None, **_) -> list[Claim]:
    const = [g for g in s.groups if _lr_policy(g) == "constant"]
    resets = [g for g in s.groups if _lr_policy(g) == "reset"]
    if not const or not resets:
        return []
    best = min(resets, key=lambda g: g.stat("val_loss").mean)
    out = [Claim("Resetting the LR on upcycling beats a constant small LR",
                 "004 §3.2.1 Fig. 5; 000 App. A.6 Fig. 8",
                 *compare(best, const[0], seed_noise=seed_noise))]
    if any(g.stat("router.cos_to_parent").finite for g in const):
        out.append(Claim("The constant-LR run keeps a higher cosine similarity to the dense "
                         "parent", "004 Fig. 6",
                         *compare(const[0], best, "router.cos_to_parent", higher_is_better=True,
                                 seed_noise=seed_noise)))
    return out


def _upcycle_vs_dense(s: Sweep, seed_noise: float | None = None, **_) -> list[Claim]:
    dense = [g for g in s.groups if all(r.get("kind") == "dense" for r in g.rows)]
    moe = [g for g in s.groups if all(r.get("kind") == "upcycled" for r in g.rows)]
    if not dense or not moe:
        return []
    return [Claim("The upcycled MoE beats continued dense training on the same tokens",
                  "004 §3.1 Fig. 4a", *compare(moe[0], dense[0], seed_noise=seed_noise))]


def _router_order(s: Sweep, seed_noise: float | None = None, **_) -> list[Claim]:
    sm = [g for g in s.groups if g.knob("moe.router.order") == "softmax_topk"]
    tk = [g for g in s.groups if g.knob("moe.router.order") == "topk_softmax"]
    if not sm or not tk:
        return []
    return [Claim("softmax-then-topK beats topK-then-softmax after upcycling", "004 §3.4",
                  *compare(sm[0], tk[0], seed_noise=seed_noise))]


def _knob_num(path: str) -> Callable[[Group], float]:
    """A group's value of the knob at ``path`` as a number (NaN when null or not numeric)."""
    return lambda g: _num(g.knob(path))


def _gating_lambda(s: Sweep, seed_noise: float | None = None, **_) -> list[Claim]:
    key = _knob_num("moe.router.logit_norm_lambda")
    lam = [g for g in s.groups if math.isfinite(key(g))]
    null = [g for g in s.groups if not math.isfinite(key(g))]
    out = [Claim(f"{m} grows with λ", "002 §4.1 Fig. 3",
                 *trend(lam, key, f"router.{m}", seed_noise=seed_noise))
           for m in ("max1_max2", "max2_max3")]
    if null:
        res = [compare(g, null[0], seed_noise=seed_noise) for g in lam]
        vs = [v for v, _ in res]
        v = REPRODUCED if all(x == REPRODUCED for x in vs) else (
            NOT_REPRODUCED if NOT_REPRODUCED in vs else
            NEEDS_SEEDS if NEEDS_SEEDS in vs else INCONCLUSIVE)
        out.append(Claim("Every λ (normalised gating) has a lower loss than no normalisation",
                         "002 §4.1 Fig. 3", v, " / ".join(n for _, n in res)))
    return out


def _aux_coef(s: Sweep, seed_noise: float | None = None, **_) -> list[Claim]:
    """Too small a coefficient imbalances experts; too large a one costs cross-entropy. The
    reference for "too small" is the largest coefficient in [1e-3, 1e-2] above the smallest (the
    seeds' recommended range), else the largest below the largest (with two values, the other)."""
    key = _knob_num("moe.router.aux_coef")
    gs = sorted((g for g in s.groups if math.isfinite(key(g))), key=key)
    if len({key(g) for g in gs}) < 2 or len(gs) != len({key(g) for g in gs}):
        return []
    smallest, largest = gs[0], gs[-1]
    ref = [g for g in gs[1:] if 1e-3 <= key(g) <= 1e-2] or gs[1:-1] or gs[1:]
    others = [g for g in gs[:-1] if g.stat("val_loss").finite]
    best = min(others, key=lambda g: g.stat("val_loss").mean) if others else None
    return [
        Claim(f"Too small a coefficient ({key(smallest):g}) imbalances experts (higher max "
              f"expert load than at {key(ref[-1]):g})", "000 App. A.7 Fig. 9; 004 §3.3",
              *compare(ref[-1], smallest, "router.max_load", seed_noise=seed_noise)),
        Claim(f"Too large a coefficient ({key(largest):g}) hurts cross-entropy",
              "000 App. A.7 Fig. 9; 004 §3.3",
              *(compare(best, largest, seed_noise=seed_noise) if best is not None
                else (INCONCLUSIVE, "val_loss missing"))),
    ]


def _granularity(s: Sweep, seed_noise: float | None = None, **_) -> list[Claim]:
    key = _knob_num("moe.granularity")
    coarse = [g for g in s.groups if key(g) == 1]
    fine = [g for g in s.groups if key(g) > 1]
    if not coarse or not fine:
        return []
    best = min(fine, key=lambda g: g.stat("val_loss").mean)
    return [Claim("A granular MoE (virtual-group upcycling) beats the coarse E8G1T2 at the same "
                  "active FLOPs", "004 §3.6", *compare(best, coarse[0], seed_noise=seed_noise))]


def _top_k(s: Sweep, seed_noise: float | None = None, **_) -> list[Claim]:
    key = _knob_num("moe.top_k")
    k1 = [g for g in s.groups if key(g) == 1]
    k2 = [g for g in s.groups if key(g) == 2]
    if not k1 or not k2:
        return []
    return [Claim("Top-2 beats top-1 after upcycling", "004 §3.7",
                  *compare(k2[0], k1[0], seed_noise=seed_noise))]


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
    expanded = [r for r in transition if r.get("method") == "expand_experts"
                and r.get("jump") is not None]  # a pretrained parent: no jump measured
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
    with ``every``): YAML paths, a key inside a dict-valued knob included. ``stratify``: judge
    the claims within strata of the other varied knobs (:func:`strata`); False for rules whose
    tables are built over the whole design (the transition and the D1 × D2 law)."""

    knobs: tuple[str, ...]
    test: Callable[..., list[Claim]]
    every: bool = False
    stratify: bool = True

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
    Rule(("parent.tokens", "tokens"), _transition, stratify=False),  # τ or CPT (003 Table 3)
    Rule(("parent.tokens", "tokens"), _scaling, every=True, stratify=False),  # 000 §4.1 grid
)


def _related(knob: str, path: str) -> bool:
    """``knob`` is the claim's path, or a dict-valued knob holding it, or a key inside it."""
    return knob == path or path.startswith(knob + ".") or knob.startswith(path + ".")


def _follows(s: Sweep, knob: str, paths: Sequence[str]) -> bool:
    """Every cell with the same values at ``paths`` has the same value of ``knob``: the knob
    moves with the claim's knob (part of the treatment), it does not define strata."""
    seen: dict[tuple[str, ...], str] = {}
    for g in s.groups:
        k = tuple(format_knob(g.knob(p)) for p in paths)
        if seen.setdefault(k, format_knob(g.knob(knob))) != format_knob(g.knob(knob)):
            return False
    return True


def strata(s: Sweep, paths: Sequence[str]) -> tuple[list[tuple[str, Sweep]], list[str]]:
    """The cells of ``s`` split by the values of every other varied knob (label, sub-sweep),
    best-first order kept; and the varied knobs that move with ``paths`` (named, not split).
    One stratum labelled "" when nothing else varies."""
    others = [k for k in s.varied if not any(_related(k, p) for p in paths)]
    moving = [k for k in others if _follows(s, k, paths)]
    split = [k for k in others if k not in moving]
    if not split:
        return [("", s)], moving
    names = _short_names(split)
    by: dict[str, list[Group]] = {}
    for g in s.groups:
        label = ", ".join(f"{names[k]}={format_knob(g.knob(k))}" for k in split)
        by.setdefault(label, []).append(g)
    return [(lab, replace(s, groups=tuple(gs))) for lab, gs in sorted(by.items())], moving


def _pooled(per: list[tuple[str, Claim]]) -> list[Claim]:
    """One verdict per claim over its strata: the strata's common verdict; inconclusive when
    they disagree (the effect depends on the other knobs: an interaction) or some are
    inconclusive; ``needs ≥ 2 seeds`` when every stratum needs them."""
    texts = list(dict.fromkeys(c.claim for _, c in per))
    out = []
    for text in texts:
        cs = [(lab, c) for lab, c in per if c.claim == text]
        vs = {c.verdict for _, c in cs}
        v = vs.pop() if len(vs) == 1 else INCONCLUSIVE
        why = ("the strata disagree: the effect depends on the other knobs"
               if {REPRODUCED, NOT_REPRODUCED} <= {c.verdict for _, c in cs} else "")
        numbers = "; ".join(f"[{lab}] {c.verdict}" for lab, c in cs)
        out.append(Claim(text, cs[0][1].source, v,
                         f"pooled over {len(cs)} strata ({numbers})" + (f"; {why}" if why
                                                                       else "")))
    return out


def _rule_claims(rule: Rule, s: Sweep, **kw) -> list[Claim]:
    """``rule``'s claims, judged within strata of the other varied knobs and pooled."""
    if not rule.stratify:
        return rule.test(s, **kw)
    parts, moving = strata(s, rule.knobs)
    note = f" ({', '.join(moving)} vary with {', '.join(rule.knobs)})" if moving else ""
    if len(parts) == 1:
        return [replace(c, numbers=c.numbers + note) for c in rule.test(s, **kw)]
    per = [(lab, replace(c, stratum=lab, numbers=c.numbers + note))
           for lab, sub in parts for c in rule.test(sub, **kw)]
    return _pooled(per) + [c for _, c in per]


def evaluate_claims(s: Sweep, *, law_info: dict | None = None,
                    efficiency: list[dict] | None = None,
                    transition: list[dict] | None = None,
                    seed_noise: float | None = None) -> list[Claim]:
    """The claims of every rule whose knobs the sweep varies (whatever the sweep's name), each
    within the strata of the sweep's other varied knobs and pooled. ``seed_noise``: the stated σ
    of one trial's final loss (nats), which lets single-seed configurations be compared."""
    out: list[Claim] = []
    for rule in RULES:
        if rule.applies(s):
            out += _rule_claims(rule, s, law_info=law_info, efficiency=efficiency or [],
                                transition=transition or [], seed_noise=seed_noise)
    return out

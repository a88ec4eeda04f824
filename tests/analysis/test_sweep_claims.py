"""Typed groups (Group, Stat), claims chosen by the knobs a sweep varies, the transition from the
results' parent_val_loss, and results written before schema 2 (upgraded on read)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.claims import (
    INCONCLUSIVE,
    NEEDS_SEEDS,
    NOT_REPRODUCED,
    REPRODUCED,
    RULES,
    Rule,
    evaluate_claims,
    strata,
)
from analysis.sections import efficiency_rows, transition_rows
from analysis.sweep import Stat, load_sweep
from moe_core.errors import SearchSpaceError
from sweeps.spec.sweep import load_spec
from sweeps.spec.trials import iter_grid, knob_values
from sweeps.store.results import RESULTS_FILE, write_rows

CONST, RESET5, RESET3 = {"policy": "constant"}, {"policy": "reset", "peak": 0.005}, \
    {"policy": "reset", "peak": 0.003}


def _trial(sweep: str, tid: str, seed: int, knobs: dict, L: float, **extra) -> list[dict]:
    """A finished trial: its step-0 eval and its final eval (knob.* columns from ``knobs``)."""
    base = {"sweep": sweep, "trial_id": tid, "status": "ok", "kind": "upcycled", "seed": seed,
            "parent_key": "p0", "knob.seed": seed,
            **{f"knob.{k}": v for k, v in knobs.items()}}
    first = dict(base, step=0, tokens=0, val_loss=L + 0.3)
    return [first, dict(base, step=10, tokens=1000, val_loss=L, **extra)]


def _sweep(tmp_path, name: str, trials: list[list[dict]]):
    write_rows(tmp_path / name / RESULTS_FILE, [r for t in trials for r in t])
    return load_sweep(tmp_path / name)


LR = {  # final val_loss and cos_to_parent per seed, for each LR policy
    "constant": (CONST, [2.00, 2.02, 2.01], [0.90, 0.91, 0.92]),
    "reset5": (RESET5, [1.90, 1.93, 1.91], [0.50, 0.52, 0.49]),
    "reset3": (RESET3, [1.95, 1.96, 1.94], [0.60, 0.61, 0.62]),
}


def _lr_sweep(tmp_path, name: str):
    trials = [_trial(name, f"{k}{seed}", seed, {"upcycle.lr_policy": pol}, L[seed],
                     **{"router.cos_to_parent": c[seed]})
              for k, (pol, L, c) in LR.items() for seed in range(3)]
    return _sweep(tmp_path, name, trials)


def test_groups_are_typed_with_stats_over_seeds(tmp_path):
    s = _lr_sweep(tmp_path, "lr")
    assert s.knobs == ("upcycle.lr_policy",)  # the seed is not a configuration knob
    assert [g.label for g in s.groups] == ["lr_policy(policy=reset peak=0.005)",
                                           "lr_policy(policy=reset peak=0.003)",
                                           "lr_policy(policy=constant)"]  # best first
    g = s.groups[0]
    assert g.knobs == {"upcycle.lr_policy": RESET5}  # decoded from the stored JSON text
    assert g.knob("upcycle.lr_policy.policy") == "reset" and g.knob("upcycle.lr_policy.peak") \
        == 0.005
    assert g.knob("upcycle.lr_policy.nope") is None and g.knob("moe.top_k", 7) == 7
    vals = LR["reset5"][1]
    assert g.stat("val_loss") == Stat(float(np.mean(vals)), float(np.std(vals, ddof=1)), 3)
    assert g.stat("router.cos_to_parent").mean == pytest.approx(np.mean(LR["reset5"][2]))
    assert g.stat("router.max_load").n == 0 and not g.stat("router.max_load").finite
    assert sorted(g.trials) == ["reset50", "reset51", "reset52"]
    assert s.group_of("constant1").label == "lr_policy(policy=constant)"
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.label = "x"
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.stat("val_loss").mean = 0.0
    assert s.varied == ("upcycle.lr_policy",)
    assert s.varies("upcycle.lr_policy.policy") and not s.varies("moe.top_k")


def test_stat_skips_missing_values_and_a_single_seed_has_no_std(tmp_path):
    trials = [_trial("x", "a0", 0, {"moe.router.logit_norm_lambda": None}, 2.0),
              _trial("x", "b0", 0, {"moe.router.logit_norm_lambda": 1.0}, 1.5),
              _trial("x", "b1", 1, {"moe.router.logit_norm_lambda": 1.0}, math.nan)]
    s = _sweep(tmp_path, "x", trials)
    by = {g.label: g for g in s.groups}
    assert set(by) == {"logit_norm_lambda=null", "logit_norm_lambda=1.0"}
    assert by["logit_norm_lambda=null"].knobs == {"moe.router.logit_norm_lambda": None}
    one = by["logit_norm_lambda=1.0"].stat("val_loss")  # the NaN seed is left out
    assert one.mean == 1.5 and one.n == 1 and math.isnan(one.std)
    assert Stat.of([]).n == 0 and not Stat.of([]).finite


def _paired(better: list[float], worse: list[float], higher_is_better: bool, floor: float):
    """Reference for a paired-by-seed comparison: mean Δ and threshold max(2·SE, floor)."""
    sign = 1 if higher_is_better else -1
    d = np.array([sign * (b - w) for b, w in zip(better, worse)])
    return float(d.mean()), max(2 * float(d.std(ddof=1)) / math.sqrt(len(d)), floor)


def test_lr_claims_follow_the_varied_knob_whatever_the_sweep_is_called(tmp_path):
    s = _lr_sweep(tmp_path, "my_renamed_lr_study")
    claims = evaluate_claims(s)
    assert [c.claim for c in claims] == [
        "Resetting the LR on upcycling beats a constant small LR",
        "The constant-LR run keeps a higher cosine similarity to the dense parent"]
    mean, thr = _paired(LR["reset5"][1], LR["constant"][1], False, 0.001)
    assert claims[0].verdict == REPRODUCED and mean > thr
    assert f"paired by seed Δ = {mean:+.4f}" in claims[0].numbers
    assert f"threshold {thr:.4f}" in claims[0].numbers
    cos_c, cos_r = LR["constant"][2], LR["reset5"][2]
    mean, thr = _paired(cos_c, cos_r, True, 0.005 * max(np.mean(cos_c), np.mean(cos_r)))
    assert claims[1].verdict == REPRODUCED
    assert f"paired by seed Δ = {mean:+.4f}" in claims[1].numbers
    assert f"threshold {thr:.4f}" in claims[1].numbers


def test_a_sweep_named_like_another_gets_the_claims_of_what_it_varies(tmp_path):
    # named upcycle_lr, but it varies top-K: the top-K claim, not the LR claims
    L = {1: [2.10, 2.12], 2: [2.00, 2.05]}
    trials = [_trial("upcycle_lr", f"k{k}s{seed}", seed, {"moe.top_k": k}, L[k][seed])
              for k in (1, 2) for seed in (0, 1)]
    claims = evaluate_claims(_sweep(tmp_path, "upcycle_lr", trials))
    assert [c.claim for c in claims] == ["Top-2 beats top-1 after upcycling"]
    mean, thr = _paired(L[2], L[1], False, 0.001)
    assert f"paired by seed Δ = {mean:+.4f}" in claims[0].numbers
    assert mean > thr and claims[0].verdict == REPRODUCED


def test_a_key_inside_a_dict_knob_varies_too(tmp_path):
    # the router order varied through the whole `moe` block: still the router-order claim
    L = {"softmax_topk": [2.00, 2.01], "topk_softmax": [2.10, 2.12]}
    trials = [_trial("s", f"{o}{seed}", seed, {"moe": {"top_k": 2, "router": {"order": o}}},
                     L[o][seed]) for o in L for seed in (0, 1)]
    s = _sweep(tmp_path, "s", trials)
    assert s.varied == ("moe",) and s.varies("moe.router.order") and not s.varies("moe.top_k")
    claims = evaluate_claims(s)
    assert [c.claim for c in claims] == ["softmax-then-topK beats topK-then-softmax after "
                                         "upcycling"]
    mean, _ = _paired(L["softmax_topk"], L["topk_softmax"], False, 0.001)
    assert claims[0].verdict == REPRODUCED and f"Δ = {mean:+.4f}" in claims[0].numbers


def test_no_varied_knob_no_claims(tmp_path):
    trials = [_trial("top_k", f"t{seed}", seed, {"moe.top_k": 2}, 2.0 + seed / 100)
              for seed in (0, 1)]
    s = _sweep(tmp_path, "top_k", trials)
    assert s.varied == () and evaluate_claims(s) == []
    hit = Rule(("a", "b"), lambda s, **_: [])
    both = Rule(("a", "b"), lambda s, **_: [], every=True)

    class Fake:
        def varies(self, k):
            return k == "a"

    assert hit.applies(Fake()) and not both.applies(Fake())
    assert {r.test.__name__ for r in RULES} >= {"_upcycle_lr", "_top_k", "_scaling"}


def test_transition_uses_parent_val_loss_not_the_parent_cache(tmp_path):
    trials = []
    lp = {"uniform": 2.20, "grad_norm": 2.25}
    for strat in lp:
        for seed in (0, 1):
            t = _trial("t", f"{strat}{seed}", seed, {"upcycle.strategy": strat}, 2.0 + seed / 10)
            for r in t:
                r.update({"parent_val_loss": lp[strat], "upcycle.method": "expand_experts"})
            trials.append(t)
    s = _sweep(tmp_path, "t", trials)
    meta = tmp_path / "t" / "parents" / "p0" / "meta.json"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"val_loss": 9.0}))  # never read
    rows = {r["label"]: r for r in transition_rows(s)}
    for strat in lp:
        start = np.mean([2.0 + 0.3, 2.1 + 0.3])  # the step-0 evals of the two seeds
        r = rows[f"strategy={strat}"]
        assert r["L_parent"] == pytest.approx(lp[strat]) and r["n"] == 2
        assert r["jump"] == pytest.approx(start - lp[strat])
        assert r["method"] == "expand_experts"
    claims = evaluate_claims(s, transition=transition_rows(s))
    assert claims == []  # neither τ nor the CPT budget varies


def _write_v1(path, rows: list[dict]) -> None:
    """A results file as schema 1 wrote it: no schema metadata, dicts as Python str()."""
    path.parent.mkdir(parents=True, exist_ok=True)
    cols = list(dict.fromkeys(k for r in rows for k in r))
    pq.write_table(pa.table({c: [r.get(c) for r in rows] for c in cols}), path)


def test_results_before_schema_2_are_upgraded_and_have_no_transition(tmp_path):
    up, base = [], []
    for tau, L in ((250, 2.02), (750, 2.09)):
        r = {"sweep": "transition_tau", "trial_id": f"u{tau}", "status": "ok",
             "kind": "upcycled", "D1": tau, "tokens": 1000 - tau,
             "upcycle.method": "expand_experts", "upcycle.strategy": "uniform",
             "parent.num_experts": 4, "moe.num_experts": 8,
             "router.order": "softmax_topk", "parent_key": "p", "parent.tokens": tau,
             "knob.parent.tokens": tau, "knob.upcycle.lr_policy": str(RESET5)}
        up += [dict(r, step=0, val_loss=2.3), dict(r, step=5, val_loss=L)]
    for e, L in ((4, 2.10), (8, 2.00)):
        base.append({"sweep": "b", "trial_id": f"b{e}", "status": "ok", "kind": "moe",
                     "step": 5, "D1": 0, "tokens": 1000, "val_loss": L, "moe.num_experts": e})
    _write_v1(tmp_path / "transition_tau" / RESULTS_FILE, up)
    _write_v1(tmp_path / "b" / RESULTS_FILE, base)
    meta = tmp_path / "transition_tau" / "parents" / "p" / "meta.json"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"val_loss": 2.2}))
    s = load_sweep(tmp_path / "transition_tau")
    assert {"moe.router.order", "parent.moe.num_experts"} <= set(s.rows.columns)
    assert "router.order" not in s.rows.columns
    assert s.groups[0].knobs["upcycle.lr_policy"] == RESET5  # str(dict) decoded too
    assert transition_rows(s) == []  # no parent_val_loss: no transition, cache or not
    eff = {r["tau"]: r for r in efficiency_rows(s, load_sweep(tmp_path / "b"))}
    assert eff[250.0]["E"] == 4 and eff[250.0]["eta"] == pytest.approx((2.10 - 2.02) / 0.10)
    assert eff[750.0]["eta"] == pytest.approx((2.10 - 2.09) / 0.10)


# ---- claims hold the other varied knobs fixed (#31) ------------------------------------------

def _aux_topk(tmp_path, L: dict, load: dict, seeds=(0,)):
    """An aux_coef × top-K sweep: ``L[(aux, k)]`` and ``load[(aux, k)]`` per seed."""
    trials = [_trial("aux_topk", f"a{a}k{k}s{s}", s,
                     {"moe.router.aux_coef": a, "moe.top_k": k}, L[(a, k)][i],
                     **{"router.max_load": load[(a, k)][i]})
              for (a, k) in L for i, s in enumerate(seeds)]
    return _sweep(tmp_path, "aux_topk", trials)


def _by(claims, stratum=None):
    return {c.claim: c for c in claims if c.stratum == stratum}


def test_aux_by_top_k_one_seed_gives_no_verdict_and_never_mixes_top_k(tmp_path):
    # the researcher's sweep: one seed; top-1 cells have a far higher loss and max load, so
    # comparing a top-1 cell with a top-2 cell "reproduces" both aux claims, as the old rules did
    L = {(0.001, 1): [1.5800], (0.1, 1): [1.5790], (0.001, 2): [1.5142], (0.1, 2): [1.5126]}
    load = {(0.001, 1): [0.30], (0.1, 1): [0.31], (0.001, 2): [0.20], (0.1, 2): [0.20]}
    claims = evaluate_claims(_aux_topk(tmp_path, L, load))
    # the aux claims within each top-K, the top-K claim within each aux coefficient
    assert {c.stratum for c in claims} == {None, "top_k=1", "top_k=2", "aux_coef=0.001",
                                           "aux_coef=0.1"}
    assert {c.claim for c in claims if c.stratum and "aux" in c.stratum} == {
        "Top-2 beats top-1 after upcycling"}
    for c in claims:
        assert c.verdict == NEEDS_SEEDS, c
        assert c.verdict != REPRODUCED
    per = [c for c in claims if c.stratum and "top_k" in c.stratum]
    assert len(per) == 4 and all("top_k" not in c.claim for c in per)
    # every per-stratum comparison names only cells of its stratum
    for c in per:
        k = c.stratum.split("=")[1]
        assert f"top_k={3 - int(k)}" not in c.numbers


def test_aux_by_top_k_per_stratum_verdicts_follow_the_data(tmp_path):
    # two seeds; at top-2 the larger coefficient is better (as in the researcher's numbers), at
    # top-1 it is worse: the strata disagree and the pooled verdict says so
    L = {(0.001, 1): [1.560, 1.562], (0.1, 1): [1.600, 1.604],
         (0.001, 2): [1.5142, 1.5160], (0.1, 2): [1.5026, 1.5046]}
    load = {(0.001, 1): [0.40, 0.41], (0.1, 1): [0.20, 0.21],
            (0.001, 2): [0.20, 0.21], (0.1, 2): [0.30, 0.31]}
    claims = evaluate_claims(_aux_topk(tmp_path, L, load, seeds=(0, 1)))
    large = "Too large a coefficient (0.1) hurts cross-entropy"
    small = ("Too small a coefficient (0.001) imbalances experts (higher max expert load than "
             "at 0.1)")
    k1, k2, pooled = _by(claims, "top_k=1"), _by(claims, "top_k=2"), _by(claims)
    assert k1[large].verdict == REPRODUCED and k2[large].verdict == NOT_REPRODUCED
    assert k1[small].verdict == REPRODUCED and k2[small].verdict == NOT_REPRODUCED
    assert "a0.001k2" not in k1[large].numbers  # labels of its own stratum only
    for c in (pooled[large], pooled[small]):
        assert c.verdict == INCONCLUSIVE and "strata disagree" in c.numbers
    mean, thr = _paired(L[(0.001, 2)], L[(0.1, 2)], False, 0.001)  # 0.001 "better" than 0.1
    assert mean < -thr and f"paired by seed Δ = {mean:+.4f}" in k2[large].numbers


def test_a_stated_seed_noise_lets_one_seed_be_judged(tmp_path):
    L = {(0.001, 1): [1.5800], (0.1, 1): [1.5790], (0.001, 2): [1.5142], (0.1, 2): [1.5126]}
    load = {(0.001, 1): [0.30], (0.1, 1): [0.31], (0.001, 2): [0.20], (0.1, 2): [0.20]}
    s = _aux_topk(tmp_path, L, load)
    large = "Too large a coefficient (0.1) hurts cross-entropy"
    c = _by(evaluate_claims(s, seed_noise=0.0005), "top_k=2")[large]
    thr = 2 * 0.0005 * math.sqrt(2)  # 2·SE of a one-seed difference, but never below FLOOR
    assert thr < 0.005 and "threshold 0.0050 under the stated seed noise" in c.numbers
    assert c.verdict == INCONCLUSIVE  # |Δ| = 0.0016 < 0.005
    c = _by(evaluate_claims(s, seed_noise=0.0001), "top_k=1")[large]
    assert c.verdict == INCONCLUSIVE
    assert _by(evaluate_claims(s, seed_noise=None), "top_k=2")[large].verdict == NEEDS_SEEDS


def test_knobs_that_move_with_the_claims_knob_are_the_treatment_not_strata(tmp_path):
    # a granularity sweep keeps active FLOPs fixed: E and K follow G in every cell
    L = {1: [2.00, 2.01], 2: [1.97, 1.98], 4: [1.95, 1.96]}
    trials = [_trial("g", f"g{g}s{s}", s, {"moe.granularity": g, "moe.num_experts": 8 * g,
                                           "moe.top_k": 2 * g}, L[g][s])
              for g in L for s in (0, 1)]
    claims = evaluate_claims(_sweep(tmp_path, "g", trials))
    assert [c.stratum for c in claims] == [None]
    assert claims[0].verdict == REPRODUCED
    assert "(moe.num_experts, moe.top_k vary with moe.granularity)" in claims[0].numbers


SHIPPED = sorted(p for p in (Path(__file__).parents[2] / "search_spaces").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_sweeps_are_one_stratum_so_their_verdicts_are_unchanged(tmp_path, path):
    """Every sweep of the findings varies one claim knob (or knobs that move with it), so
    stratifying leaves its claims as they were: one stratum per rule. model_config (preset ×
    experts × top-K, not in the findings) is the multi-knob design whose top-K claim is now judged
    per (preset, experts) cell."""
    try:
        spec = load_spec(str(path))
    except SearchSpaceError:
        pytest.skip("needs the user's own checkpoint")
    if spec.sampled_params():
        pytest.skip("sampled knobs: no fixed design")
    rows = []
    for i, pt in enumerate(iter_grid(spec)):
        knobs = {k: v for k, v in knob_values(spec, pt).items() if k != "seed"}
        rows += _trial(spec.name, f"t{i}", pt.get("seed", 0), knobs, 2.0 + i / 1000)
    write_rows(tmp_path / spec.name / RESULTS_FILE, rows)
    s = load_sweep(tmp_path / spec.name)
    for rule in RULES:
        if rule.applies(s) and rule.stratify:
            parts, moving = strata(s, rule.knobs)
            labels = [lab for lab, _ in parts]
            if path.stem == "model_config":
                assert len(labels) > 1 and all("preset=" in lab for lab in labels)
                continue
            assert labels == [""], (path.stem, rule.test.__name__)
            assert not moving or path.stem in ("granularity", "upcycle_vs_dense")

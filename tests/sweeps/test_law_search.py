"""``algorithm: law``: the law block's validation, the cost ledger, the design on simulated
studies with a known truth (coverage), and the searcher's state through save/restore."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from moe_core.errors import SearchSpaceError
from scaling.bootstrap import NoiseComponents
from sweeps.law.config import parse_law_block
from sweeps.law.design import Candidate, LawDesign, Ledger, run_design
from sweeps.law.searcher import LawSearcher
from sweeps.testing.simulate import SimulatedStudy

GRID = np.geomspace(0.5e9, 8e9, 5)


def _candidates(N1: float = 1e9, branches: bool = False) -> list[Candidate]:
    out = []
    for d1 in GRID:
        for d2 in GRID:
            out.append(Candidate({"D1": d1, "D2": d2}, {"parent.tokens": d1, "tokens": d2},
                                 6 * 1.75 * N1 * d2, f"p{d1:.0f}", 6 * N1 * d1,
                                 f"b{d1:.0f}" if branches else None,
                                 0.9 * 6 * 1.75 * N1 * d2 if branches else 0.0))
    return out


def _block(study: SimulatedStudy, **kw):
    return parse_law_block({"law": "eq8", "fix": {"E": study.upcycled["E"]},
                            "scratch": study.scratch, **kw})


@pytest.mark.parametrize("raw, msg", [
    ({"law": "eq7"}, "law.law"),
    ({"target": "dstar"}, "law.scratch"),
    ({"law": "chinchilla", "target": "alpha3"}, "needs an upcycled law"),
    ({"target": "alpha3", "ci_width": None}, "stopping rule"),
    ({"target": "loss_at", "loss_at": {"D1": 1e9}}, "law.loss_at must give D1, D2"),
    ({"target": "alpha3", "bogus": 1}, "unknown key law.bogus"),
    ({"target": "alpha3", "candidates": "box", "box": {"tokens": [10, 1]}}, "0 < low < high"),
    ({"law": "eq12", "target": "alpha3"}, "law.variables"),
    ({"target": "alpha3", "noise": "rows"}, "law.noise='rows'"),
    ({"target": "alpha3", "icc": 1.5}, r"law.icc=1.5 must lie in \[0, 1\]"),
    ({"target": "alpha3", "icc": "high"}, "law.icc"),
])
def test_law_block_errors_name_the_key(raw, msg):
    with pytest.raises(SearchSpaceError, match=msg):
        parse_law_block(raw)


def test_law_block_parses_loss_at_and_a_box():
    cfg = parse_law_block({"target": "loss_at", "loss_at": {"D1": 1e9, "D2": 2e9},
                           "max_trials": 9, "candidates": "box",
                           "box": {"parent.tokens": [1e3, 1e6]}, "points": 4})
    assert cfg.target == "loss_at" and dict(cfg.loss_at) == {"D1": 1e9, "D2": 2e9}
    assert cfg.candidates == "box" and cfg.box == (("parent.tokens", 1e3, 1e6),)
    assert cfg.variable_keys() == {"D1": "parent.tokens", "D2": "tokens"}


def test_spec_with_algorithm_law(tmp_path):
    from sweeps.spec.sweep import load_spec

    spec = load_spec("search_spaces/scaling_d1_d2_law.yaml")
    assert spec.algorithm == "law" and spec.settings.target == "dstar"
    with pytest.raises(SearchSpaceError, match="algorithm=law needs a law: block"):
        load_spec("search_spaces/scaling_d1_d2.yaml", ["algorithm=law"])
    # the plan has the grid's WSD branch groups; its trials train them on demand
    # (tests/sweeps/test_law_branches.py)
    from sweeps.plan.build import build_plan

    law, grid = build_plan(spec), build_plan(load_spec("search_spaces/scaling_d1_d2.yaml"))
    assert law.branch_groups.keys() == grid.branch_groups.keys() and len(law.branch_groups) == 5


def test_progress_counts_at_most_max_trials(tmp_path, monkeypatch):
    """A law sweep runs at most ``max_trials`` of its candidates: the progress line counts
    against that cap ("3/≤4"), not against the 25 candidates of the grid."""
    from types import SimpleNamespace

    from sweeps.plan.build import build_plan
    from sweeps.run import console
    from sweeps.run.driver import ResultsCallback
    from sweeps.spec.sweep import load_spec

    seen = []
    monkeypatch.setattr(console, "progress", seen.append)
    for overrides, want in ((["law.max_trials=4"], "/≤4 trials done"),
                            ([], "/≤25 trials done")):
        spec = load_spec("search_spaces/scaling_d1_d2_law.yaml",
                         [f"results={tmp_path}", *overrides])
        cb = ResultsCallback(spec, build_plan(spec), tmp_path / "p", flush_s=1e9)
        trial = SimpleNamespace(trial_id="t0", config={}, status="TERMINATED")
        cb.done.add("t0")
        cb._progress([trial], trial)
        cb.sink.close()
        assert seen[-1].startswith("1" + want), seen[-1]
    grid = load_spec("search_spaces/scaling_d1_d2.yaml", [f"results={tmp_path}"])
    cb = ResultsCallback(grid, build_plan(grid), tmp_path / "g", flush_s=1e9)
    cb._progress([], None)
    cb.sink.close()
    assert seen[-1].startswith("0/25 trials done")


def test_ledger_pays_parents_once_and_stable_runs_once_per_branch():
    c = _candidates(branches=True)
    a, b = c[0], c[1]  # same parent (D1 = 0.5e9), D2 = 0.5e9 and 1e9
    led = Ledger()
    assert led.marginal(a) == pytest.approx(a.parent_flops + a.trial_flops)
    led.add(b)
    # the parent is paid; a's stable phase (0.9 of it) lies inside b's: only its decay is new
    assert led.marginal(a) == pytest.approx(0.1 * a.trial_flops)
    # nothing shared without branches
    nb = _candidates()
    led2 = Ledger()
    led2.add(nb[1])
    assert led2.marginal(nb[0]) == pytest.approx(nb[0].trial_flops)


def test_design_starts_cheap_spreads_out_and_stops_on_width():
    study = SimulatedStudy(sigma=0.002, seed=0)
    d = LawDesign(_block(study, target="loss_at", loss_at={"D1": 2e9, "D2": 2e9}, ci_width=0.02,
                         bootstrap=30), _candidates())
    first = d._seed_design()
    assert len(first) == 6  # 4 free parameters (E fixed) + 2
    costs = sorted(c.parent_flops + c.trial_flops for c in d.candidates)
    assert all(d.candidates[i].parent_flops + d.candidates[i].trial_flops <= costs[13]
               for i in first)
    assert len({d.candidates[i].x["D1"] for i in first}) >= 3
    run_design(d, lambda c: study.loss(c.x))
    assert d.finished and d.estimate is not None
    # stopped because the interval was narrow on two refits in a row, before the grid's end
    assert d.narrow >= 2 and d.estimate.rel_width <= 0.02 and len(d.observed) >= d.min_trials
    assert len(d.observed) < len(d.candidates)


def test_seed_design_shares_parents_and_stable_runs():
    """With WSD branches the start buys few parents and stable runs: each pick is among the
    cheapest quarter at its marginal cost, so it reuses what earlier picks paid for."""
    study = SimulatedStudy(sigma=0.002, seed=0)
    d = LawDesign(_block(study, target="alpha3", ci_width=0.5), _candidates(branches=True))
    first = d._seed_design()
    assert len(first) == 6
    groups = {d.candidates[i].branch for i in first}
    assert 2 <= len(groups) <= 3  # spread over D1, but not a new stable run per trial
    alone = sum(d.candidates[i].parent_flops + d.candidates[i].trial_flops for i in first)
    paid = Ledger()
    total = sum(paid.add(d.candidates[i]) for i in first)
    assert total < 0.7 * alone  # shared parents and stable runs: 0.65 of paying each alone


def _package_design(head_gain_only: bool = False):
    """Hand-built: a standalone candidate A (cost 10) and a branch group whose head H (stable 90,
    decay 10) serves three branches m1–m3 (stable 45, decay 10). Independent predictions of
    variance 1 and σ² → 0, so observing candidate i removes exactly Cov(T, ŷ_i)² from Var T."""
    study = SimulatedStudy(sigma=0.002, seed=0)
    cands = [Candidate({"D1": 1.0, "D2": 1.0}, {"i": 0}, 10.0),
             Candidate({"D1": 2.0, "D2": 4.0}, {"i": 1}, 100.0, branch="g", stable_flops=90.0)]
    cands += [Candidate({"D1": 2.0, "D2": 2.0 + j}, {"i": 2 + j}, 55.0, branch="g",
                        stable_flops=45.0) for j in range(3)]
    d = LawDesign(_block(study, target="alpha3", ci_width=0.5), cands)
    d._noise = NoiseComponents(1e-12, 0.0, 0)
    cov_t = np.array([math.sqrt(0.2), 1.0, *(([0.0] * 3) if head_gain_only else [1.0] * 3)])
    C = np.eye(1 + len(cands))
    C[0, 1:] = C[1:, 0] = cov_t
    C[0, 0] = 1.0 + float(cov_t @ cov_t)
    return d, C


def test_proposals_open_a_branch_group_for_its_branches():
    """Scored one at a time, A wins (0.2 / 10 = 0.02 > 1 / 55 > 1 / 100). As packages, m1 heading
    m2 and m3 (a stable run to their decay start, 45, shared) removes 3 for 75 (0.04), better
    than H with all three branches (4 for 130, 0.031): that package goes first, its head first,
    and the stable run is not bought past the branches' own decay start."""
    d, C = _package_design()
    pack = d._best_package(C, list(range(5)), Ledger())
    assert pack[0] == 2 and sorted(pack) == [2, 3, 4]
    # when the branches tell nothing about the target, the group is not worth opening
    d, C = _package_design(head_gain_only=True)
    assert d._best_package(C, list(range(5)), Ledger()) == [0]


@pytest.mark.slow
def test_coverage_on_simulated_studies():
    """The 90 % interval of the predicted loss at a point inside the grid holds the true value
    in most of 10 simulated studies (a fixed design of 12 trials, noise 1 % in ln L)."""
    hits = 0
    for s in range(10):
        study = SimulatedStudy(sigma=0.01, seed=100 + s)
        at = {"D1": 2e9, "D2": 2e9}
        d = LawDesign(_block(study, target="loss_at", loss_at=at, ci_width=None, max_trials=12,
                             bootstrap=40), _candidates(), seed=s)
        run_design(d, study.loss_of, parallel=2)
        hits += d.estimate.lo <= study.true_loss(at) <= d.estimate.hi
    assert hits >= 7, hits


def _drive(searcher: LawSearcher, study: SimulatedStudy, n: int, start: int = 0) -> list[dict]:
    out = []
    for k in range(start, start + n):
        cfg = searcher.suggest(f"t{k}")
        assert isinstance(cfg, dict), cfg
        out.append(cfg)
        x = {"D1": cfg["parent.tokens"], "D2": cfg["tokens"]}
        searcher.on_trial_complete(f"t{k}", {"val_loss": study.loss(x)})
    return out


def test_searcher_state_survives_tunes_save_and_restore(tmp_path):
    """Tune's path (save_to_dir / restore_from_dir, as Tuner.restore calls them) and our own
    state file both give back the design: the restored searcher continues exactly as the
    original does (ray-project/ray#30861: Tune alone would start the search over)."""
    study = SimulatedStudy(sigma=0.005, seed=4)
    cfg = _block(study, target="alpha3", ci_width=None, max_trials=14, bootstrap=20)
    a = LawSearcher(cfg, _candidates(), state_dir=tmp_path / "own")
    _drive(a, study, 8)
    (tmp_path / "tune").mkdir()
    a.save_to_dir(str(tmp_path / "tune"))  # Tune saves into the experiment directory
    b = LawSearcher(cfg, _candidates())
    b.restore_from_dir(str(tmp_path / "tune"))
    c = LawSearcher(cfg, _candidates(), state_dir=tmp_path / "own")  # a --resume
    for s in (b, c):
        assert s.design.observed == a.design.observed and s.design.spent == a.design.spent
        assert s.trials == a.trials and s.design.seeded
    nxt = [_drive(s, study, 4, start=8) for s in (a, b, c)]
    assert nxt[0] == nxt[1] == nxt[2]
    fresh = LawSearcher(cfg, _candidates())
    assert _drive(fresh, study, 4) != nxt[0]  # a searcher that lost its state starts over


def test_searcher_finishes_and_reports_failures():
    study = SimulatedStudy(sigma=0.005, seed=5)
    cfg = _block(study, target="alpha3", ci_width=None, max_trials=7, bootstrap=10)
    s = LawSearcher(cfg, _candidates())
    got = []
    for k in range(10):
        r = s.suggest(f"t{k}")
        if r == LawSearcher.FINISHED:
            break
        if r is None:
            continue
        got.append(r)
        s.on_trial_complete(f"t{k}", None if k == 0 else {"val_loss": study.loss(
            {"D1": r["parent.tokens"], "D2": r["tokens"]})}, error=k == 0)
    assert len(got) == 7 and s.design.failed and math.isfinite(s.design.spent)
    # the last trials' losses enter the final estimate (a refit after the last one ended)
    assert s.design.estimate.n_trials == len(s.design.observed) == 6


def test_searcher_announces_refits_and_its_outcome(monkeypatch):
    """A progress line per refit (in the sweep's driver), and the summary's ``law`` entry: why
    it stopped, its final interval, what it spent."""
    from sweeps.law.report import describe_outcome, outcome
    from sweeps.run import console

    lines = []
    monkeypatch.setattr(console, "progress", lines.append)
    study = SimulatedStudy(sigma=0.003, seed=6)
    for width, cap, stop in ((None, 8, "max_trials"), (50.0, 30, "narrow")):
        cfg = _block(study, ci_width=width, max_trials=cap, bootstrap=20)
        s = LawSearcher(cfg, _candidates())
        lines.clear()
        for k in range(40):
            r = s.suggest(f"t{k}")
            if r == LawSearcher.FINISHED:
                break
            s.on_trial_complete(f"t{k}", {"val_loss": study.loss(
                {"D1": r["parent.tokens"], "D2": r["tokens"]})})
        hist = s.design.history
        assert len(lines) == len(hist) >= 1
        assert all(ln.startswith(f"law refit after {h['trials']} trials") and "D* = " in ln
                   for ln, h in zip(lines, hist))
        out = outcome(cfg, {"design": s.design.state()}, len(_candidates()))
        assert out["stop"] == stop and out["refits"] == len(hist)
        assert out["estimate"]["trials"] == len(s.design.observed) == out["trials"]
        assert out["flops"] == s.design.spent
        text = describe_outcome(cfg, out)
        assert text.startswith("law search: D* = ") and (
            "max_trials (8) reached" in text if stop == "max_trials" else
            "<= 50 wide on 2 refits in a row" in text)
    assert "(2/2)" in lines[-1]  # the refit that stopped it says so


@pytest.mark.distributed
def test_tuner_restore_gives_the_searcher_its_state(tmp_path):
    """A tiny local Ray Tune run with the simulated trainable: the searcher Tune unpickles on
    ``Tuner.restore`` is the one from the experiment's start (no observations: ray#30861's loss);
    Tune then hands it the saved state (``restore_from_dir`` → our ``restore``), and it continues
    with every observation of the first run."""
    ray = pytest.importorskip("ray")
    from ray import tune

    from sweeps.testing.simulate import simulated_trainable

    started_here = not ray.is_initialized()
    if started_here:
        # a Ray of its own, whatever cluster another process started on this machine
        ray.init(address="local", num_cpus=2, include_dashboard=False,
                 configure_logging=False, log_to_driver=False)
    try:
        study = SimulatedStudy(sigma=0.005, seed=7)
        cfg = _block(study, target="alpha3", ci_width=None, max_trials=10, bootstrap=10)
        train = simulated_trainable(study, {"D1": "parent.tokens", "D2": "tokens"})
        first = LawSearcher(cfg, _candidates())
        tuner = tune.Tuner(train, param_space={}, tune_config=tune.TuneConfig(
            search_alg=first, num_samples=6, metric="val_loss", mode="min",
            # the two trial actors serve all six trials, as in a sweep (sweeps.run.driver): a
            # fresh one per trial cost six Ray worker start-ups, most of the test's time
            max_concurrent_trials=2, reuse_actors=True), run_config=tune.RunConfig(
            name="exp", storage_path=str(tmp_path), verbose=0))
        assert len(tuner.fit()) == 6
        restored = tune.Tuner.restore(str(tmp_path / "exp"), trainable=train,
                                      resume_unfinished=True)
        searcher = restored._local_tuner._tune_config.search_alg
        assert isinstance(searcher, LawSearcher) and searcher.design.observed == {}
        assert len(restored.fit()) == 6
        assert len(searcher.design.observed) == 6 and searcher.design.seeded
        assert sorted(searcher.trials) == sorted(first.trials)
    finally:
        if started_here:
            ray.shutdown()


def test_branches_of_one_stable_run_are_not_independent_evidence():
    """Two branches of one stable run, predictions independent with Cov(T, ŷ_i) = 1 and
    Var ŷ_i = 1, noise variance 1 in all. Independent noise (own 1): each observation removes
    1/2 from Var T. Shared (the stable run's, 1; own → 0): the first removes 1/2, and the second
    only 1/6 by hand (after the first, Cov(T, y2) = 1/2, Var y2 = 3/2)."""
    study = SimulatedStudy(sigma=0.002, seed=0)
    cands = [Candidate({"D1": 2.0, "D2": 2.0 + j}, {"i": j}, 55.0, branch="g",
                       stable_flops=45.0) for j in range(2)]
    d = LawDesign(_block(study, target="alpha3", ci_width=0.5), cands)
    C = np.array([[3.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    d._noise = NoiseComponents(1.0, 0.0, 0)
    assert d._gain(C, 0) == pytest.approx(0.5)
    assert d._gain(d._condition(C, 0), 1) == pytest.approx(0.5)
    d._noise = NoiseComponents(1e-12, 1.0, 0)
    Ca = d._augmented(C)
    assert Ca.shape == (4, 4) and d._gain(Ca, 0) == pytest.approx(0.5)
    assert d._gain(d._condition(Ca, 0), 1) == pytest.approx(1 / 6)


def test_stable_runs_of_one_parent_share_its_noise_group():
    """The parent carries most of a trial's seed noise (findings §10: with the parent fixed,
    stable runs of other seeds have no shared part), so the noise group is the parent: two
    stable runs off one parent are one group, two parents two; a trial without a parent is
    grouped by its stable run, and one with neither stands alone."""
    study = SimulatedStudy(sigma=0.002, seed=0)
    cands = [Candidate({"D1": 2.0, "D2": 2.0}, {"i": 0}, 55.0, parent="p", branch="s0"),
             Candidate({"D1": 2.0, "D2": 3.0}, {"i": 1}, 55.0, parent="p", branch="s1"),
             Candidate({"D1": 4.0, "D2": 2.0}, {"i": 2}, 55.0, parent="q", branch="s2"),
             Candidate({"D1": 4.0, "D2": 3.0}, {"i": 3}, 55.0, branch="s3"),
             Candidate({"D1": 4.0, "D2": 4.0}, {"i": 4}, 55.0, branch="s3"),
             Candidate({"D1": 8.0, "D2": 4.0}, {"i": 5}, 55.0)]
    d = LawDesign(_block(study, target="alpha3", ci_width=0.5), cands)
    assert d._group_index() == [0, 0, 1, 2, 2, None]


def test_the_last_trial_enters_the_estimate_when_tune_asks_for_no_more(tmp_path):
    """Tune stops calling suggest() after its sample count (max_trials): the refit on every trial
    happens when the last one completes (a real 25-trial sweep ended with an estimate from 24)."""
    study = SimulatedStudy(sigma=0.005, seed=6)
    cfg = _block(study, target="alpha3", ci_width=None, max_trials=9, bootstrap=20)
    s = LawSearcher(cfg, _candidates(), state_dir=tmp_path)
    _drive(s, study, 9)  # no suggest() after the ninth completion
    assert s.design.history[-1]["trials"] == 9 and len(s.design._fit_on) == 9
    saved = json.loads((tmp_path / "law_search.json").read_text())["design"]
    assert saved["history"][-1]["trials"] == 9 and len(saved["fit_on"]) == 9

"""#38 item 5: ``analysis.decide``'s text says "not meaningful beyond N×" instead of a number far
outside the data, labels every cost line with what it prices and at which size, and explains
"crossings" and "—" where they are printed. Pure: format_decision on a hand-made decision."""

from __future__ import annotations

from analysis.decide import MAX_EXTRAPOLATION, format_decision


def _r(beyond=(), crossings=(), ci_hi=3e6, far=1.0):
    cost = {"tokens": 1e11, "flops": 1.38e17, "gpu_hours": 0.111, "cost": 0.278}
    return {
        "verdict": "from_scratch", "p_upcycle_wins": 0.0, "ci_level": 0.9,
        "bootstrap": {"n": 200},
        "inputs": {"N1": 1.314e5, "N2": 2.306e5, "D1": 1.6e5, "D2": 1e11,
                   "budget_flops": 1.38e17, "gpu_tflops": 346.1},
        "loss": {"upcycled": {"value": 152.2, "ci": [0.0067, 4915]},
                 "scratch": {"value": 2.9, "ci": [2.0, 3.4]}},
        "d_star": {"value": 1.5e6, "ci": [1e6, ci_hi], "winner_everywhere": None,
                   "range": [1e3, 1e17], "crossings": list(crossings)},
        "compute_optimal": {"available": False, "reason": "one dense size"},
        "cost": {"upcycled": cost, "scratch": cost,
                 "scratch_to_match": {**cost, "tokens": 7.5e8}},
        "extrapolated": [], "extrapolation_factor": {"upcycled": far, "scratch": far},
        "limits": {"max_extrapolation": MAX_EXTRAPOLATION, "beyond": list(beyond),
                   "priced_at": {"N2_active": 2.306e5, "N1_dense": 1.314e5,
                                 "fitted_N1": 1.314e5}},
    }


def test_far_outside_the_data_no_number_is_printed():
    out = "\n".join(format_decision(_r(beyond=["d_star", "loss.scratch", "loss.upcycled",
                                               "cost.scratch_to_match"], far=1.5e5)))
    assert "152.2" not in out and "4915" not in out
    assert out.count(f"not meaningful beyond {MAX_EXTRAPOLATION:g}× the data") == 5
    assert "verdict: not meaningful" in out
    # the bootstrap share is the far-away laws' too: said inside the qualifier, not beside it
    verdict = next(x for x in out.splitlines() if x.startswith("verdict:"))
    assert verdict.endswith("say from_scratch; P(upcycling wins) = 0.00 (200 bootstrap fits by "
                            "trial) there)")
    assert "verdict: from_scratch   P(upcycling wins) = 0.00" in "\n".join(format_decision(_r()))


def test_cost_lines_name_what_they_price_and_the_size():
    lines = format_decision(_r())
    costs = [x for x in lines if x.startswith("cost")]
    assert len(costs) == 2  # the two identical paths are one line, said to be identical
    assert "N2 = 2.306e+05 active parameters" in costs[0] and "$0.278" in costs[0]
    assert "the same MoE, the same tokens, the same cost" in costs[0]
    assert "priced at the size the laws were fitted at (N1 = 1.314e+05)" in costs[0]
    assert costs[1].startswith("cost from scratch to match the upcycled loss (the MoE at N2")
    assert "152.2  [0.0067, 4915]" in "\n".join(lines)  # inside the data: the number


def test_crossings_and_dash_are_explained():
    cr = [{"D": 2.8e4, "to": "upcycled"}, {"D": 1.5e6, "to": "scratch"}]
    out = "\n".join(format_decision(_r(crossings=cr, ci_hi=None)))
    assert "(crossings: 2.8e+04 → upcycled, 1.5e+06 → scratch)" in out
    assert "crossings: every D2 at which the two laws' predicted losses cross" in out
    assert "—: an interval end with no value" in out
    assert "crossings: every" not in "\n".join(format_decision(_r()))

"""#38 item 5: laws the user did not ask for are fitted only on enough distinct points."""

from __future__ import annotations

from analysis.sections import model_config_section, sparsity_points_per_stratum
from analysis.sweep import load_sweep
from sweeps.store.results import RESULTS_FILE, write_rows


def _sweep(tmp_path, cells, seeds=(0, 1)):
    """Trials of an aux_coef × top-K (× experts) sweep; N2 grows with top-K, N_total with E."""
    rows = []
    for aux, k, e in cells:
        for s in seeds:
            base = {"sweep": "s", "trial_id": f"a{aux}k{k}e{e}s{s}", "status": "ok",
                    "kind": "upcycled", "seed": s, "parent_key": "p0", "knob.seed": s,
                    "knob.moe.router.aux_coef": aux, "knob.moe.top_k": k,
                    "knob.moe.num_experts": e, "N2": 1e5 * (1 + k), "N_total": 1e5 * (1 + e)}
            loss = 1.5 - 0.01 * k - 0.002 * e + 0.001 * s
            rows += [dict(base, step=0, tokens=0, val_loss=loss + 0.3),
                     dict(base, step=10, tokens=1000, val_loss=loss)]
    write_rows(tmp_path / "s" / RESULTS_FILE, rows)
    return load_sweep(tmp_path / "s")


def test_sparsity_law_on_two_points_per_stratum_is_not_fitted(tmp_path):
    # the case: top-K ∈ {1, 2} × aux ∈ {1e-3, 0.1}, 2 seeds: 8 trials, 2 (P, N2) each
    s = _sweep(tmp_path, [(a, k, 8) for a in (1e-3, 0.1) for k in (1, 2)])
    assert sparsity_points_per_stratum(s) == {"moe.router.aux_coef=0.001": 2,
                                              "moe.router.aux_coef=0.1": 2}
    sec = model_config_section(s)
    assert sec.lines[0].startswith("## Scaling law of sparsity")
    assert [x for x in sec.lines if x.startswith("Not fitted: 2 distinct (P, N2) point(s)")]
    assert "not_fitted" in sec.data and not any("|" in x for x in sec.lines)


def test_points_are_counted_per_stratum_of_shape_free_knobs(tmp_path):
    # top-K and the expert count change (P, N2): one stratum of 5 points, enough to fit
    s = _sweep(tmp_path, [(1e-3, k, e) for k in (1, 2) for e in (4, 8)] + [(1e-3, 4, 8)])
    assert sparsity_points_per_stratum(s) == {"all": 5}
    # the aux coefficient does not: it splits the design into strata
    s = _sweep(tmp_path, [(a, k, e) for a in (1e-3, 0.1) for k in (1, 2) for e in (4, 8)])
    assert sparsity_points_per_stratum(s) == {"moe.router.aux_coef=0.001": 4,
                                              "moe.router.aux_coef=0.1": 4}


def test_pretrained_parent_transition_and_curves(tmp_path):
    """#38: a parent.from_pretrained parent (no parent_val_loss, D1 unknown: 0) gets its step-0
    eval as the parent's loss, no jump claimed, and its step-0 eval stays inside the curves."""
    from analysis.plots import curve_limits
    from analysis.sections import transition_section
    rows = []
    for s in (0, 1):
        base = {"sweep": "p", "trial_id": f"t{s}", "status": "ok", "kind": "upcycled",
                "seed": s, "parent_key": "hf-abc", "knob.seed": s, "D1": 0,
                "knob.upcycle.lr_policy.peak": 1e-4, "parent.from_pretrained": "ckpt/my-llama"}
        rows += [dict(base, step=0, tokens=0, val_loss=3.5 + 0.01 * s),
                 dict(base, step=10, tokens=1000, val_loss=2.0 + 0.01 * s)]
    write_rows(tmp_path / "p" / RESULTS_FILE, rows)
    sw = load_sweep(tmp_path / "p")
    sec = transition_section(sw)
    assert sec.lines[0] == "## Loss at the transition"
    assert sec.data[0]["L_parent"] == sec.data[0]["L_start"] and sec.data[0]["jump"] is None
    assert sec.data[0]["parent_loss"] == "step-0 eval"
    assert any(x.startswith("—: a `parent.from_pretrained` parent") for x in sec.lines)
    (_, _), (y0, y1) = curve_limits(sw.ok_rows(), "val_loss", False)
    assert y1 > 3.51  # the step-0 eval is not cut off the top


def test_pretrained_parent_loss_is_read_from_its_column(tmp_path):
    """#38: results that record the pretrained parent's loss (``parent_loss_source: step-0
    eval``) are read from the column, not inferred (the value differs from the step-0 row here
    only to show which is read); no jump is claimed."""
    from analysis.sections import transition_section
    rows = []
    for s in (0, 1):
        base = {"sweep": "p", "trial_id": f"t{s}", "status": "ok", "kind": "upcycled",
                "seed": s, "parent_key": "hf-abc", "knob.seed": s, "D1": 0,
                "parent.from_pretrained": "ckpt/my-llama", "parent_val_loss": 3.25,
                "parent_loss_source": "step-0 eval"}
        rows += [dict(base, step=0, tokens=0, val_loss=3.5),
                 dict(base, step=10, tokens=1000, val_loss=2.0)]
    write_rows(tmp_path / "p" / RESULTS_FILE, rows)
    sec = transition_section(load_sweep(tmp_path / "p"))
    assert sec.data[0]["L_parent"] == 3.25 and sec.data[0]["L_start"] == 3.5
    assert sec.data[0]["jump"] is None and sec.data[0]["parent_loss"] == "step-0 eval"

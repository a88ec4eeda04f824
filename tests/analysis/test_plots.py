"""Figure fixes: curves.png keeps the transition start in view, finals.png has no constant
panels and labels its axes, d_star.png (the paper's law) only on request."""

from __future__ import annotations

import pandas as pd

from analysis.plots import curve_limits, finals_columns
from analysis.report import D_STAR_CAPTION, _law_figure_lines
from analysis.sweep import load_sweep
from sweeps.store.results import RESULTS_FILE, write_rows


def _rows(d1: float = 1000.0):
    rows = []
    for t, (start, end) in enumerate([(2.0, 1.5), (2.2, 1.4)]):
        for step, loss in ((0, start), (2, start + 0.6), (4, (start + end) / 2), (8, end)):
            rows.append({"sweep": "s", "trial_id": f"t{t}", "status": "ok", "step": step,
                         "tokens": 100.0 * step, "D1": d1, "val_loss": loss,
                         "kind": "upcycled" if d1 else "moe", "knob.optim.lr": [1e-3, 3e-3][t],
                         "router.drop_rate": 0.0, "router.max_load": 0.3 + 0.1 * t,
                         "seed": 0})
    return rows


def test_curve_limits_keep_an_upcycled_trials_transition_in_view():
    df = pd.DataFrame(_rows())
    (x0, x1), (y0, y1) = curve_limits(df, "val_loss")
    assert y1 >= 2.8 and y0 <= 1.4  # the jump after upcycling (2.2 + 0.6) is not clipped
    assert x0 <= 0 <= x1 and x1 >= 800
    (x0, _), _ = curve_limits(df, "val_loss", total=True)  # against τ + CPT: starts near τ
    assert 900 < x0 <= 1000
    scratch = pd.DataFrame(_rows(d1=0.0))
    _, (y0, y1) = curve_limits(scratch, "val_loss")
    assert 2.8 <= y1 < 2.9  # from scratch: step 0 (random init) left out, the rest kept


def test_finals_panels_skip_constant_statistics(tmp_path):
    write_rows(tmp_path / RESULTS_FILE, _rows())
    s = load_sweep(tmp_path)
    assert finals_columns(s) == ["val_loss", "router.max_load"]  # drop_rate: all zeros


def test_d_star_figure_only_when_asked_and_labelled_as_the_papers(tmp_path, monkeypatch):
    import analysis.report as rep

    class Fig:  # the law-fit figure is another test's: only d_star.png is asked about here
        data = law = params = points = residuals = None

    monkeypatch.setattr(rep, "plot_law_fit", lambda path, *a: path)
    assert _law_figure_lines(Fig(), tmp_path) == ["![law fit](law_fit.png)", ""]
    assert not (tmp_path / "d_star.png").exists()
    lines = _law_figure_lines(Fig(), tmp_path, paper_d_star=True)
    assert D_STAR_CAPTION in lines and "published" in D_STAR_CAPTION
    assert (tmp_path / "d_star.png").stat().st_size > 1000


def test_a_folder_report_points_out_the_cells_sweeps_share(tmp_path):
    from analysis.report import shared_lines

    def rows(sweep, tops):
        out = []
        for k in tops:
            base = {"sweep": sweep, "trial_id": f"{sweep}{k}", "status": "ok", "moe.top_k": k,
                    "optim.lr": 3e-3, "knob.moe.top_k": k, "knob.seed": 0, "seed": 0}
            out += [{**base, "step": 0, "tokens": 0, "val_loss": 3.0},
                    {**base, "step": 8, "tokens": 800, "val_loss": 2.0 - 0.1 * k}]
        return out

    write_rows(tmp_path / "a" / RESULTS_FILE, rows("a", [1, 2]))
    write_rows(tmp_path / "b" / RESULTS_FILE, rows("b", [2, 4]))
    lines = shared_lines([tmp_path / "a", tmp_path / "b"], tmp_path)
    assert "| a | moe.top_k=2 | 1.8000 (n=1) | b | moe.top_k=2 | 1.8000 (n=1) | +0.0000 |" \
        in lines
    assert sum(ln.startswith("| a |") for ln in lines) == 1  # top_k=1 and 4 are not shared
    assert (tmp_path / "shared_a_b.png").stat().st_size > 1000

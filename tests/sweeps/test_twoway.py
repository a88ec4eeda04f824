"""Two-way views: joint tables of two knobs, the interaction they show, the seed never a knob,
the cells two sweeps share, and colours legible with two values."""

from __future__ import annotations

import colorsys

import pytest

from analysis.compare import knob_columns, main
from analysis.twoway import colors, joint_table, knob_pairs, markdown, shared_cells, varied_knobs
from sweeps.store.results import write_rows

# the aux × top-K sweep (one seed): at top-2, aux 0.1 beats aux 0.001
CELLS = {("0.001", 1): 1.5402, ("0.1", 1): 1.5517, ("0.001", 2): 1.5142, ("0.1", 2): 1.5126}


def _rows(sweep="aux_topk", cells=CELLS, seeds=(0,), extra=None):
    rows = []
    for (aux, k), loss in cells.items():
        for seed in seeds:
            tid = f"{sweep}-{aux}-{k}-{seed}"
            base = {"sweep": sweep, "trial_id": tid, "status": "ok", "knob.seed": seed,
                    "knob.moe.router.aux_coef": float(aux), "knob.moe.top_k": k,
                    "moe.router.aux_coef": float(aux), "moe.top_k": k, "optim.lr": 3e-3,
                    "tokens_budget": 1000, **(extra or {})}
            rows.append({**base, "step": 0, "tokens": 0, "val_loss": 3.0})
            rows.append({**base, "step": 10, "tokens": 1000, "val_loss": loss + 0.001 * seed})
    return rows


def test_joint_table_shows_the_interaction_the_marginals_hide():
    rows = _rows(seeds=(0, 1))
    finals = [r for r in rows if r["step"] == 10]
    assert varied_knobs(finals) == ["knob.moe.router.aux_coef", "knob.moe.top_k"]  # no seed
    assert knob_pairs(finals) == [("knob.moe.router.aux_coef", "knob.moe.top_k")]
    jt = joint_table(finals, "knob.moe.top_k", "knob.moe.router.aux_coef")
    assert jt.a_values == ("1", "2") and jt.b_values == ("0.001", "0.1")
    assert jt.cells[("2", "0.1")] == pytest.approx((1.5126, 1.5136))
    assert jt.mean("2", "0.1") == pytest.approx(1.5131)
    assert jt.best_b("1") == "0.001" and jt.best_b("2") == "0.1"
    line = jt.interaction()
    assert line.startswith("best aux_coef depends on top_k: 0.001 at top_k=1, 0.1 at top_k=2; "
                           "best top_k = 2 at every aux_coef; ")
    # (1.5126 − 1.5142) − (1.5517 − 1.5402) = −0.0016 − 0.0115 = −0.0131
    assert "= -0.0131" in line
    md = markdown(jt, "val_loss")
    assert md[0] == "| top_k \\ aux_coef | 0.001 | 0.1 |"
    assert md[3] == "| 2 | 1.5147 (n=2) | **1.5131 (n=2)** |"


def test_one_seed_says_so_and_seed_is_not_a_compare_knob():
    finals = [r for r in _rows() if r["step"] == 10]
    jt = joint_table(finals, "knob.moe.router.aux_coef", "knob.moe.top_k")
    # one seed: no best and no "depends on" is stated, nothing bold (the claims' rule)
    assert jt.interaction().startswith("best top_k at each aux_coef: needs ≥ 2 seeds; "
                                       "best aux_coef at each top_k: needs ≥ 2 seeds")
    assert jt.interaction().endswith("(one seed per cell: no noise estimate)")
    assert "**" not in "".join(markdown(jt, "val_loss"))
    assert knob_columns(_rows()) == ["knob.moe.router.aux_coef", "knob.moe.top_k"]


def test_shared_cells_and_the_compare_page(tmp_path, capsys):
    a = _rows("aux_topk")
    # a top-K sweep at the base aux coefficient 0.001: its two cells are aux_topk's too
    b = _rows("top_k", {("0.001", 1): 1.5410, ("0.001", 2): 1.5150})
    for r in b:
        del r["knob.moe.router.aux_coef"]
    cells = shared_cells({"aux_topk": a, "top_k": b})
    assert [(c.labels, c.values) for c in cells] == [
        (("moe.router.aux_coef=0.001, moe.top_k=1", "moe.top_k=1"), ((1.5402,), (1.5410,))),
        (("moe.router.aux_coef=0.001, moe.top_k=2", "moe.top_k=2"), ((1.5142,), (1.5150,)))]
    for name, rows in (("aux_topk", a), ("top_k", b)):
        write_rows(tmp_path / name / "results.parquet", rows)
    out = tmp_path / "cmp"
    assert main([str(tmp_path / "aux_topk"), str(tmp_path / "top_k"), "--out", str(out)]) == 0
    md = (out / "compare.md").read_text()
    assert "## aux_topk: two knobs at a time" in md and "## top_k: two knobs" not in md
    assert "| aux_topk | moe.router.aux_coef=0.001, moe.top_k=2 | 1.5142 (n=1) | top_k | " \
           "moe.top_k=2 | 1.5150 (n=1) | +0.0008 |" in md
    assert (out / "shared_aux_topk_top_k.png").stat().st_size > 1000
    assert (out / "aux_topk_moe.router.aux_coef_x_moe.top_k.png").stat().st_size > 1000


def test_two_values_get_two_distinct_saturated_hues():
    (r1, g1, b1, _), (r2, g2, b2, _) = colors(2)
    h1, l1, s1 = colorsys.rgb_to_hls(r1, g1, b1)
    h2, l2, s2 = colorsys.rgb_to_hls(r2, g2, b2)
    assert abs(h1 - h2) > 0.05 and max(l1, l2) < 0.75 and min(s1, s2) > 0.4


def test_depends_on_needs_every_seed_to_agree():
    """The issue's case: row bests differ on the means, but the per-seed differences change
    sign, so no "depends on" and no bold (the claims table calls it inconclusive)."""
    rows = []
    for (aux, k), per_seed in {("0.001", 1): (1.70, 1.72), ("0.1", 1): (1.71, 1.71),
                               ("0.001", 2): (1.66, 1.68), ("0.1", 2): (1.67, 1.66)}.items():
        for seed, loss in enumerate(per_seed):
            rows.append({"status": "ok", "knob.seed": seed, "knob.moe.router.aux_coef": aux,
                         "knob.moe.top_k": k, "val_loss": loss})
    jt = joint_table(rows, "knob.moe.top_k", "knob.moe.router.aux_coef")
    assert jt.best_b("1") == "0.001" and jt.best_b("2") == "0.1"  # means differ...
    line = jt.interaction()
    assert "depends on" not in line.split(";")[0]  # ...but the seeds disagree
    assert line.startswith("no aux_coef is best at any top_k on every seed")
    assert "best top_k = 2 at every aux_coef" in line  # every seed agrees here
    md = markdown(jt, "val_loss")
    assert md[3] == "| 2 | 1.6700 (n=2) | 1.6650 (n=2) |"  # no bold: the seeds disagree


def test_expr_tied_knobs_are_folded_and_no_table_of_empty_cells(tmp_path):
    from analysis.twoway import folded_knobs, twoway_lines
    rows = []
    for g in (1, 2):
        for lr in (1e-3, 3e-3):
            for seed in (0, 1):
                rows.append({"status": "ok", "trial_id": f"{g}-{lr}-{seed}", "step": 1,
                             "knob.seed": seed, "knob.moe.granularity": g,
                             "knob.moe.num_experts": 8 * g, "knob.moe.top_k": 2 * g,
                             "knob.optim.lr": lr, "val_loss": 1.5 + 0.1 * g + lr + 0.01 * seed})
    assert folded_knobs(rows) == {"knob.moe.granularity": ["knob.moe.num_experts",
                                                           "knob.moe.top_k"],
                                  "knob.optim.lr": []}
    assert knob_pairs(rows) == [("knob.moe.granularity", "knob.optim.lr")]  # 1 table, not 6
    lines, pngs = twoway_lines("g", rows, "val_loss", tmp_path, "tw")
    assert len(pngs) == 1 and "folded into it" in "\n".join(lines)
    # a pair the design does not cross is not drawn as a table of empty cells
    rows2 = [r for r in rows if (r["knob.moe.granularity"], r["knob.optim.lr"]) != (2, 3e-3)]
    lines, pngs = twoway_lines("g", rows2, "val_loss", tmp_path, "tw2")
    assert not pngs and any("cells hold no trial" in x for x in lines)

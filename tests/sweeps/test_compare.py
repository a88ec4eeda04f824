"""analysis.compare on two synthetic result sets."""

import json

from analysis.compare import main, summarize
from sweeps.store.results import write_rows


def _rows(sweep, offset):
    rows = []
    for t, (knob, final) in enumerate([("a", 2.0), ("a", 1.5), ("b", 1.0)]):
        for step, loss in ((0, 3.0), (10, final + offset)):
            rows.append({"sweep": sweep, "trial_id": f"{sweep}{t}", "status": "ok",
                         "step": step, "tokens": step * 100, "val_loss": loss,
                         "knob.moe.top_k": knob})
    return rows


def test_compare_tables_and_plots(tmp_path, capsys):
    for name, off in (("s1", 0.0), ("s2", 0.5)):
        write_rows(tmp_path / name / "results.parquet", _rows(name, off))
    lines = summarize({"s1": _rows("s1", 0.0)}, "val_loss")
    by = {ln["value"]: ln for ln in lines}
    assert by["a"]["n"] == 2 and by["a"]["best"] == 1.5 and by["a"]["median"] == 1.75
    assert by["b"]["best"] == 1.0
    out = tmp_path / "cmp"
    assert main([str(tmp_path / "s1"), str(tmp_path / "s2"), "--out", str(out)]) == 0
    md = (out / "compare.md").read_text()
    assert "| s2 | moe.top_k | b | 1 | 1.5000 | 1.5000 |" in md
    assert len(list(out.glob("*.png"))) == 2
    imp = json.loads((out / "importance.json").read_text())  # one knob: all the importance
    assert [(k["knob"], k["importance"]) for k in imp["s1"]["knobs"]] == [("moe.top_k", 1.0)]
    assert "## s1: parameter importance" in md
    assert main([str(tmp_path / "missing")]) == 2


def test_two_runs_of_one_spec_are_both_shown(tmp_path):
    """Same sweep name in two folders (e.g. another --set): neither is dropped, no plot is
    overwritten."""
    for d, off in (("a", 0.0), ("b", 0.5)):
        write_rows(tmp_path / d / "s1" / "results.parquet", _rows("s1", off))
    out = tmp_path / "cmp"
    assert main([str(tmp_path / "a" / "s1"), str(tmp_path / "b" / "s1"), "--out",
                 str(out)]) == 0
    md = (out / "compare.md").read_text()
    assert md.count("| moe.top_k | b |") == 2 and "1.0000" in md and "1.5000" in md
    assert len(list(out.glob("*.png"))) == 2

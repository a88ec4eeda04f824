"""Console and files: full-width tables off a terminal, progress lines, umask-following outputs
(secrets stay 0600), one line per router statistic in the report."""

from __future__ import annotations

import os
import shutil

from analysis.sections import groups_section
from analysis.sweep import ROUTER_METRICS, STATS, glossary_lines, load_sweep
from moe_core.fsio import atomic_write_text, publish_dir, shared_mode
from sweeps.run import console
from sweeps.spec.sweep import parse_spec
from sweeps.store.results import RESULTS_FILE, write_rows
from sweeps.store.trust import hide_wandb_key
from tests.sweeps.tiny import tiny_base


def test_ranked_table_is_not_cut_when_stdout_is_not_a_terminal(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    spec = parse_spec({"sweep": "wide", "base": tiny_base(),
                       "search": {"optim.lr": {"grid": [1e-3]}}})
    long_id = "408c0_00000_0_upcycle.lr_policy=reset_peak=0.0003_seed=1234567"
    knob = "knob.upcycle.lr_policy.some_really_long_nested_knob_name"
    finals = [{"trial_id": long_id, knob: 0.000123, "val_loss": 1.5, "tokens": 2048,
               "status": "ok"}]
    summary = {"results": "r", "wall_s": 1, "parent_wall_s": 0, "tokens_saved_by_sharing": 0,
               "tokens_saved_by_branches": 0}
    console.print_ranked(spec, finals, summary)
    out = capsys.readouterr().out
    assert long_id in out and knob[len("knob."):] in out and "…" not in out


def test_progress_line_per_running_trial():
    now = [100.0]
    t = console.Ticker(every_s=30, clock=lambda: now[0])
    assert not t.due()
    rows = {0: {"step": 0, "tokens": 0, "wall_s": 0.0, "train_loss": None, "val_loss": 4.0},
            4: {"step": 4, "tokens": 4096, "wall_s": 2.0, "train_loss": 3.5, "val_loss": 3.25}}
    now[0] = 110.0
    t.reported("a")
    now[0] = 130.0
    assert t.due()
    lines = t.lines([("a", rows, 8), ("b", {}, 8)])
    assert lines == ["trial a: step 4/8  train_loss 3.5000  val_loss 3.2500  2,048 tok/s  "
                     "(last eval, 20 s ago)", "trial b: running, no eval reported yet"]
    assert not t.due()  # the next lines come 30 s later
    assert console.Ticker(every_s=0).due() is False  # 0 turns them off


def test_outputs_follow_the_umask_secrets_stay_private(tmp_path, monkeypatch):
    old = os.umask(0o022)
    try:
        assert shared_mode() == 0o644 and shared_mode(directory=True) == 0o755
        f = atomic_write_text(tmp_path / "summary.json", "{}")
        assert f.stat().st_mode & 0o777 == 0o644
        rows = write_rows(tmp_path / RESULTS_FILE, [{"trial_id": "t", "step": 0}])
        assert (tmp_path / RESULTS_FILE).stat().st_mode & 0o777 == 0o644, rows
        import tempfile

        tmp = tempfile.mkdtemp(dir=tmp_path)  # 0700, as a checkpoint or an export starts
        out = publish_dir(tmp, tmp_path / "export")
        assert out.stat().st_mode & 0o777 == 0o755
        os.umask(0o077)  # a private user keeps private files
        assert atomic_write_text(tmp_path / "p.json", "{}").stat().st_mode & 0o777 == 0o600
        os.umask(0o000)  # the W&B key's netrc stays 0600 whatever the umask
        monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
        monkeypatch.delenv("NETRC", raising=False)
        netrc = hide_wandb_key()
        assert netrc.stat().st_mode & 0o777 == 0o600
        shutil.rmtree(netrc.parent)
    finally:
        os.umask(old)


def test_every_router_statistic_is_explained_in_one_line(tmp_path):
    assert set(STATS) <= set(ROUTER_METRICS)
    assert all("\n" not in v for v in ROUTER_METRICS.values())
    rows = [{"sweep": "g", "trial_id": f"t{i}", "status": "ok", "step": 8, "tokens": 2048,
             "val_loss": 2.0 + i, "router.max_load": 0.3, "router.max1_max2": 1.7,
             "knob.optim.lr": lr, "optim.lr": lr} for i, lr in enumerate((1e-3, 3e-3))]
    write_rows(tmp_path / "g" / RESULTS_FILE, rows)
    md = "\n".join(groups_section(load_sweep(tmp_path / "g")).lines)
    assert "Router statistics:" in md
    assert f"- `router.max_load`: {ROUTER_METRICS['router.max_load']}" in md
    assert f"- `router.max1_max2`: {ROUTER_METRICS['router.max1_max2']}" in md
    assert glossary_lines(["val_loss"]) == []


def test_wide_width_off_a_terminal(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert console.wide_width() == console.WIDE
    monkeypatch.setenv("COLUMNS", "120")
    assert console.wide_width() is None  # the user's COLUMNS wins

"""Issue #32's hostile inputs: every one is refused in one line (exit 2, no traceback) before
anything starts or moves, by the command's real entry point; faults a run must survive (a
second run on the same folder, a stale lock, a changed spec on --resume, planted symbolic
links, damaged checkpoints and calibration files) are checked end to end up to Ray's start.

``CASES`` (sweeps.run --dry-run), ``CLI_CASES`` (the other commands) and the checkpoint cases
of ``tests/moe_core/test_hf_check.py`` form the hostile-input set counted in docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from moe_core.errors import SearchSpaceError
from sweeps.run import guard
from sweeps.run import trial as trainable
from sweeps.run.cli import main as run_main
from sweeps.spec.sweep import load_spec
from tests.hf_util import tiny_dense

SPEC = """\
sweep: t
base:
  model: {preset: debug}
  moe: {num_experts: 8, top_k: 2}
  data: {source: synthetic, synthetic_vocab: 32, seq_len: 32}
  batch: {global_batch: 8, micro_batch: 4}
  optim: {lr: 1.0e-3}
  schedule: {kind: wsd, warmup_steps: 2}
  eval: {every_steps: 2}
  tokens: 4096
  parent: {tokens: 2048}
  upcycle: {method: dense_to_moe}
search:
  optim.lr: {grid: [1.0e-3, 2.0e-3]}
"""

LAW = """\
sweep: t
base:
  model: {preset: debug}
  moe: {num_experts: 8, top_k: 2}
  data: {source: synthetic, synthetic_vocab: 32, seq_len: 32}
  batch: {global_batch: 8, micro_batch: 4}
  optim: {lr: 1.0e-3}
  schedule: {kind: wsd, warmup_steps: 2}
  eval: {every_steps: 2}
  tokens: 4096
  parent: {tokens: 2048}
  upcycle: {method: dense_to_moe}
search:
  parent.tokens: {grid: [1024, 2048, 4096]}
  tokens: {grid: [1024, 2048, 4096]}
algorithm: law
law: {law: eq8, target: alpha3, ci_width: 0.5, max_trials: 6, LAWX}
"""


def _law(extra: str) -> str:
    return LAW.replace("LAWX", extra)


def _calib(tmp: Path, data: bytes) -> Path:
    f = tmp / "calib.parquet"
    f.write_bytes(data)
    return f


FIFO_RUNG = SPEC + "scheduler: {kind: fifo, rung_metric: predicted_final, calibration: x}\n"

# (id, spec text (CALIB: a garbage calibration file's path), regex of the one line)
CASES = [
    ("law_loss_at_negative", _law("target: loss_at, loss_at: {D1: -1.0e9, D2: 1.0e9}")
     .replace("target: alpha3, ", ""), r"law\.loss_at\.D1=-1e\+09 must be > 0"),
    ("law_scratch_negative", _law("scratch: {A: -3.0, alpha: 0.2, E: 1.0}"),
     r"law\.scratch\.A=-3 must be > 0"),
    ("law_scratch_unknown_name", _law("scratch: {A: 3.0, alpah: 0.2, E: 1.0}"),
     r"law\.scratch\.alpah is not known; give A, alpha"),
    ("law_fix_unknown_name", _law("fix: {Q: 1.0}"),
     r"law\.fix\.Q is not a parameter of law eq8; fix one of A, alpha1"),
    ("law_dstar_range_inf", _law("dstar_range: [1.0e3, .inf]"),
     r"law\.dstar_range=\[1000, inf\] must be finite"),
    ("law_box_inf", _law("candidates: box, box: {tokens: [1.0, .inf]}"),
     r"law\.box\.tokens=\[1, inf\] must be finite"),
    ("law_points_1000", _law("candidates: box, box: {tokens: [1.0e3, 1.0e4], parent.tokens: "
                             "[1.0e3, 1.0e4]}, points: 1000"),
     r"law\.points=1000 over 2 box axes makes 1000000 candidates, more than the cap of 2,000"),
    ("law_bootstrap_1e12", _law("bootstrap: 1000000000000"),
     r"law\.bootstrap=1000000000000 is more than the cap of 10,000"),
    ("prune_similarity_below_floor", SPEC + "prune: {expert_similarity: {above: -2}}\n",
     r"prune\.expert_similarity\.above=-2 fires on every eval: router\.expert_similarity is "
     r"never below -1"),
    ("prune_dead_negative", SPEC + "prune: {dead_experts: {above: -0.5}}\n",
     r"prune\.dead_experts\.above=-0\.5 fires on every eval"),
    ("prune_drop_rate_negative", SPEC + "prune: {drop_rate: {above: -0.1}}\n",
     r"prune\.drop_rate\.above=-0\.1 fires on every eval"),
    ("prune_max_load_below_1_over_E", SPEC + "prune: {max_load_fraction: {above: 0.1}}\n",
     r"prune\.max_load_fraction\.above=0\.1 fires on every eval: with 8 experts the largest "
     r"load is at least 1/8"),
    ("rung_metric_under_fifo", FIFO_RUNG,
     r"scheduler\.rung_metric=predicted_final needs scheduler\.kind: asha"),
    ("calibration_garbage", SPEC + "scheduler: {kind: asha, rung_metric: predicted_final, "
     "calibration: CALIB}\n", r"scheduler\.calibration=.* is unreadable \(ArrowInvalid"),
    ("calibration_missing", SPEC + "scheduler: {kind: asha, rung_metric: predicted_final, "
     "calibration: /nonexistent/results.parquet}\n", r"calibration"),
]


def _run(argv: list[str], capsys) -> tuple[int, str]:
    rc = run_main(argv)
    err = capsys.readouterr().err
    return rc, err


def _one_line(err: str, match: str) -> None:
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert re.search(match, lines[0]), lines[0]


@pytest.mark.parametrize("name, text, match", CASES, ids=[c[0] for c in CASES])
def test_bad_spec_is_one_line_before_anything_starts(tmp_path, capsys, name, text, match):
    text = text.replace("CALIB", str(_calib(tmp_path, os.urandom(512))))
    f = tmp_path / "spec.yaml"
    f.write_text(text)
    rc, err = _run([str(f), "--dry-run", "--results", str(tmp_path / "r")], capsys)
    assert rc == 2
    _one_line(err, match)


# ---- checkpoints: refused in --dry-run, and before previous results move -------------------


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return tiny_dense("llama", tmp_path_factory.mktemp("hf") / "llama")


def _pretrained_spec(tmp: Path, folder: Path) -> Path:
    d = yaml.safe_load(SPEC)
    d["base"].pop("model")
    d["base"]["parent"] = {"from_pretrained": str(folder)}
    d["base"]["data"]["synthetic_vocab"] = 97
    d["base"]["data"]["seq_len"] = 16
    d["base"]["upcycle"]["lr_policy"] = {"policy": "reset", "peak": 1e-3}
    d["results"] = str(tmp / "results")
    f = tmp / "spec.yaml"
    f.write_text(yaml.safe_dump(d))
    return f


def test_dry_run_checks_the_weights_and_nothing_moves(tmp_path, capsys, llama):
    bad = tmp_path / "bad"
    bad.mkdir()
    for x in llama.iterdir():
        (bad / x.name).write_bytes(x.read_bytes())
    f = _pretrained_spec(tmp_path, bad)
    rc, err = _run([str(f), "--dry-run"], capsys)
    assert rc == 0 and "all finite" in err, err
    w = bad / "model.safetensors"
    w.write_bytes(w.read_bytes()[:-100])  # truncated
    res = tmp_path / "results" / "t"
    res.mkdir(parents=True)
    (res / "results.parquet").write_bytes(b"an earlier run's results")
    for argv in ([str(f), "--dry-run"], [str(f)]):  # a real run too: refused before Ray starts
        rc, err = _run(argv, capsys)
        assert rc == 2
        _one_line(err, r"parent\.from_pretrained=.*truncated or corrupt")
    assert (res / "results.parquet").read_bytes() == b"an earlier run's results"
    assert not (res / "previous").exists()


def test_planted_symlink_out_of_the_results_folder_is_refused(tmp_path, capsys):
    f = tmp_path / "spec.yaml"
    f.write_text(SPEC + f"results: {tmp_path / 'results'}\n")
    res = tmp_path / "results" / "t"
    res.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (res / "export").symlink_to(elsewhere)
    rc, err = _run([str(f), "--dry-run"], capsys)
    assert rc == 2
    _one_line(err, r"export leads to .*elsewhere, outside .*results/t \(a symbolic link\)")
    assert list(elsewhere.iterdir()) == []


# ---- one run per results folder -------------------------------------------------------------

HOLD = """
import sys, time
from sweeps.run.guard import held
with held(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


def test_second_run_on_a_folder_is_refused_naming_the_holder(tmp_path, capsys):
    f = tmp_path / "spec.yaml"
    f.write_text(SPEC + f"results: {tmp_path / 'results'}\n")
    res = tmp_path / "results" / "t"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(res)], stdout=subprocess.PIPE,
                              text=True, env=dict(os.environ, PYTHONPATH=os.getcwd()))
    try:
        assert holder.stdout.readline().strip() == "held"
        rc, err = _run([str(f)], capsys)  # a real run: refused before Ray starts
        assert rc == 2
        _one_line(err, rf"is in use by another run \(pid {holder.pid} on host \S+ since "
                       r"\d{4}-\d\d-\d\dT")
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone: its lock is taken over, with a message
    lock = guard.LocalRunLock(res)
    msg = lock.acquire()
    assert msg is not None and f"from pid {holder.pid}" in msg and "which is gone" in msg
    lock.release()
    assert guard.LocalRunLock(res).acquire() is None  # released cleanly: no takeover message


def test_lock_for_another_storage_is_looked_up_by_scheme():
    with pytest.raises(Exception, match=r"no run lock for ftp:// storage"):
        guard.run_lock("ftp://host/results/t")
    assert guard.LOCKS["s3"] is guard.ObjectRunLock and guard.LOCKS["gs"] is guard.ObjectRunLock


# ---- --resume runs what it says ----------------------------------------------------------------


def test_resume_refuses_a_changed_search_space(tmp_path):
    f = tmp_path / "spec.yaml"
    f.write_text(SPEC)
    spec = load_spec(str(f), results=str(tmp_path / "r"))
    guard.record_spec(spec, tmp_path)
    guard.check_resume_spec(spec, tmp_path, force=False)  # unchanged: fine
    g = tmp_path / "edited.yaml"
    g.write_text(SPEC.replace("2.0e-3]", "3.0e-3]"))
    edited = load_spec(str(g), results=str(tmp_path / "r"))
    with pytest.raises(SearchSpaceError, match=r"search\.optim\.lr\.values was \[0\.001, "
                                               r"0\.002\], now \[0\.001, 0\.003\].*--force-spec"):
        guard.check_resume_spec(edited, tmp_path, force=False)
    said = []
    guard.check_resume_spec(edited, tmp_path, force=True, say=said.append)
    assert "resuming with a changed spec" in said[0]
    guard.check_resume_spec(edited, tmp_path, force=False)  # the new one is recorded
    base = load_spec(str(f), ["base.optim.lr=5e-3"], results=str(tmp_path / "r"))
    with pytest.raises(SearchSpaceError, match=r"base\.optim\.lr was 0\.001, now 0\.005"):
        guard.check_resume_spec(base, tmp_path, force=False)


# ---- the other commands ------------------------------------------------------------------------


def _sweep_csv(tmp: Path, edit: dict | None = None) -> Path:
    """A D1 × D2 table and from-scratch rows analysis.decide accepts, with ``edit`` applied."""
    from sweeps.testing.simulate import SimulatedStudy

    study = SimulatedStudy(N1=1e9, sigma=0.003, seed=1)
    rows = []
    grid = np.geomspace(0.5e9, 8e9, 4)
    for i, d1 in enumerate(grid):
        for d2 in grid:
            rows.append({"trial_id": f"u{i}_{d2:.0f}", "kind": "upcycled", "parent_key": f"p{i}",
                         "upcycle.method": "dense_to_moe", "N1": 1e9, "N2": 1.75e9, "D1": d1,
                         "D2": d2, "tokens": d2, "status": "ok", "step": 1,
                         "val_loss": study.loss({"D1": d1, "D2": d2})})
    sc = study.scratch
    for d in np.geomspace(0.5e9, 16e9, 5):
        rows.append({"trial_id": f"s{d:.0f}", "kind": "moe", "parent_key": "", "N1": 8e9,
                     "N2": 1.75e9, "D1": 0, "D2": d, "tokens": d, "status": "ok", "step": 1,
                     "val_loss": sc["A"] * d ** -sc["alpha"] + sc["E"]})
    df = pd.DataFrame(rows)
    for (row, col), v in (edit or {}).items():
        df.loc[row, col] = v
    f = tmp / "sweep.csv"
    df.to_csv(f, index=False)
    return f


def _garbage(tmp: Path, name: str = "g.parquet") -> Path:
    f = tmp / name
    f.write_bytes(os.urandom(700))
    return f


def _results_dir(tmp: Path) -> Path:
    d = tmp / "res"
    d.mkdir()
    _garbage(d, "results.parquet")
    return d


CLI_CASES = [
    ("decide_one_inf_d2", ["analysis.decide", "CSV_INF_D2", "--bootstrap", "5"],
     r"1 trial\(s\) have a non-finite D2 \(inf\)"),
    ("decide_bootstrap_1e9", ["analysis.decide", "CSV", "--bootstrap", "1000000000"],
     r"--bootstrap 1000000000: must lie in \[0, 10,000\]"),
    ("decide_n1_nan", ["analysis.decide", "CSV", "--n1", "nan"], r"--n1 nan: not finite"),
    ("decide_budget_inf", ["analysis.decide", "CSV", "--budget-tokens", "inf"],
     r"--budget-tokens inf: not finite"),
    ("decide_garbage_parquet", ["analysis.decide", "GARBAGE"], r"Parquet magic bytes"),
    ("fit_inf_loss", ["analysis.fit", "CSV_INF_LOSS", "--law", "upcycled_mul"],
     r"1 row\(s\) have an infinite val_loss"),
    ("fit_bootstrap_1e12", ["analysis.fit", "CSV", "--law", "upcycled_mul", "--bootstrap",
                            "1000000000000"], r"--bootstrap 1000000000000: must lie in"),
    ("fit_fix_inf", ["analysis.fit", "CSV", "--law", "upcycled_mul", "--fix", "E=inf"],
     r"--fix 'E=inf': 'inf' is not finite"),
    ("fit_garbage_results_dir", ["analysis.fit", "RESDIR", "--law", "upcycled_mul"],
     r"Parquet magic bytes.*the inputs are unchanged"),
    ("noise_garbage", ["analysis.noise", "GARBAGE"], r"Parquet magic bytes"),
    ("report_garbage_results_dir", ["analysis.report", "RESDIR"], r"Parquet magic bytes"),
    ("report_bootstrap_huge", ["analysis.report", "RESDIR", "--bootstrap", "99999999"],
     r"--bootstrap 99999999: must lie in"),
    ("report_out_is_foreign_folder", ["analysis.report", "CSV_DIR", "--out", "FOREIGN"],
     r"--out .*foreign exists and holds files this command did not write"),
    ("report_out_is_a_file", ["analysis.report", "CSV_DIR", "--out", "BADJSON"],
     r"--out .*bad\.json is a file"),
    ("report_out_is_the_input", ["analysis.report", "CSV", "--out", "CSV"],
     r"--out .*sweep\.csv is or overlaps the input"),
    ("derived_bad_json", ["analysis.derived", "dstar", "--n1", "1e9", "--upcycled", "BADJSON"],
     r"Expecting value.*JSONDecodeError"),
    ("derived_missing_file", ["analysis.derived", "dstar", "--n1", "1e9", "--upcycled",
                              "/nonexistent.json"], r"No such file or directory at /nonexistent"),
    ("derived_n1_inf", ["analysis.derived", "dstar", "--n1", "inf"], r"--n1 inf: not finite"),
    ("compare_garbage", ["analysis.compare", "RESDIR"], r"Parquet magic bytes"),
    ("compare_out_foreign", ["analysis.compare", "RESDIR", "--out", "FOREIGN"],
     r"exists and holds files this command did not write"),
    ("train_bad_yaml", ["moe_core.train", "BADJSON"], r"not valid YAML"),
    ("train_missing", ["moe_core.train", "/nonexistent.yaml"], r"nonexistent\.yaml"),
    ("hf_upcycle_missing_src", ["moe_core.hf", "upcycle", "/nonexistent", "OUTNEW",
                                "--experts", "4", "--top-k", "2"], r"is not a directory"),
    ("hf_export_garbage_ckpt", ["moe_core.hf", "export", "FOREIGN", "OUTNEW"],
     r"foreign is not a checkpoint \(no meta\.json\)"),
]


def _fill(argv: list[str], tmp: Path) -> list[str]:
    foreign = tmp / "foreign"
    foreign.mkdir(exist_ok=True)
    (foreign / "mine.txt").write_text("not yours")
    csv = _sweep_csv(tmp)
    subs = {"CSV": csv, "CSV_DIR": csv, "FOREIGN": foreign, "OUTNEW": tmp / "out",
            "GARBAGE": _garbage(tmp), "RESDIR": _results_dir(tmp),
            "CSV_INF_D2": _sweep_csv(tmp / "inf", {(3, "D2"): np.inf})
            if (tmp / "inf").mkdir() is None else None,
            "CSV_INF_LOSS": _sweep_csv(tmp / "infl", {(2, "val_loss"): np.inf})
            if (tmp / "infl").mkdir() is None else None}
    bad = tmp / "bad.json"
    bad.write_text('{"a":')
    subs["BADJSON"] = bad
    return [str(subs.get(a, a)) for a in argv]


@pytest.mark.parametrize("name, argv, match", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_every_command_answers_bad_input_in_one_line(tmp_path, name, argv, match):
    argv = _fill(argv, tmp_path)
    p = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    lines = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    assert "Traceback" not in p.stderr and len(lines) == 1, p.stderr[-2000:]
    assert re.search(match, lines[0]), lines[0]
    assert (tmp_path / "foreign" / "mine.txt").read_text() == "not yours"


def test_debug_shows_the_traceback(tmp_path):
    g = _garbage(tmp_path)
    p = subprocess.run([sys.executable, "-m", "analysis.noise", str(g), "--debug"],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert p.returncode != 0 and "Traceback" in p.stderr


def test_analysis_says_what_it_left_out(tmp_path, caplog):
    from analysis.data import load_points

    f = _sweep_csv(tmp_path, {(0, "val_loss"): np.nan, (1, "status"): "failed",
                              (2, "D2"): -1.0})
    with caplog.at_level("WARNING", logger="analysis"):
        pts = load_points(f, "upcycled_mul", where={"kind": "upcycled"})
    assert len(pts.L) == 16 - 3
    msg = " ".join(r.getMessage() for r in caplog.records)
    assert "1 with no or non-positive val_loss" in msg and "1 with no or non-positive D2" in msg
    assert "1 failed trial(s)" in msg


def test_counts():
    """The size of the hostile set (reported in docs/reliability.md)."""
    assert len(CASES) >= 15 and len(CLI_CASES) >= 20
    print(json.dumps({"spec_cases": len(CASES), "cli_cases": len(CLI_CASES)}))


def test_export_never_replaces_a_folder_it_did_not_write(tmp_path):
    from moe_core.config import ModelConfig, MoEConfig
    from moe_core.errors import ConfigError
    from moe_core.model import build_model
    from moe_core.outdir import MARKER

    cfg = ModelConfig(vocab_size=32, n_layer=1, d_model=16, n_head=2, d_ff=32, max_seq_len=16,
                      moe=MoEConfig(num_experts=4, top_k=2))
    state = build_model(cfg).state_dict()
    foreign = tmp_path / "export" / "trial_a"
    foreign.mkdir(parents=True)
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds files this command did not write"):
        trainable.export_hf(state, cfg, foreign)
    assert (foreign / "notes.txt").read_text() == "mine"
    out = tmp_path / "export" / "trial_b"
    trainable.export_hf(state, cfg, out)
    assert (out / MARKER).is_file() and (out / "config.json").is_file()
    trainable.export_hf(state, cfg, out)  # ours: a re-export (a resumed trial) replaces it
    assert (out / MARKER).is_file()
    link = tmp_path / "export" / "trial_c"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        trainable.export_hf(state, cfg, link)


def _layers_1e9(d: Path) -> None:
    c = json.loads((d / "config.json").read_text())
    c["num_hidden_layers"] = 1e9
    (d / "config.json").write_text(json.dumps(c))


def _config_3gib(d: Path) -> None:
    with open(d / "config.json", "r+b") as f:  # sparse: 3 GiB long, nothing on disk
        f.truncate(3 << 30)


@pytest.mark.parametrize("damage, match", [
    (_layers_1e9, r"num_hidden_layers=1000000000\.0 must be an integer in \[1, 1,024\]"),
    (_config_3gib, r"config\.json is 3,221,225,472 bytes, more than 1,048,576"),
], ids=["num_hidden_layers_1e9", "config_json_3GiB"])
def test_dry_run_refuses_absurd_configs_at_once(tmp_path, capsys, llama, damage, match):
    bad = tmp_path / "bad"
    bad.mkdir()
    for x in llama.iterdir():
        (bad / x.name).write_bytes(x.read_bytes())
    damage(bad)
    rc, err = _run([str(_pretrained_spec(tmp_path, bad)), "--dry-run"], capsys)
    assert rc == 2
    _one_line(err, match)


def test_noise_says_what_it_left_out(caplog):
    from analysis.noise import noise_structure

    rows = [{"trial_id": f"t{i}{s}", "status": "ok", "step": 1, "D1": 1e9, "D2": d2, "seed": s,
             "parent_key": f"p{s}", "val_loss": 3.0 + 0.01 * s + 0.001 * i}
            for i, d2 in enumerate((1e9, 2e9, 4e9)) for s in (0, 1)]
    rows[0]["val_loss"] = float("nan")
    rows[1]["val_loss"] = -1.0
    with caplog.at_level("WARNING", logger="analysis"):
        noise_structure(pd.DataFrame(rows))
    assert "left out 2 of 6 final evals" in caplog.text

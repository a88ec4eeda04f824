"""``python -m analysis.best``: the best trial's facts, ties / diverged trials / no checkpoint in
one line each, and ``--export`` writing a folder transformers loads with its tokenizer."""

from __future__ import annotations

import json

import pytest

from analysis.best import best_trial, check_export_dir, main
from moe_core.errors import UpcycleError
from tests.sweeps.tiny import run_sweep_cli, tiny_base


def _row(tid, status="ok", loss=1.0, step=8):
    return {"trial_id": tid, "status": status, "val_loss": loss, "step": step}


def test_ties_go_to_the_smallest_id_and_others_are_left_out_by_status():
    rows = [_row("b", loss=1.5), _row("a", loss=1.5), _row("c", loss=2.0),
            _row("d", "diverged", None), _row("e", "failed", None), _row("f", loss=float("nan")),
            _row("c", loss=9.0, step=2)]  # an earlier eval: only the final row counts
    p = best_trial(rows)
    assert p.row["trial_id"] == "a" and p.ties == ("b",)
    assert p.left_out == {"diverged": ("d",), "failed": ("e",), "no val_loss": ("f",)}
    assert best_trial(rows, mode="max").row["trial_id"] == "c"
    with pytest.raises(UpcycleError, match=r"no finished trial has a finite val_loss \(1 "
                                           r"diverged\)"):
        best_trial([_row("d", "diverged", None)])


def test_a_non_empty_export_folder_is_refused_unless_overwrite_and_ours(tmp_path):
    from moe_core.outdir import mark_out_dir

    (tmp_path / "mine.txt").write_text("keep")
    with pytest.raises(UpcycleError, match="exists and is not empty; give a new folder, or "
                                           "--overwrite"):
        check_export_dir(tmp_path, overwrite=False)
    with pytest.raises(UpcycleError, match="was not written by this project"):
        check_export_dir(tmp_path, overwrite=True)  # the user's folder: never replaced
    assert check_export_dir(tmp_path / "new", overwrite=False) is None
    with pytest.raises(UpcycleError, match="is a file"):
        check_export_dir(tmp_path / "mine.txt", overwrite=True)
    ours = tmp_path / "ours"
    ours.mkdir()
    mark_out_dir(ours, "analysis.best")
    assert "replacing" in check_export_dir(ours, overwrite=True)
    with pytest.raises(UpcycleError, match="is inside the source"):
        check_export_dir(tmp_path / "res" / "x", overwrite=False, results=tmp_path / "res")


@pytest.mark.slow
@pytest.mark.distributed  # starts Ray
def test_best_exports_a_folder_transformers_loads_with_its_tokenizer(tmp_path, capsys):
    import torch
    import transformers

    base = tiny_base(data={"source": "stdlib", "tokenizer": "bytes", "seq_len": 32,
                           "max_corpus_bytes": 100_000},
                     moe={"num_experts": 4, "top_k": 2, "router": {"order": "topk_softmax"}})
    spec = {"base": base, "search": {"optim.lr": {"grid": [3e-5, 3e-3]}}, "seeds": [0],
            "logging": {"wandb": {"mode": "disabled"}}, "resources": {"cpus": 1, "gpus": 0}}
    rows = run_sweep_cli(tmp_path, "best", spec)
    res = tmp_path / "r" / "best"
    folders = sorted(p.name for p in (res / "tune").iterdir() if p.is_dir())
    assert any(f.endswith("_lr=3e-05_seed=0") for f in folders), folders  # not peak=0.0000
    want = min((r for r in rows if r["status"] == "ok" and r["step"] == 8),
               key=lambda r: r["val_loss"])
    assert main([str(res), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["trial_id"] == want["trial_id"] and info["value"] == want["val_loss"]
    assert info["checkpoint"].startswith(str(res / "tune" / want["trial_id"]))
    assert info["checkpoint_step"] == 8 and info["knobs"]["optim.lr"] == "0.003"
    out = tmp_path / "hf"
    assert main([str(res), "--export", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "tokenizer: bytes" in printed and "transformers vs ours" in printed
    tok = transformers.AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True,
                                                              dtype=torch.float32)
    ids = tok("import sys\n", return_tensors="pt").input_ids
    assert ids[0].tolist() == list(b"import sys\n")
    gen = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert gen.shape == (1, ids.shape[1] + 4)
    assert main([str(res), "--export", str(out)]) == 2  # now it is not empty
    assert "exists and is not empty" in capsys.readouterr().err

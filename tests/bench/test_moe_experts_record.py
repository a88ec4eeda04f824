"""``bench/moe_experts.py --record`` / ``--merge``: a CUDA run's rows become kernel-choice entries
that ``moe.experts_kernel: auto`` reads; a CPU row (Liger not timed) becomes none."""

from __future__ import annotations

import json
import sys

from moe_core.moe import kernel_choice as kc

H100 = "NVIDIA H100 80GB HBM3"


def _rows():
    return [
        {"shape": "fine E64", "d": 2048, "f": 1024, "E": 64, "K": 8, "tokens": 16384,
         "grouped_s": 0.02, "liger_s": 0.015, "liger_prelaid_s": 0.013, "choice": "liger"},
        {"shape": "Qwen3-30B-A3B E128", "d": 2048, "f": 768, "E": 128, "K": 8,
         "tokens": 16384, "grouped_s": 0.018, "liger_s": 0.021, "choice": "grouped"},
        {"shape": "cpu", "d": 256, "f": 128, "E": 64, "K": 8, "tokens": 2048,
         "grouped_s": 0.4, "liger_s": "not measured (Triton kernels need CUDA)",
         "choice": "grouped"},
    ]


def test_rows_become_entries_and_auto_reads_them(tmp_path):
    from bench.moe_experts import record, table_entries

    new = table_entries(_rows(), H100, "bfloat16", "2026-11-25")
    assert [(e["device"], e["E"], e["choice"]) for e in new] == [("H100", 64, "liger"),
                                                                  ("H100", 128, "grouped")]
    path = tmp_path / "kernel_choice.json"
    assert record(str(path), new) == 2
    assert record(str(path), new[:1]) == 2  # the same shape again replaces, not adds
    table = kc.load_table(path)
    kw = dict(device_name="NVIDIA H100 PCIe", dtype="bfloat16", K=8, d=2048)
    assert kc.choose(table, E=64, f=1024, **kw) == "liger"
    assert kc.choose(table, E=128, f=768, **kw) == "grouped"
    assert kc.choose(table, E=64, f=1024, **{**kw, "device_name": "NVIDIA A100-SXM4-80GB"}) \
        == "grouped"


def test_merge_fills_a_table_from_a_sessions_table(tmp_path, monkeypatch, capsys):
    from bench.moe_experts import main, table_entries

    session, table = tmp_path / "session.json", tmp_path / "table.json"
    kc.write_table(session, table_entries(_rows(), H100, "bfloat16", "2026-11-25"))
    monkeypatch.setattr(sys, "argv", ["moe_experts.py", "--merge", str(session),
                                      "--record", str(table)])
    main()
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["entries"] == 2
    assert kc.load_table(table) == kc.load_table(session)

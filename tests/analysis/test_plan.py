"""``analysis.decide --plan``: the proxy experiment for one's own checkpoint, its cost by hand,
and extrapolations said with how far outside they are (also inside intervals)."""

from __future__ import annotations

import json

import pytest

from analysis.cli import decide_main
from analysis.decide.extrapolation import describe_outside, interval_note, outside_factor
from analysis.decide.plan import choose_proxy, grid_flops, log_grid, plan, scratch_flops
from moe_core.config import MoEConfig
from moe_core.errors import FitError

LLAMA_1B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
            "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
            "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True,
            "hidden_act": "silu"}


def _ckpt(tmp_path, cfg=LLAMA_1B):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_extrapolation_factors_by_hand():
    assert outside_factor(2e12, 1e9, 5e10) == pytest.approx(40.0)
    assert outside_factor(1e8, 1e9, 5e10) == pytest.approx(10.0)
    assert outside_factor(1e10, 1e9, 5e10) == 1.0
    assert describe_outside("D1", 2e12, 1e9, 5e10) == \
        "D1 = 2e+12 is 40x the largest fitted D1 (5e+10)"
    assert describe_outside("D2", 1e8, 1e9, 5e10) == \
        "D2 = 1e+08 is 1/10 of the smallest fitted D2 (1e+09)"
    assert describe_outside("D1", 1e10, 1e9, 5e10) is None
    assert interval_note([1.0, 40.0, 3.0]) == " (extrapolated 40x)" and interval_note([1]) == ""


def test_grid_and_flops_by_hand():
    assert log_grid(1.6e9, n=5, span=16) == [100_000_000, 200_000_000, 400_000_000,
                                             800_000_000, 1_600_000_000]
    g = grid_flops(10.0, 20.0, [1.0, 2.0], [1.0, 4.0])
    assert g["parents"] == 6 * 10 * 3  # 6·N1·(1 + 2)
    assert g["trials_alone"] == 2 * 6 * 20 * 5  # two parents × 6·N2·(1 + 4)
    assert g["trials_branched"] == pytest.approx(2 * 6 * 20 * (4 + 0.1 * 1))
    assert scratch_flops(20.0, [1.0, 2.0, 4.0]) == pytest.approx(6 * 20 * (4 + 0.1 * 3))


def test_plan_for_a_llama_1b(tmp_path):
    moe = MoEConfig(num_experts=8, top_k=2)
    r = plan(_ckpt(tmp_path), 5e10, d1=9e12, max_proxy_tokens=2e11)
    c, p = r["checkpoint"], r["proxy"]
    # 16 blocks × (attention 2048·(32+2·8)·64 + 32·64·2048 + SwiGLU 3·2048·8192 + 2 norms)
    # + the final norm
    assert c["N1"] == 16 * (2048 * 48 * 64 + 2048 * 2048 + 3 * 2048 * 8192 + 2 * 2048) + 2048
    assert p["preset"] == choose_proxy(c["N1"], 128256, moe, 10.0).preset == "44M"
    assert p["N1"] <= c["N1"] / 10
    assert "grouped-query attention (32:8)" in p["differs"] and "tied embeddings" in p["differs"]
    assert r["grid"]["D1"][-1] == 2e11 and r["grid"]["D2"][-1] == 5e10
    assert len(r["runs"]) == 3 and [x["preset"] for x in r["runs"]] == ["44M", "15M", "tiny"]
    assert r["cost"]["flops"] == pytest.approx(sum(x["flops"] for x in r["runs"]))
    assert r["cost"]["gpu_hours"] == pytest.approx(r["cost"]["flops"] / 400e12 / 3600)
    assert any(ln.startswith("D1 = 9e+12 is 45x the largest grid D1 (2e+11)")
               for ln in r["extrapolated"])
    assert not any(ln.startswith("D2 =") for ln in r["extrapolated"])  # the budget is covered


def test_plan_cli_text_and_refusals(tmp_path, capsys):
    ck = _ckpt(tmp_path)
    assert decide_main(["--plan", "--from-pretrained", str(ck), "--budget-tokens", "5e10"]) == 0
    out = capsys.readouterr().out
    assert "proxy: preset 44M" in out and "transfers (000 §5, Eq. 12)" in out
    assert "does not transfer" in out and "(assumed: 35% MFU of the NVIDIA H100" in out
    assert "D1: your checkpoint's training tokens are not in config.json" in out
    assert decide_main(["--plan", "--budget-tokens", "5e10"]) == 2
    assert "--plan needs --from-pretrained" in capsys.readouterr().err
    (tmp_path / "m").mkdir()
    moe = dict(LLAMA_1B, architectures=["MixtralForCausalLM"], model_type="mixtral")
    with pytest.raises(FitError, match="not a dense checkpoint"):
        plan(_ckpt(tmp_path / "m", moe), 1e9)

"""Every bad input to ``python -m moe_core.train`` is one line naming the key and the fix, exit
code 2, no traceback, before training starts (through ``moe_core.train.__main__.main``)."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from moe_core.train.__main__ import main

CFG = """\
name: r
seed: 0
model: {preset: debug}
data: {source: synthetic, synthetic_vocab: 32, seq_len: 32}
batch: {global_batch: 8, micro_batch: 4}
tokens: 512
"""
SET_BOMB = "name=[&a0 [x, x, x, x, x, x, x, x, x, x], " + ", ".join(
    f"&a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 6)) + "]"

# (id, config text, --set overrides, regex the one error line must match)
CASES = [
    ("seed_bool", CFG.replace("seed: 0", "seed: true"), [],
     r"^error: seed=True is true/false, not a number; use an integer$"),
    ("name_null", CFG.replace("name: r", "name: null"), [], r"^error: name=None must be a string$"),
    ("duplicate_key", CFG + "tokens: 1024\n", [],
     r"duplicate key tokens \(line 7, column 1\): YAML would silently keep the last one"),
    ("set_syntax_error", CFG, ["optim.lr=["],
     r"--set optim\.lr is not valid YAML \(line 1, column 2\).*; quote a text value"),
    ("set_python_tag", CFG, ["optim.lr=!!python/object/apply:os.system ['echo hi']"],
     r"--set optim\.lr is not valid YAML .*could not determine a constructor"),
    ("set_alias_bomb", CFG, [SET_BOMB],
     r"--set name: the value at name\[\d\] .*expands to more than 100,000 values"),
    ("set_duplicate_key", CFG, ["optim={lr: 1, lr: 2}"], r"--set optim: duplicate key optim\.lr"),
    ("strategy", CFG + "parent: {tokens: 256, moe: {num_experts: 2, top_k: 1}}\n"
     "moe: {num_experts: 4, top_k: 1}\nupcycle: {method: expand_experts, strategy: best}\n", [],
     r"upcycle\.strategy='best' is not known"),
]
# Already refused before this change; kept so they stay refused.
LISTED = [
    ("seed_text", CFG.replace("seed: 0", "seed: abc"), [],
     r"^error: seed='abc' must be an integer"),
    ("tokens_inf", CFG.replace("tokens: 512", "tokens: .inf"), [],
     r"^error: tokens=inf is not finite; use an integer$"),
    ("set_lr_text", CFG, ["optim.lr=abc"], r"^error: optim\.lr='abc' must be a number$"),
]


def _one_error_line(rc: int, err: str) -> str:
    assert rc == 2, err[-2000:]
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[:2000]
    assert lines[0].startswith("error: ") and len(lines[0]) <= 1010
    return lines[0]


@pytest.mark.parametrize("name, text, overrides, match", CASES + LISTED,
                         ids=[c[0] for c in CASES + LISTED])
def test_hostile_config_is_one_line(name, text, overrides, match, tmp_path, capsys):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    argv = [str(f), "--quiet", "--cache", str(tmp_path / "cache")]
    argv += [a for o in overrides for a in ("--set", o)]
    t = time.perf_counter()
    rc = main(argv)
    assert time.perf_counter() - t < 30
    line = _one_error_line(rc, capsys.readouterr().err)
    assert re.search(match, line), line
    assert not (tmp_path / "cache").exists()  # refused before any training


@pytest.mark.parametrize("kind", ["non_utf8", "directory"])
def test_unreadable_config_file_is_one_line(kind, tmp_path, capsys):
    f = tmp_path / "c.yaml"
    if kind == "non_utf8":
        f.write_bytes(CFG.encode() + b"# caf\xe9\n")
        match = r"is not UTF-8 text \(byte 0xe9 at offset \d+\); save it as UTF-8"
    else:
        f.mkdir()
        match = r"is a directory; give a YAML file"
    line = _one_error_line(main([str(f)]), capsys.readouterr().err)
    assert re.search(match, line), line


def test_tokens_beyond_int64_refused_before_training(tmp_path):
    """``tokens: 1e30`` used to start a run of 10^30 tokens (it never ended)."""
    f = tmp_path / "c.yaml"
    f.write_text(CFG.replace("tokens: 512", "tokens: 1.0e+30"))
    out = subprocess.run([sys.executable, "-m", "moe_core.train", str(f), "--quiet",
                          "--cache", str(tmp_path / "cache")],
                         capture_output=True, text=True, timeout=120)
    line = _one_error_line(out.returncode, out.stderr)
    assert re.search(r"^error: tokens=1e\+30 is out of range: an integer is at most 2\*\*63 - 1",
                      line), line

"""Every bad input to ``python -m sweeps.run`` is one line naming the key and the fix, exit code
2, no traceback, before Ray starts, and quickly (bounded YAML, bounded ``expr``, bounded grids).

Each case goes through the real entry point, ``sweeps.run.main([...])``; the ones that used to
hang or eat memory run in a subprocess with a timeout.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

from sweeps.run.cli import main

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
"""


def _bomb(key: str) -> str:
    """A YAML alias bomb under ``key``: 10 levels of 10 aliases = 10^10 values expanded."""
    rows = ["  - &a0 [x, x, x, x, x, x, x, x, x, x]"]
    rows += [f"  - &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    return f"{key}:\n" + "\n".join(rows) + "\n"


def _sub(old: str, new: str) -> str:
    assert old in SPEC
    return SPEC.replace(old, new)


GRID = "".join(f"  {k}: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n" for k in (
    "optim.eps", "optim.weight_decay", "optim.grad_clip", "eval.batches", "eval.seed", "seed",
    "data.synthetic_seed"))

# (id, spec text, --set overrides, regex the one error line must match: the key and the fix)
CASES = [
    # numbers: bools are not numbers, ints are finite int64, floats are finite
    ("bool_for_int", _sub("num_experts: 8", "num_experts: true"), [],
     r"moe\.num_experts=True is true/false, not a number; use an integer"),
    ("bool_seed", SPEC + "seeds: [true]\n", [], r"seeds\[0\]=True is true/false"),
    ("seeds_not_a_list", SPEC + "seeds: abc\n", [], r"seeds='abc' must be a list"),
    ("seeds_int", SPEC + "seeds: 3\n", [], r"seeds=3 must be a list"),
    ("seeds_map", SPEC + "seeds: {a: 1}\n", [], r"seeds=\{'a': 1\} must be a list"),
    ("seeds_nan", SPEC + "seeds: [.nan]\n", [], r"seeds\[0\]=nan is not finite; use an integer"),
    ("seeds_repeated", SPEC + "seeds: [0, 0]\n", [], r"seeds=\[0, 0\] repeats 0"),
    ("tokens_beyond_int64", _sub("tokens: 4096", "tokens: 1" + "0" * 30), [],
     r"tokens=1000000000000000000000000000000 is out of range"),
    ("tokens_1e30", _sub("tokens: 4096", "tokens: 1.0e+30"), [], r"tokens=1e\+30 is out of range"),
    ("cpus_nan", SPEC + "resources: {cpus: .nan}\n", [], r"resources\.cpus=nan is not finite"),
    ("gpus_inf", SPEC + "resources: {gpus: .inf}\n", [], r"resources\.gpus=inf is not finite"),
    ("flush_inf", SPEC + "storage: {flush_s: .inf}\n", [], r"storage\.flush_s=inf is not finite"),
    ("router_float_inf", _sub("top_k: 2}", "top_k: 2, router: {adaptive_xi: .inf}}"), [],
     r"moe\.router\.adaptive_xi=inf is not finite"),
    ("num_samples_bool", SPEC + "num_samples: true\n", [], r"num_samples=True must be an integer"),
    ("max_concurrent_bool", SPEC + "max_concurrent: true\n", [],
     r"max_concurrent=True must be an integer >= 1"),
    ("max_failures_bool", SPEC + "failure: {max_failures: true}\n", [],
     r"failure\.max_failures=True is true/false"),
    # containers and scalars of the wrong kind
    ("failure_list", SPEC + "failure: [1]\n", [], r"failure must be a mapping, got list"),
    ("failure_unknown_key", SPEC + "failure: {max_fail: 3}\n", [],
     r"unknown key failure\.max_fail; known keys under failure: max_failures"),
    ("wsd_branches_text", SPEC + "wsd_branches: maybe\n", [],
     r"wsd_branches='maybe' must be true or false"),
    ("results_map", SPEC + "results: {a: 1}\n", [], r"results=\{'a': 1\} must be a string"),
    ("description_map", SPEC + "description: {a: 1}\n", [], r"description=\{'a': 1\} must be"),
    ("binary_text", SPEC + "description: !!binary 'AAAA'\n", [],
     r"description=b'\\x00\\x00\\x00' must be a string"),
    ("top_level_keys_not_text", SPEC + "1: a\nnull: b\n", [], r"unknown top-level key 1; known"),
    # ranges
    ("asha_reduction_factor_1", SPEC + "algorithm: random\nnum_samples: 4\n"
     "scheduler: {kind: asha, reduction_factor: 1}\n", [],
     r"scheduler\.reduction_factor=1 must be > 1"),
    ("asha_reduction_factor_nan", SPEC + "algorithm: random\nnum_samples: 4\n"
     "scheduler: {kind: asha, reduction_factor: .nan}\n", [],
     r"scheduler\.reduction_factor=nan is not finite"),
    ("asha_grace_0", SPEC + "algorithm: random\nnum_samples: 4\n"
     "scheduler: {kind: asha, grace_period: 0}\n", [], r"scheduler\.grace_period=0 must be >= 1"),
    ("unknown_upcycle_strategy", _sub("parent: {tokens: 2048}",
                                      "parent: {tokens: 2048, moe: {num_experts: 4, top_k: 2}}\n"
                                      "  upcycle: {method: expand_experts, strategy: bogus}"), [],
     r"upcycle\.strategy='bogus' is not known; use one of uniform, grad_norm"),
    ("num_samples_huge", SPEC + "algorithm: random\nnum_samples: 100000000000000000000\n", [],
     r"num_samples=100,000,000,000,000,000,000 × 1 grid point\(s\).* more than 10,000"),
    ("grid_too_long", SPEC + "search:\n  optim.lr: [" +
     ", ".join(f"{1e-3 + i * 1e-9:.9g}" for i in range(20_000)) + "]\n", [],
     r"20,000 grid point\(s\).* more than 10,000; lower num_samples or shrink the grid"),
    ("choice_too_long", SPEC + "algorithm: random\nsearch:\n  optim.lr: {choice: [" +
     ", ".join(f"{1e-3 + i * 1e-9:.9g}" for i in range(20_000)) + "]}\n", [],
     r"validating the search builds 1 grid point\(s\) × 20,000 combinations"),
    # search keys and conditions
    ("when_unknown_key", SPEC + "search:\n  moe.top_k: {grid: [1, 2], when: {moe.nonsense: 8}}\n",
     [], r"search\.moe\.top_k\.when: unknown key moe\.nonsense; known keys under moe: "),
    ("when_key_not_text", SPEC + "search:\n  moe.top_k: {grid: [1, 2], when: {1: 8}}\n", [],
     r"search\.moe\.top_k\.when: 1 is not a dotted key"),
    ("when_value_map", SPEC + "search:\n  moe.top_k: {grid: [1, 2], "
     "when: {moe.num_experts: {a: 1}}}\n", [],
     r"search\.moe\.top_k\.when\.moe\.num_experts=\{'a': 1\} must be a value or a list"),
    ("search_key_not_text", SPEC + "search:\n  1: [1, 2]\n", [],
     r"search key 1 must be a dotted key of the trial config"),
    ("search_key_never_applies", SPEC + "search:\n  optim.lrr: {grid: [1], "
     "when: {moe.num_experts: 99}}\n", [], r"search\.optim\.lrr: unknown key optim\.lrr"),
    # expr: every error is one line naming search.<key>.expr
    ("expr_division_by_zero", SPEC + "search:\n  moe.top_k: {expr: '1/0'}\n", [],
     r"search\.moe\.top_k\.expr='1/0' cannot be evaluated: ZeroDivisionError"),
    ("expr_modulo_zero", SPEC + "search:\n  moe.top_k: {expr: '5 % 0'}\n", [],
     r"search\.moe\.top_k\.expr='5 % 0' cannot be evaluated: ZeroDivisionError"),
    ("expr_min_no_args", SPEC + "search:\n  moe.top_k: {expr: 'min()'}\n", [],
     r"search\.moe\.top_k\.expr='min\(\)' cannot be evaluated: TypeError"),
    ("expr_int_of_text", SPEC + "search:\n  moe.top_k: {expr: 'int(data.source)'}\n", [],
     r"search\.moe\.top_k\.expr='int\(data\.source\)': data\.source='synthetic' is not a number"),
    ("expr_text_times_int", SPEC + "search:\n  moe.top_k: {expr: 'data.source * 1000000000'}\n",
     [], r"search\.moe\.top_k\.expr=.*data\.source='synthetic' is not a number"),
    ("expr_round_of_text", SPEC + "search:\n  moe.top_k: {expr: 'round(data.source)'}\n", [],
     r"search\.moe\.top_k\.expr=.*is not a number"),
    ("expr_round_huge_digits", SPEC + "search:\n  moe.top_k: "
     "{expr: 'round(5, -1000000000000000000)'}\n", [],
     r"search\.moe\.top_k\.expr=.*round to -1000000000000000000 digits is beyond ±64"),
    ("expr_bool_constant", SPEC + "search:\n  moe.top_k: {expr: 'True + 1'}\n", [],
     r"search\.moe\.top_k\.expr='True \+ 1': a constant=True is not a number"),
    ("expr_keywords", SPEC + "search:\n  moe.top_k: {expr: 'max(1, 2, key=3)'}\n", [],
     r"search\.moe\.top_k\.expr=.*only arithmetic"),
    ("expr_too_long", SPEC + "search:\n  moe.top_k: {expr: '" + "1+" * 5000 + "1'}\n", [],
     r"search\.moe\.top_k\.expr=.*must be a string of at most 500 characters"),
    # the file itself
    ("duplicate_key", _sub("optim: {lr: 1.0e-3}", "optim:\n    lr: 1.0e-3\n    lr: 100"), [],
     r"duplicate key base\.optim\.lr \(line 9, column 5\): YAML would silently keep the last"),
    ("duplicate_top_key", SPEC + "num_samples: 1\nnum_samples: 2\n", [],
     r"duplicate key num_samples \(line 13, column 1\)"),
    ("deep_nesting", SPEC + "description: " + "[" * 20_000 + "]" * 20_000 + "\n", [],
     r"nested deeper than 50 levels .*; flatten it"),
    ("int_of_5000_digits", _sub("tokens: 4096", "tokens: " + "1" * 5000), [],
     r"at base\.tokens \(line 10, column 11\) cannot be read"),
    ("recursive_alias", SPEC + "description: &r [1, *r]\n", [],
     r"the alias at description\[1\] names a value that contains it"),
    ("alias_chain_too_deep", SPEC + "description:\n  - &c0 [1]\n" +
     "".join(f"  - &c{i} [*c{i - 1}]\n" for i in range(1, 200)), [],
     r"the value at description\[50\] .*expands to more than 100,000 values or 50 levels"),
    ("invalid_date", SPEC + "description: 2024-13-45\n", [],
     r"'2024-13-45' at description \(line 12, column 14\) cannot be read"),
    ("python_tag", SPEC + "description: !!python/object/apply:os.system ['echo hi']\n", [],
     r"is not valid YAML \(line 12, column 14\): could not determine a constructor"),
    ("two_documents", SPEC + "---\nsweep: u\n", [],
     r"is not valid YAML \(line 12, column 1\): expected a single document"),
    ("nul_character", SPEC + "description: a\x00b\n", [],
     r"is not valid YAML: unacceptable character #x0000"),
    # --set values are YAML too: one line naming the key
    ("set_syntax_error", SPEC, ["base.optim.lr=["],
     r"--set base\.optim\.lr is not valid YAML .*; quote a text value"),
    ("set_python_tag", SPEC, ["base.optim.lr=!!python/object/apply:os.system ['echo hi']"],
     r"--set base\.optim\.lr is not valid YAML .*could not determine a constructor"),
    ("set_duplicate_key", SPEC, ["base.optim={lr: 1, lr: 2}"],
     r"--set base\.optim: duplicate key base\.optim\.lr"),
    ("set_search_syntax_error", SPEC, ["search.optim.lr.grid=[1,"],
     r"--set search\.optim\.lr\.grid is not valid YAML"),
    ("set_search_python_tag", SPEC, ["search.optim.lr.grid=!!python/name:os.system"],
     r"--set search\.optim\.lr\.grid is not valid YAML .*could not determine a constructor"),
    ("set_search_into_a_list", SPEC + "search: [1]\n", ["search.optim.lr.grid=[1]"],
     r"search must map dotted config keys to distributions"),
]


@pytest.fixture(autouse=True)
def _keep_signal_handlers():
    """``main`` installs the sweep's SIGINT/SIGTERM handlers: give pytest its own back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def _one_error_line(rc: int, err: str) -> str:
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[:2000]
    assert lines[0].startswith("error: ") and len(lines[0]) <= 1010
    return lines[0]


def _cli(argv: list[str], capsys) -> str:
    t = time.perf_counter()
    rc = main(argv)
    assert time.perf_counter() - t < 30
    out = capsys.readouterr()
    return _one_error_line(rc, out.err)


@pytest.mark.parametrize("name, text, overrides, match", CASES, ids=[c[0] for c in CASES])
def test_hostile_spec_is_one_line(name, text, overrides, match, tmp_path, capsys):
    f = tmp_path / f"{name}.yaml"
    f.write_text(text)
    argv = [str(f), "--dry-run"] + [a for o in overrides for a in ("--set", o)]
    line = _cli(argv, capsys)
    assert re.search(match, line), line


@pytest.mark.parametrize("kind", ["non_utf8", "directory", "too_large"])
def test_unreadable_spec_file_is_one_line(kind, tmp_path, capsys):
    f = tmp_path / "s.yaml"
    if kind == "non_utf8":
        f.write_bytes(SPEC.encode() + b"description: caf\xe9\n")
        match = r"is not UTF-8 text \(byte 0xe9 at offset \d+\); save it as UTF-8"
    elif kind == "directory":
        f.mkdir()
        match = r"config file .*s\.yaml is a directory; give a YAML file"
    else:
        f.write_text(SPEC + "description: '" + "x" * (2 << 20) + "'\n")
        match = r"config file .*s\.yaml is larger than 1 MiB"
    line = _cli([str(f), "--dry-run"], capsys)
    assert re.search(match, line), line


def test_max_concurrent_flag(tmp_path, capsys):
    f = tmp_path / "s.yaml"
    f.write_text(SPEC)
    line = _cli([str(f), "--dry-run", "--max-concurrent", "0"], capsys)
    assert line == "error: --max-concurrent=0 must be >= 1"


# Inputs that hung or ate memory before the caps: a subprocess with a timeout, so a regression
# fails the test instead of hanging the suite.
SLOW = [
    ("expr_power_tower", SPEC + "search:\n  moe.top_k: {expr: '9**9**9**9'}\n", [],
     r"search\.moe\.top_k\.expr='9\*\*9\*\*9\*\*9': the exponent 387420489 is beyond ±64"),
    ("alias_bomb", SPEC + _bomb("description"), [],
     r"the value at description\[\d\] .*expands to more than 100,000 values"),
    ("alias_bomb_in_set", SPEC, ["description=[&a0 [x, x, x, x, x, x, x, x, x, x], " + ", ".join(
        f"&a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)) + "]"],
     r"--set description: the value at description\[\d\] .*expands to more than 100,000"),
    ("grid_product", SPEC + "search:\n" + GRID, [],
     r"10,000,000 grid point\(s\).* more than 10,000"),
]


@pytest.mark.parametrize("name, text, overrides, match", SLOW, ids=[c[0] for c in SLOW])
def test_hostile_spec_that_hung_is_refused_quickly(name, text, overrides, match, tmp_path):
    f = tmp_path / f"{name}.yaml"
    f.write_text(text)
    argv = [str(f), "--dry-run"] + [a for o in overrides for a in ("--set", o)]
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "sweeps.run", *argv], capture_output=True,
                         text=True, timeout=120)
    assert time.perf_counter() - t < 120
    line = _one_error_line(out.returncode, out.stderr)
    assert re.search(match, line), line

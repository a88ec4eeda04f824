"""The analysis command lines' shared error contract: a FitError is one line on stderr, exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from analysis.cli import ERROR_EXIT, _kv, error_line, one_line_errors
from moe_core.errors import FitError


def test_one_line_errors_turns_a_fit_error_into_one_stderr_line(capsys):
    @one_line_errors
    def main(msg: str, *, rc: int = 0) -> int:
        """doc"""
        if msg:
            raise FitError(msg)
        return rc

    assert main.__name__ == "main" and main.__doc__ == "doc"
    assert main("", rc=3) == 3
    assert capsys.readouterr().err == ""
    assert main("no usable points\nfor law 'x'") == ERROR_EXIT == 2
    assert capsys.readouterr().err == "error: no usable points for law 'x'\n"
    assert error_line("a\n\nb") == "error: a  b"


def test_other_exceptions_are_not_swallowed():
    @one_line_errors
    def main() -> int:
        raise TypeError("a bug, not a user error")

    with pytest.raises(TypeError, match="a bug"):
        main()


def test_input_and_disk_errors_are_one_line_saying_what_was_kept(capsys, monkeypatch):
    """The shared boundary (``moe_core.errors.cli_boundary``): ValueError / KeyError from input
    parsing and OSError (a full disk) are one line; --debug or UPCYCLE_DEBUG=1 re-raise."""
    import errno

    from moe_core.errors import cli_boundary

    @cli_boundary(kept="finished rows are kept")
    def main(argv=None) -> int:
        kind = argv[0]
        if kind == "disk":
            raise OSError(errno.ENOSPC, "No space left on device", "/results/x.parquet")
        if kind == "key":
            raise KeyError("weight_map")
        raise ValueError("could not convert string to float: 'abc'")

    assert main(["disk"]) == 2
    assert capsys.readouterr().err == (
        "error: the disk is full at /results/x.parquet (OSError errno 28); finished rows are "
        "kept (--debug shows the traceback)\n")
    assert main(["key"]) == 2
    assert "missing key 'weight_map' in the input (KeyError)" in capsys.readouterr().err
    assert main(["value"]) == 2
    assert "could not convert string to float: 'abc' (ValueError)" in capsys.readouterr().err
    with pytest.raises(OSError):
        main(["disk", "--debug"])
    monkeypatch.setenv("UPCYCLE_DEBUG", "1")
    with pytest.raises(KeyError):
        main(["key"])


def test_kv_flags():
    assert _kv(["E=1.5,A=2", "B=3"], "--fix", True) == {"E": 1.5, "A": 2.0, "B": 3.0}
    assert _kv([" N = params ,"], "--columns", False) == {"N": "params"}
    with pytest.raises(FitError, match="--fix 'E': expected NAME=VALUE"):
        _kv(["E"], "--fix", True)
    with pytest.raises(FitError, match="'x' is not a number"):
        _kv(["E=x"], "--fix", True)


@pytest.mark.parametrize("argv, needle", [
    (["analysis.fit", "/nonexistent/results", "--law", "upcycled_mul"], "does not exist"),
    (["analysis.fit", "/nonexistent.csv", "--law", "nope"], "unknown law 'nope'"),
    (["analysis.report", "/nonexistent/results"], "does not exist"),
    (["analysis.report", "/nonexistent", "--fix", "E"], "--fix 'E': expected NAME=VALUE"),
    (["analysis.derived", "cost", "--T", "10", "--tau", "11", "--s-e", "1", "--s-me", "2"],
     "must lie in [0, T=10.0]"),
])
def test_every_analysis_cli_exits_2_with_one_error_line(argv, needle):
    p = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stdout == ""
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], p.stderr


def test_derived_cli_as_a_module():
    p = subprocess.run([sys.executable, "-m", "analysis.derived", "advice", "--c-moe", "3",
                        "--c-dense", "1"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and '"verdict": "from_scratch"' in p.stdout and p.stderr == ""

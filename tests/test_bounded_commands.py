"""Issue #43, classes 7, 8 and 9: hostile inputs to every command are one line on stderr and
exit status 2, in bounded time, never a hang or a traceback (issue #40: one error boundary).

Each case runs the real command in-process through ``upcycle_sweeps.cli.main`` (the
``upcycle-sweeps`` front door, which calls each command's ``main``). A case that used to hang
runs under ``SIGALRM``, so a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import time
from pathlib import Path

import pytest

from tests.sweeps.test_hostile_inputs import SPEC
from upcycle_sweeps.cli import main as cli

LAW = SPEC.replace("sweep: t\n", "sweep: law\n") + """\
search:
  parent.tokens: {grid: [2048, 4096]}
  tokens: {grid: [4096, 8192]}
algorithm: law
law: {law: eq8, target: alpha3, max_trials: 4}
"""


@pytest.fixture(autouse=True)
def _keep_signal_handlers():
    """``sweeps.run`` installs the sweep's SIGINT/SIGTERM handlers: give pytest its own back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)}
    yield
    signal.alarm(0)
    for s, h in saved.items():
        signal.signal(s, h)


def one_line(argv: list[str], capsys, within_s: float = 30) -> str:
    """Run ``upcycle-sweeps ARGV``; its one error line (exit 2, no traceback, in time)."""

    def hung(*_):
        raise AssertionError(f"upcycle-sweeps {' '.join(argv)} hung for {within_s:g} s")

    signal.signal(signal.SIGALRM, hung)
    signal.alarm(int(within_s))
    t = time.perf_counter()
    try:
        rc = cli(argv)
    finally:
        signal.alarm(0)
    assert time.perf_counter() - t < within_s
    err = capsys.readouterr().err
    assert rc == 2, err[-2000:]
    assert "Traceback" not in err
    lines = [x for x in err.strip().splitlines() if x.startswith("error: ")]
    assert len(lines) == 1 and len(lines[0]) <= 1010, err[-2000:]
    return lines[0]


# ---- inputs made in the case's folder ------------------------------------------------------


def _spec(tmp: Path, text: str = SPEC) -> Path:
    f = tmp / "s.yaml"
    f.write_text(text)
    return f


def _fifo(tmp: Path, name: str = "pipe.yaml") -> Path:
    f = tmp / name
    os.mkfifo(f)  # nobody ever writes to it: opening it for reading blocks
    return f


def _loop(tmp: Path) -> Path:
    a, b = tmp / "a.yaml", tmp / "b.yaml"
    a.symlink_to(b)
    b.symlink_to(a)
    return a


def _deep(n: int = 100_000) -> str:
    return '{"a": ' * n + "1" + "}" * n


def _results(tmp: Path, summary: str | None = None, parquet: bytes | None = None) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp / "res"
    d.mkdir()
    pq.write_table(pa.Table.from_pylist([{"trial_id": "a", "status": "ok", "val_loss": 1.0,
                                          "step": 8}]), d / "results.parquet")
    if summary is not None:
        (d / "summary.json").write_text(summary)
    if parquet is not None:
        (d / "results.parquet").write_bytes(parquet)
    return d


def _decide_csv(tmp: Path) -> Path:
    from tests.analysis.test_decide_noise_model import _frame

    f = tmp / "sweep.csv"
    _frame(3).to_csv(f, index=False)
    return f


# (id, argv builder given the case's folder, regex the one error line must match)
CASES = [
    # class 7: hangs
    ("run_spec_named_pipe", lambda t: ["run", str(_fifo(t)), "--dry-run"],
     r"config file .*pipe\.yaml is a named pipe; give a YAML file"),
    ("train_config_named_pipe", lambda t: ["train", str(_fifo(t))],
     r"config file .*pipe\.yaml is a named pipe"),
    ("run_spec_symlink_loop", lambda t: ["run", str(_loop(t)), "--dry-run"],
     r"config file .*a\.yaml is a symbolic link loop"),
    ("train_config_symlink_loop", lambda t: ["train", str(_loop(t))],
     r"a\.yaml is a symbolic link loop"),
    # class 8: tracebacks where one line is promised
    ("run_set_key_500_levels", lambda t: ["run", str(_spec(t)), "--dry-run", "--set",
                                          ".".join(["base"] + ["x"] * 500) + "=1"],
     r"--set 'base\.x\.x.*: the key has 501 levels, more than 50"),
    ("train_set_key_500_levels", lambda t: ["train", "configs/train_debug.yaml", "--set",
                                            ".".join(["x"] * 500) + "=1"],
     r"--set 'x\.x\.x.*: the key has 500 levels, more than 50"),
    ("best_summary_not_an_object", lambda t: ["best", str(_results(t, "[1, 2]"))],
     r"summary\.json is not a JSON object \(damaged\); give --metric"),
    ("best_summary_garbage", lambda t: ["best", str(_results(t, "{\"metric\": "))],
     r"summary .*summary\.json is not valid JSON"),
    ("best_summary_deep", lambda t: ["best", str(_results(t, _deep()))],
     r"summary .*summary\.json is nested deeper than 64 levels"),
    ("best_summary_metric_not_text", lambda t: ["best", str(_results(t, '{"metric": [1]}'))],
     r"summary\.json: metric=\[1\] is not a column name; give --metric"),
    ("best_summary_named_pipe", lambda t: ["best", str(_fifo(_results(t), "summary.json")
                                                       .parent)],
     r"summary\.json is a named pipe"),
    ("best_parquet_garbage", lambda t: ["best", str(_results(t, parquet=b"PAR1" + os.urandom(
        300)))], r"results\.parquet|Parquet"),
    ("decide_widen_1e308", lambda t: ["decide", str(_decide_csv(t)), "--bootstrap", "5",
                                      "--widen", "1e308"],
     r"--widen 1e\+308: must be at most 100"),
    ("decide_price_negative", lambda t: ["decide", str(_decide_csv(t)), "--price", "-2"],
     r"--price -2\.0: must be >= 0"),
    ("derived_cost_gpus_0", lambda t: ["derived", "cost", "--T", "100", "--tau", "10",
                                       "--s-e", "1", "--s-me", "2", "--gpus", "0"],
     r"--gpus 0: must be an integer >= 1"),
    ("derived_cost_seconds_0", lambda t: ["derived", "cost", "--T", "100", "--tau", "10",
                                          "--s-e", "1", "--s-me", "0"],
     r"seconds per step must be > 0"),
    # class 9: out-of-range values
    ("run_price_nan", lambda t: ["run", str(_spec(t)), "--dry-run", "--price", "nan"],
     r"--price nan: must be a finite price per GPU-hour in \[0, 10000\]"),
    ("run_price_inf", lambda t: ["run", str(_spec(t)), "--dry-run", "--price", "inf"],
     r"--price inf: must be a finite price"),
    ("run_price_negative", lambda t: ["run", str(_spec(t)), "--dry-run", "--price", "-1"],
     r"--price -1\.0: must be a finite price"),
    ("run_gpu_empty", lambda t: ["run", str(_spec(t)), "--dry-run", "--gpu", ""],
     r"--gpu '': give a GPU type such as h100"),
    ("run_law_widen_1e308", lambda t: ["run", str(_spec(t, LAW)), "--dry-run", "--set",
                                       "law.widen=1e308"],
     r"law\.widen=1e\+308 must be at most 100"),
    ("run_law_widen_nan", lambda t: ["run", str(_spec(t, LAW)), "--dry-run", "--set",
                                     "law.widen=.nan"], r"law\.widen"),
    ("run_law_unknown_variable", lambda t: ["run", str(_spec(t, LAW)), "--dry-run", "--set",
                                            "law.variables={Q: model.d_model}"],
     r"law\.variables\.Q: eq8 has no variable Q; its variables are D1, D2"),
    ("run_liger_on_cpu", lambda t: ["run", str(_spec(t)), "--dry-run", "--set",
                                    "base.moe.experts_kernel=liger", "--set",
                                    "resources.gpus=0"],
     r"moe\.experts_kernel=liger needs a CUDA device, and these trials run on the CPU"),
    ("run_cpus_1e9", lambda t: ["run", str(_spec(t)), "--dry-run", "--set",
                                "resources.cpus=1e9"],
     r"resources\.cpus=1000000000\.0 must be > 0 and at most 1024"),
    ("run_gpus_1e9", lambda t: ["run", str(_spec(t)), "--dry-run", "--set",
                                "resources.gpus=1e9"], r"resources\.gpus=1e\+?0?9|resources\.gpus"),
    ("cluster_idle_timeout_nan", lambda t: ["cluster", "local", "up", "--dir", str(t / "c"),
                                            "--idle-timeout-s", "nan"],
     r"idle_timeout_s=nan \(--idle-timeout-s\) must lie in \(0, 86400\]"),
    ("cluster_idle_timeout_inf", lambda t: ["cluster", "local", "up", "--dir", str(t / "c"),
                                            "--idle-timeout-s", "inf"],
     r"idle_timeout_s=inf"),
    ("cluster_max_workers_1e6", lambda t: ["cluster", "local", "up", "--dir", str(t / "c"),
                                           "--max-workers", "1000000"],
     r"max_workers=1000000 \(--max-workers\) must be at most 64"),
]


@pytest.mark.parametrize("name, build, match", CASES, ids=[c[0] for c in CASES])
def test_hostile_input_is_one_line(name, build, match, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # configs/ for the train cases
    line = one_line(build(tmp_path), capsys)
    assert re.search(match, line), line


# ---- hf upcycle: a corrupt model.safetensors, a hostile config.json ---------------------------


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    from tests.hf_util import tiny_dense

    return tiny_dense("llama", tmp_path_factory.mktemp("hf") / "llama")


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _header_too_large(f: Path) -> None:
    f.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")


def _truncated(f: Path) -> None:
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _garbage(f: Path) -> None:
    f.write_bytes(struct.pack("<Q", 16) + b"\xff" * 16 + os.urandom(64))


DAMAGE = {
    "header_too_large": (_header_too_large, r"its header claims 1,099,511,627,776 bytes"),
    "truncated": (_truncated, r"truncated or corrupt"),
    "empty": (lambda f: f.write_bytes(b""), r"is 0 bytes: not a safetensors file"),
    "garbage": (_garbage, r"the safetensors header is not valid JSON"),
    "deep_header": (lambda f: f.write_bytes(struct.pack("<Q", 200_001) + _deep().encode()[
        :200_001]), r"safetensors header"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_hf_upcycle_refuses_a_corrupt_model_safetensors_in_one_line(damage, llama, tmp_path,
                                                                     capsys):
    src = _copy(llama, tmp_path / "src")
    edit, match = DAMAGE[damage]
    edit(src / "model.safetensors")
    line = one_line(["upcycle", str(src), str(tmp_path / "out"), "--experts", "4", "--top-k",
                     "2", "--no-verify"], capsys)
    assert re.search(match, line), line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("what", ["deep", "named_pipe"])
def test_hf_upcycle_refuses_a_hostile_config_json_in_one_line(what, llama, tmp_path, capsys):
    src = _copy(llama, tmp_path / "src")
    (src / "config.json").unlink()
    if what == "deep":
        (src / "config.json").write_text(_deep())
    else:
        os.mkfifo(src / "config.json")
    line = one_line(["upcycle", str(src), str(tmp_path / "out"), "--experts", "4", "--top-k",
                     "2", "--no-verify"], capsys)
    assert re.search(r"nested deeper than 64 levels|config\.json", line), line
    assert "RecursionError" not in line


# ---- --address: bounded probes, and auto never joins this machine's cluster ---------------


def test_address_of_a_live_port_that_is_not_ray_fails_in_seconds(tmp_path, capsys,
                                                                  monkeypatch):
    """A TCP server that accepts and says nothing (``ray.init`` waited 150 s on it)."""
    monkeypatch.setattr("sweeps.run.address.TIMEOUT_S", 1.0)  # 5 s in use; 1 s keeps the test short
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        t = time.perf_counter()
        line = one_line(["run", str(_spec(tmp_path)), "--dry-run", "--address",
                         f"127.0.0.1:{port}"], capsys, within_s=20)
    assert time.perf_counter() - t < 10
    assert re.search(rf"127\.0\.0\.1:{port} answers but is not a Ray head .*no answer within "
                     r"1 s", line), line


def test_address_of_an_http_server_is_not_ray(capsys):
    import http.server
    import threading

    from moe_core.errors import UpcycleError
    from sweeps.run.address import check_address

    srv = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with pytest.raises(UpcycleError, match="is not a Ray head"):
            check_address(f"127.0.0.1:{srv.server_port}", timeout_s=3)
    finally:
        srv.shutdown()
        srv.server_close()


def test_dry_run_address_auto_never_joins_this_machines_cluster(tmp_path, capsys,
                                                                 monkeypatch):
    """Without ``RAY_ADDRESS``, ``auto`` would read /tmp/ray/ray_current_cluster and join
    whichever cluster this machine started last: the dry run never imports Ray for it."""
    import sys
    import types

    joined = []
    fake = types.ModuleType("sweeps.run.driver")
    fake.cluster_nodes = lambda address: joined.append(address) or []
    monkeypatch.setitem(sys.modules, "sweeps.run.driver", fake)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cli(["run", str(_spec(tmp_path)), "--dry-run", "--address", "auto"]) == 0
    assert joined == []
    assert "RAY_ADDRESS is not set, so the plan is checked against this machine" in \
        capsys.readouterr().err


# ---- a full disk leaves no .tmp-* behind -------------------------------------------------------


def _enospc(*_a, **_k):
    import errno

    raise OSError(errno.ENOSPC, "No space left on device")


def test_full_disk_in_hf_upcycle_is_one_line_and_leaves_no_tmp(llama, tmp_path, capsys,
                                                                monkeypatch):
    import moe_core.hf.save as save

    monkeypatch.setattr(save, "save_file", _enospc)
    line = one_line(["upcycle", str(llama), str(tmp_path / "out"), "--experts", "4", "--top-k",
                     "2", "--no-verify"], capsys)
    assert "the disk is full (OSError errno 28); the source is unchanged" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_full_disk_in_the_parent_cache_leaves_no_tmp(tmp_path, monkeypatch):
    import torch

    import moe_core.train.checkpoint as ck

    monkeypatch.setattr(ck, "save_file", _enospc)
    with pytest.raises(OSError, match="No space left"):
        ck.save_checkpoint(tmp_path / "cache" / "key", model_state={"w": torch.ones(2)},
                           optimizer_state=None, meta={"step": 0})
    assert list((tmp_path / "cache").iterdir()) == []


# ---- the one boundary: counts and the cause kept -------------------------------------------


COMMAND_FILES = ["sweeps/run/cli.py", "analysis/best.py", "analysis/compare.py",
                 "sweeps/cluster/__main__.py", "moe_core/hf/__main__.py",
                 "moe_core/train/__main__.py", "analysis/cli.py", "analysis/report.py",
                 "upcycle_sweeps/cli.py"]


def test_no_command_prints_its_errors_by_hand():
    """Issue #40 item 6: every command raises and one boundary prints (was 6 commands)."""
    root = Path(__file__).resolve().parents[1]
    by_hand = [f for f in COMMAND_FILES if re.search(r"print\(f?[\"']error", (root / f)
                                                     .read_text())]
    assert by_hand == []
    assert all("cli_boundary" in (root / f).read_text() or "one_line_errors" in
               (root / f).read_text() for f in COMMAND_FILES)


@pytest.mark.parametrize("error, line", [
    (OSError("When reading information for key 'r/x' in bucket 'nope': AWS Error "
             "NO_SUCH_BUCKET during HeadObject operation"),
     "When reading information for key 'r/x' in bucket 'nope': AWS Error NO_SUCH_BUCKET "
     "during HeadObject operation (OSError)"),
    (OSError(28, "No space left on device", "/r/x"), "the disk is full at /r/x (OSError errno 28)"),
    (RecursionError("maximum recursion depth exceeded"),
     "the input is nested too deeply to read (RecursionError)"),
    (OverflowError("(34, 'Numerical result out of range')"),
     "(34, 'Numerical result out of range') (OverflowError)"),
])
def test_the_boundary_keeps_the_cause(error, line, capsys):
    from moe_core.errors import cli_boundary

    @cli_boundary(kept="kept")
    def main(argv=None) -> int:
        raise error

    assert main([]) == 2
    assert capsys.readouterr().err == f"error: {line}; kept (--debug shows the traceback)\n"


def test_an_error_raised_from_a_storage_error_keeps_it(capsys):
    from moe_core.errors import UpcycleError, cli_boundary

    @cli_boundary()
    def main(argv=None) -> int:
        try:
            raise OSError("AWS Error ACCESS_DENIED during PutObject: Access Denied")
        except OSError as e:
            raise UpcycleError("results s3://b/r: cannot write") from e

    assert main([]) == 2
    assert capsys.readouterr().err == (
        "error: results s3://b/r: cannot write (cause: AWS Error ACCESS_DENIED during "
        "PutObject: Access Denied (OSError))\n")


def test_counts():
    """The size of the hostile set (reported in docs/reliability.md)."""
    assert len(CASES) >= 25 and len(DAMAGE) == 5
    print(json.dumps({"cases": len(CASES), "safetensors_damage": len(DAMAGE)}))


# ---- class 10: object storage -----------------------------------------------------------------


@pytest.mark.parametrize("url, match", [
    ("s3:///x", r"results='s3:///x' names no bucket; write s3://BUCKET/PATH"),
    ("s3://My Bucket/x", r"'My Bucket' is not a bucket name"),
    ("gs://b/x", None),
    ("file://otherhost/x", r"a file:// URL names a local folder, file:///PATH"),
])
def test_a_malformed_results_url_is_one_line_in_the_dry_run(url, match, tmp_path, capsys):
    argv = ["run", str(_spec(tmp_path)), "--dry-run", "--results", url]
    if match is None:  # well formed: the dry run does not refuse it for its form
        from sweeps.spec import load_spec

        assert load_spec(str(_spec(tmp_path)), results=url).results_uri == "gs://b/x/t"
        return
    assert re.search(match, one_line(argv, capsys))


def test_file_urls_are_local_results_as_the_docs_say(tmp_path, capsys):
    """docs/storage.md accepts file:///PATH: a local folder (its lock is the local one), not
    "no run lock for file://"."""
    from sweeps.run.guard import LocalRunLock, run_lock
    from sweeps.spec import load_spec

    spec = load_spec(str(_spec(tmp_path)), results=f"file://{tmp_path}/r")
    assert spec.results == f"{tmp_path}/r" and spec.results_dir == tmp_path / "r" / "t"
    assert isinstance(run_lock(spec.results_uri), LocalRunLock)
    assert cli(["run", str(_spec(tmp_path)), "--dry-run", "--results",
                f"file://{tmp_path}/r"]) == 0


@pytest.mark.slow  # the AWS SDK retries a refused connection for about 6 s (little CPU)
def test_a_storage_error_keeps_the_providers_message(tmp_path, capsys, monkeypatch):
    """pyarrow's S3 errors are OSError without an errno: the line is the provider's message,
    never ``OSError (OSError errno None)``."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with socket.socket() as s:  # a port nobody listens on: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    line = one_line(["compare", f"s3://nope/x?endpoint_override=127.0.0.1:{port}&scheme=http",
                     "--out", str(tmp_path / "cmp")], capsys, within_s=60)
    assert re.search(r"bucket 'nope': AWS Error NETWORK_CONNECTION .*Could not connect", line)
    assert "errno None" not in line

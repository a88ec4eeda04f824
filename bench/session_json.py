"""The JSON files of ``bench/gpu_session.sh``: one per step, and ``summary.json`` over them.

    python bench/session_json.py step NAME RC SECONDS LOG [JUNIT_XML] > NAME.json
    python bench/session_json.py smi APPS_CSV GPU_CSV > smi_NAME.json
    python bench/session_json.py summary DIR > DIR/summary.json

``step``: the step's exit code and seconds, and either its bench's last JSON line (``result``)
or, for a pytest step, the counts and failed tests from its JUnit XML (``tests``). ``smi``: the
peak GPU memory of each process ``nvidia-smi`` saw, and the GPU's utilisation and clock.
``summary``: the figures the GPU issue asks for, each with the step it comes from.
Standard library only: it must run wherever the session runs.
"""

from __future__ import annotations

import csv
import json
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any


def last_json(log: Path) -> dict[str, Any] | None:
    if not log.exists():
        return None
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def junit(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    out = {k: sum(int(s.get(k, 0)) for s in suites)
           for k in ("tests", "failures", "errors", "skipped")}
    out["time_s"] = sum(float(s.get("time", 0)) for s in suites)
    out["failed"] = [f"{c.get('classname')}::{c.get('name')}" for s in suites
                     for c in s.iter("testcase")
                     if c.find("failure") is not None or c.find("error") is not None]
    out["passed"] = out["tests"] - out["failures"] - out["errors"] - out["skipped"]
    return out


def step(name: str, rc: str, seconds: str, log: str, xml: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"step": name, "exit": int(rc), "seconds": int(seconds),
                           "timed_out": int(rc) in (124, 137), "log": Path(log).name}
    if xml:
        out["tests"] = junit(Path(xml))
    else:
        out["result"] = last_json(Path(log))
    if "OutOfMemoryError" in (Path(log).read_text(errors="replace") if Path(log).exists()
                              else ""):
        out["out_of_memory"] = True
    return out


def _rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return [{k.strip(): (v or "").strip() for k, v in r.items() if k}
                for r in csv.DictReader(f, skipinitialspace=True)]


def _mib(v: str) -> float | None:
    try:
        return float(v.split()[0])
    except (ValueError, IndexError):
        return None


def smi(apps_csv: str, gpu_csv: str) -> dict[str, Any]:
    apps, gpu = _rows(Path(apps_csv)), _rows(Path(gpu_csv))
    if not apps and not gpu:
        return {"nvidia_smi": "absent or no samples"}
    procs: dict[str, dict[str, Any]] = {}
    for r in apps:
        pid, mem = r.get("pid", "?"), _mib(r.get("used_gpu_memory [MiB]", r.get(
            "used_memory [MiB]", "")))
        p = procs.setdefault(pid, {"pid": pid, "name": r.get("process_name", "?"),
                                   "peak_mib": 0.0, "samples": 0})
        p["samples"] += 1
        if mem is not None:
            p["peak_mib"] = max(p["peak_mib"], mem)
    util = [_mib(r.get("utilization.gpu [%]", "")) for r in gpu]
    used = [_mib(r.get("memory.used [MiB]", "")) for r in gpu]
    return {"processes": sorted(procs.values(), key=lambda p: -p["peak_mib"]),
            "most_at_once": len(procs), "gpu_samples": len(gpu),
            "gpu_util_max_pct": max((u for u in util if u is not None), default=None),
            "gpu_mem_used_max_mib": max((u for u in used if u is not None), default=None)}


def _result(d: Path, name: str) -> dict[str, Any] | None:
    p = d / f"{name}.json"
    return json.loads(p.read_text()).get("result") if p.exists() else None


def _mfu(root: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The MFU rows of the ``mfu_*`` steps (one per model x ``bf16_mode``), and their raw
    ``train_step`` lines (what ``bench/merge_session.py`` merges into the throughput table)."""
    rows, raw = [], []
    for name in ("mfu_dense", "mfu_moe"):
        r = _result(root, name)
        if not r or r.get("bench") != "train_step":
            continue
        raw.append(r)
        rows += [{"preset": x["preset"], "model": "E8top2" if x["moe"] else "dense",
                  "bf16_mode": x.get("bf16_mode", "auto"), "mfu": x.get("mfu"),
                  "tokens_per_s": x["tokens_per_s"], "micro": r["micro"], "seq": r["seq"],
                  "peak_mem_gib": x.get("peak_mem_gib")} for x in r.get("rows", [])]
    return rows, raw


def summary(d: str) -> dict[str, Any]:
    """Every step's exit and time, and the figures (absent when not measured)."""
    root = Path(d)
    steps = {p.stem: json.loads(p.read_text()) for p in sorted(root.glob("*.json"))
             if p.stem not in ("summary", "kernel_choice") and not p.stem.startswith("smi_")}
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d", time.gmtime()),
                           "steps": {k: {"exit": v.get("exit"), "seconds": v.get("seconds"),
                                         "timed_out": v.get("timed_out"),
                                         **({"tests": {x: v["tests"][x] for x in
                                                       ("passed", "failed")}}
                                            if v.get("tests") else {})}
                                     for k, v in steps.items() if "exit" in v}}
    check = _result(root, "check")
    if check:
        out["check"] = check
        out["device_name"] = check.get("device_name")
    out["mfu"], out["train_step"] = _mfu(root)
    layer = _result(root, "layer")
    if layer:
        out["layer"] = {k: layer.get(k) for k in ("ours_vs_dense_active", "ours_vs_deepspeed")}
    sweep = _result(root, "sweep")
    if sweep:
        out["sweep"] = {k: sweep.get(k) for k in ("trials", "ok", "failed", "wall_s")}
        if (root / "smi_sweep.json").exists():
            out["sweep"]["smi"] = json.loads((root / "smi_sweep.json").read_text())
    experts = _result(root, "experts")
    if experts:
        out["experts"] = {"check_rel_err": experts.get("check_rel_err"),
                          "recorded": experts.get("recorded"),
                          "per_shape": [{k: r.get(k) for k in ("shape", "tokens", "grouped_s",
                                                               "liger_s", "choice")}
                                        for r in experts.get("per_shape", [])]}
    kc = root / "kernel_choice.json"
    if kc.exists():  # the measured kernel-choice entries, for the merge
        out["kernel_choice"] = json.loads(kc.read_text()).get("entries", [])
    return out


def main(argv: list[str]) -> None:
    cmd, args = argv[0], argv[1:]
    out = {"step": lambda: step(*args), "smi": lambda: smi(*args),
           "summary": lambda: summary(*args)}[cmd]()
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])

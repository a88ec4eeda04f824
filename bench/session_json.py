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


def summary(d: str) -> dict[str, Any]:
    """Every step's exit and time, and the headline figures (absent when not measured)."""
    root = Path(d)
    steps = {p.stem: json.loads(p.read_text()) for p in sorted(root.glob("*.json"))
             if p.stem != "summary" and not p.stem.startswith("smi_")}
    out: dict[str, Any] = {"steps": {k: {"exit": v.get("exit"), "seconds": v.get("seconds"),
                                         "timed_out": v.get("timed_out"),
                                         **({"tests": {x: v["tests"][x] for x in
                                                       ("passed", "failed")}}
                                            if v.get("tests") else {})}
                                     for k, v in steps.items() if "exit" in v}}
    mfu: dict[str, Any] = {}
    for name in ("mfu_dense", "mfu_moe", "step64"):
        r = _result(root, name)
        for row in (r or {}).get("rows", []):
            key = f"{row['preset']}-{'E8top2' if row['moe'] else 'dense'}"
            best = mfu.get(key)
            if best is not None and best["mfu"] is None:
                best = {**best, "mfu": 0.0}
            val = row.get("mfu", 0.0)  # CPU (a rehearsal): no MFU, the faster run
            if best is None or (val, row["tokens_per_s"]) > (best["mfu"], best["tokens_per_s"]):
                mfu[key] = {"mfu": row.get("mfu"), "micro": r["micro"], "step": name,
                            "tokens_per_s": row["tokens_per_s"],
                            "peak_mem_gib": row.get("peak_mem_gib")}
    out["best_mfu"] = mfu
    layer = _result(root, "layer")
    if layer:
        out["layer"] = {k: layer.get(k) for k in ("ours_vs_dense_active", "ours_vs_deepspeed")}
    head = _result(root, "head")
    if head:
        out["head"] = {k: v for k, v in head.items() if k.endswith("_vs_plain_time")}
        out["head"]["liger"] = head.get("liger")
    comp = _result(root, "compile")
    if comp:
        out["compile"] = [{k: r.get(k) for k in ("preset", "moe", "compile.graphs",
                                                  "compile.graph_breaks", "compile.recompiles",
                                                  "compile.limit_hit")} for r in comp["rows"]]
    experts = _result(root, "experts")
    if experts:
        out["experts"] = {"check_rel_err": experts.get("check_rel_err"),
                          "recorded": experts.get("recorded"),
                          "per_shape": [{k: r.get(k) for k in ("shape", "tokens", "grouped_s",
                                                               "liger_s", "choice")}
                                        for r in experts.get("per_shape", [])]}
    prof = _result(root, "profile")
    if prof:
        out["profile_shares"] = {k: round(v["share"], 4) for k, v in prof["categories"].items()}
    s64 = steps.get("step64", {})
    out["e8_micro64"] = ("out of memory" if s64.get("out_of_memory") else
                         "ran" if s64.get("exit") == 0 else "not measured")
    return out


def main(argv: list[str]) -> None:
    cmd, args = argv[0], argv[1:]
    out = {"step": lambda: step(*args), "smi": lambda: smi(*args),
           "summary": lambda: summary(*args)}[cmd]()
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])

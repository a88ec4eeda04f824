"""Update ``sweeps/plan/throughput.json`` (the cost forecast's table) from measured JSON, never
by hand.

    python bench/update_throughput.py FILE [FILE ...] --where "H100 device machine"
                                      [--device h100] [--when 2026-11-25] [--table PATH]

Each FILE is JSON or JSON lines (``bench/gpu_session.sh`` writes ``results.jsonl`` and one file
per step) holding, one per object or in a list, measurements of the documented shape

    {"device": "h100", "preset": "0.1B", "moe": "E8top2", "tokens_per_s": 91000.0,
     "peak_mem_gb": 31.2, "flops_per_token": 1.1e9, "seq": 1024, "micro_batch": 32}

(``moe``: ``dense`` or ``E{experts}top{K}``; ``flops_per_token``, ``seq``, ``micro_batch``
optional), or ``bench/train_step.py``'s own JSON line (``{"bench": "train_step", "device":
"cuda", "rows": [...]}``; its ``cuda`` is named by ``--device``). An entry of the same preset ×
MoE shape × device is replaced; the file is rewritten atomically and sorted. Objects of other
benches are skipped and counted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

from moe_core.errors import ConfigError, UpcycleError, one_line
from moe_core.fsio import atomic_write_text
from sweeps.plan.cost import DEVICES, TABLE, load_table

KEYS = ("device", "preset", "moe", "tokens_per_s")


def _objects(path: Path) -> list[Any]:
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror or e}") from None
    try:
        doc = json.loads(text)
        return doc if isinstance(doc, list) else [doc]
    except ValueError:
        pass
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError as e:
                raise ConfigError(f"{path}:{i}: not JSON ({e})") from None
    return out


def measurements(obj: Any, device: str | None) -> list[dict[str, Any]]:
    """The measurements one JSON object holds (the documented shape, or train_step's line)."""
    if not isinstance(obj, dict):
        return []
    if obj.get("bench") == "train_step":
        dev = device if obj.get("device") == "cuda" else obj.get("device")
        if dev is None:
            raise ConfigError("a CUDA train_step line needs --device (e.g. h100) to name the GPU")
        extra = {"seq": obj.get("seq"), "micro_batch": obj.get("micro"), "vocab": obj.get("vocab"),
                 "options": {k: obj[k] for k in ("compile", "activation_checkpointing",
                                                 "chunked_loss") if obj.get(k)}}
        return [{"device": dev, "preset": r["preset"], "moe": "E8top2" if r["moe"] else "dense",
                 "tokens_per_s": r["tokens_per_s"], "peak_mem_gb": r.get("peak_mem_gib"),
                 "flops_per_token": sum(r["flops_per_token"].values()), **extra}
                for r in obj.get("rows", [])]
    if all(k in obj for k in KEYS):
        return [dict(obj)]
    return []


def _check(m: dict[str, Any], where: str) -> None:
    if m["device"] not in DEVICES:
        raise ConfigError(f"{where}: device {m['device']!r} is not known; use one of "
                          f"{', '.join(DEVICES)}")
    v = m["tokens_per_s"]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ConfigError(f"{where}: tokens_per_s={v!r} must be a number > 0")


def update(table: list[dict[str, Any]], found: list[dict[str, Any]], where: str,
           when: str) -> list[dict[str, Any]]:
    """``table`` with ``found`` upserted by (preset, moe, device), each marked measured."""
    by_key = {(e["preset"], e["moe"], e["device"]): e for e in table}
    for m in found:
        e = {k: v for k, v in m.items() if v is not None and k not in ("when", "where")}
        e["measured"] = {"where": m.get("where") or where, "when": m.get("when") or when}
        by_key[(e["preset"], e["moe"], e["device"])] = e
    return sorted(by_key.values(), key=lambda e: (e["device"], e["preset"], e["moe"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--where", required=True, help="the machine measured, e.g. 'H100 80GB SXM'")
    ap.add_argument("--device", default=None, help="table device of CUDA lines (h100, h200...)")
    ap.add_argument("--when", default=datetime.date.today().isoformat())
    ap.add_argument("--table", type=Path, default=TABLE)
    args = ap.parse_args(argv)
    try:
        found, skipped = [], 0
        for f in args.files:
            for i, obj in enumerate(_objects(f)):
                ms = measurements(obj, args.device)
                skipped += not ms
                for m in ms:
                    _check(m, f"{f} object {i}")
                found += ms
        if not found:
            raise ConfigError(f"no measurement in {', '.join(map(str, args.files))} (each needs "
                              f"{', '.join(KEYS)}, or a train_step line)")
        table = load_table(args.table) if args.table.exists() else []
        doc = json.loads(args.table.read_text()) if args.table.exists() else {}
        doc["entries"] = update(table, found, args.where, args.when)
        atomic_write_text(args.table, json.dumps(doc, indent=1) + "\n")
    except UpcycleError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    print(f"{args.table}: {len(found)} measured entries written"
          + (f", {skipped} objects of other benches skipped" if skipped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

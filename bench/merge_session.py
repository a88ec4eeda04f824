"""Merge a GPU session's measured figures into the committed tables, in one command:

    python bench/merge_session.py DIR/summary-call1.json [DIR/summary-call2.json]
                                  [--device h200] [--table sweeps/plan/throughput.json]
                                  [--kernel-table moe_core/moe/kernel_choice.json]

- ``sweeps/plan/throughput.json`` (the cost forecast): the ``mfu_*`` steps' rows, one per preset x
  MoE shape; of the ``bf16_mode`` variants timed, the one ``optim.bf16_mode: auto`` runs at
  ZeRO 0 (what a sweep trains with), else the fastest. Each entry is marked ``measured on
  DEVICE at DATE`` and names its mode under ``options``.
- ``moe_core/moe/kernel_choice.json`` (``moe.experts_kernel: auto``): the ``experts`` step's
  entries (both kernels timed on CUDA).

``--device`` (the throughput table's device: h100, h200, ...) defaults to the class of the GPU
the session's check step saw. A rehearsal's summary (measured on the CPU) is refused: exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/merge_session.py`

from bench.update_throughput import _check, measurements, update  # noqa: E402
from moe_core.errors import ConfigError, UpcycleError, one_line  # noqa: E402
from moe_core.fsio import atomic_write_text  # noqa: E402
from moe_core.moe import kernel_choice as kc  # noqa: E402
from moe_core.train.engine import DEFAULT_BF16_MODE  # noqa: E402
from sweeps.plan.cost import TABLE, load_table  # noqa: E402


def throughput_rows(summaries: list[dict[str, Any]], device: str) -> list[dict[str, Any]]:
    """One measurement per preset x MoE shape: the mode ``auto`` runs at ZeRO 0, else the
    fastest of those timed."""
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for s in summaries:
        for line in s.get("train_step", []):
            if line.get("device") != "cuda":
                continue
            for raw in line.get("rows", []):
                m = measurements({**line, "rows": [raw]}, device)[0]
                mode = raw.get("bf16_mode", "auto")
                m["options"] = {**m.get("options", {}), "bf16_mode": mode}
                key = (m["preset"], m["moe"])
                old = best.get(key)
                default = mode in ("auto", DEFAULT_BF16_MODE[0])
                old_default = old is not None and old["options"]["bf16_mode"] in (
                    "auto", DEFAULT_BF16_MODE[0])
                if old is None or (default, m["tokens_per_s"]) > (old_default,
                                                                  old["tokens_per_s"]):
                    best[key] = m
    return list(best.values())


def merge(summaries: list[dict[str, Any]], device: str | None, table: Path,
          kernel_table: Path) -> dict[str, Any]:
    names = {s.get("device_name") for s in summaries if s.get("device_name")}
    if not names or names == {"cpu"}:
        raise ConfigError("these summaries were measured on the CPU (a rehearsal) or have no "
                          "check step: nothing to merge; merge a device session's summaries")
    name = sorted(names - {"cpu"})[0]
    device = device or kc.device_class(name).lower()
    date = max(s.get("date", "") for s in summaries)
    where = f"measured on {name} at {date}"
    rows = throughput_rows(summaries, device)
    for i, m in enumerate(rows):
        _check(m, f"train_step row {i}")
    out: dict[str, Any] = {"device": device, "where": where, "throughput_entries": len(rows)}
    if rows:
        doc = json.loads(table.read_text()) if table.exists() else {}
        doc["entries"] = update(load_table(table) if table.exists() else [], rows, where, date)
        atomic_write_text(table, json.dumps(doc, indent=1) + "\n")
    new = [e for s in summaries for e in s.get("kernel_choice", [])]
    if new:
        old = kc.load_table(kernel_table) if kernel_table.exists() else []
        kc.write_table(kernel_table, kc.merge(old, new))
    out["kernel_entries"] = len(new)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("summaries", nargs="+", type=Path)
    ap.add_argument("--device", default=None)
    ap.add_argument("--table", type=Path, default=TABLE)
    ap.add_argument("--kernel-table", type=Path, default=kc.TABLE)
    a = ap.parse_args(argv)
    try:
        docs = []
        for p in a.summaries:
            try:
                docs.append(json.loads(p.read_text()))
            except (OSError, ValueError) as e:
                raise ConfigError(f"{p}: not a session summary ({type(e).__name__})") from None
        out = merge(docs, a.device, a.table, a.kernel_table)
    except UpcycleError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    print(json.dumps({"bench": "merge_session", **out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

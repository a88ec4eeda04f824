"""A trial's outcome as the sweep records it: from Tune's own trial states (``reconcile``), a
health rule that already fired (``recorded_prune``), a failed trial's error as one line."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sweeps.store.results import PRUNE_COLUMNS


def reconcile(sink: Any, trials: Iterable[Any], signal: int | None = None,
              budget: str | None = None) -> None:
    """Set each trial's outcome from Tune's own trial states (covers trials that finished in an
    earlier run, whose statuses a lost file would otherwise leave as 'running'). After a stop
    ``signal`` Tune marks the trials it cut as TERMINATED too: a trial with no outcome yet is
    then ``interrupted``, never ``ok`` (``--resume`` runs it on); after the ``budget`` limit
    named stopped the sweep (``sweeps.run.budget``), it is ``budget``."""
    for t in trials:
        status = getattr(t, "status", None)
        if status == "TERMINATED" and budget is not None:
            sink.mark(t.trial_id, "budget", f"stopped when budget.{budget} was spent; raise it "
                      "and rerun with --resume to finish it")
        elif status == "TERMINATED" and signal is not None:
            sink.mark(t.trial_id, "interrupted", f"cut by signal {signal} before its end; "
                      "rerun with --resume to finish it")
        elif status == "TERMINATED":
            sink.mark(t.trial_id, "ok")
        elif status == "ERROR":
            sink.mark(t.trial_id, "failed", error_reason(t))


def recorded_prune(rows: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """The prune columns of a health rule that already fired on these rows (a run before a
    ``--resume``): kept as they are, never relabelled as a scheduler's stop."""
    row = next((r for _, r in sorted(rows.items())
                if r.get("prune_rule") not in (None, "asha")), None)
    return None if row is None else {k: row.get(k) for k in (*PRUNE_COLUMNS, "reason")}


def error_reason(trial: Any) -> str:
    """The last line of a failed trial's error (not a path into Ray's session folder)."""
    path = getattr(trial, "error_file", None) or getattr(trial, "pickled_error_file", None)
    try:
        lines = [x for x in Path(path).read_text(errors="replace").splitlines() if x.strip()]
        return lines[-1][:500] if lines else "trial error"
    except (OSError, TypeError):
        return "trial error"


def mark_changes(statuses: frozenset, status: str) -> bool:
    """Whether marking a sealed trial whose rows have ``statuses`` could change a row (see
    :func:`apply_mark`); True when unsure (the trial is then read back)."""
    if statuses == {"diverged"}:
        return False
    if len(statuses) != 1 or not statuses <= {"ok", "pruned", "failed"}:
        return True
    return status == "failed" and statuses != {"failed"}


def apply_mark(rows: Iterable[dict[str, Any]], status: str, reason: str | None) -> bool:
    """Set the outcome ``status`` on a trial's ``rows`` (in place); False if it has none."""
    rows = list(rows)
    div = max((r for r in rows if r.get("status") == "diverged"),
              key=lambda r: r.get("step") or 0, default=None)
    if div is not None:  # a diverged trial reads as one, like a failed one: every row
        for row in rows:
            row["status"], row["reason"] = "diverged", div.get("reason")
        return True
    pruned = next((r for r in rows if r.get("prune_rule")), None)
    if pruned is not None:  # so does a pruned one, with the rule and values that fired
        cols = {k: pruned.get(k) for k in PRUNE_COLUMNS}
        for row in rows:
            row.update(cols, status="pruned", reason=pruned.get("reason"))
        return True
    for row in rows:
        cur = row.get("status")
        if cur == "diverged":
            continue
        if cur in (None, "running", "interrupted", "budget") or status == "failed":
            row["status"] = status
            if reason:
                row["reason"] = reason
    return bool(rows)

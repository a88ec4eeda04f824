"""A trial's outcome as the sweep records it: from Tune's own trial states (``reconcile``), a
health rule that already fired (``recorded_prune``), a failed trial's error as one line, a
trial killed by Ray's memory monitor as ``oom`` with the node's figures (``sweeps.store.oom``)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sweeps.store.oom import OOM_STATUS, is_oom, oom_outcome
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
            status, reason, cols = error_outcome(t)
            sink.mark(t.trial_id, status, reason, columns=cols)


def recorded_prune(rows: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """The prune columns of a health rule that already fired on these rows (a run before a
    ``--resume``): kept as they are, never relabelled as a scheduler's stop."""
    row = next((r for _, r in sorted(rows.items())
                if r.get("prune_rule") not in (None, "asha")), None)
    return None if row is None else {k: row.get(k) for k in (*PRUNE_COLUMNS, "reason")}


def error_text(trial: Any) -> str:
    """A failed trial's error file (Tune's ``error.txt``: every failure's message), or ''."""
    path = getattr(trial, "error_file", None) or getattr(trial, "pickled_error_file", None)
    try:
        return Path(path).read_text(errors="replace")
    except (OSError, TypeError):
        return ""


def error_reason(trial: Any) -> str:
    """The last line of a failed trial's error (not a path into Ray's session folder)."""
    lines = [x for x in error_text(trial).splitlines() if x.strip()]
    return lines[-1][:500] if lines else "trial error"


def error_outcome(trial: Any) -> tuple[str, str, dict[str, Any] | None]:
    """(status, reason, columns) of a trial Tune ended in error: ``oom`` with the node's
    memory figures when Ray's memory monitor killed it (its last failure), else ``failed``
    with the error's last line."""
    text = error_text(trial)
    last = text.rsplit("Failure # ", 1)[-1]  # Tune appends each failure: judge the last one
    if is_oom(last):
        reason, cols = oom_outcome(last)
        return OOM_STATUS, reason, cols
    return "failed", error_reason(trial), None


def mark_changes(statuses: frozenset, status: str) -> bool:
    """Whether marking a sealed trial whose rows have ``statuses`` could change a row (see
    :func:`apply_mark`); True when unsure (the trial is then read back)."""
    if statuses == {"diverged"}:
        return False
    if len(statuses) != 1 or not statuses <= {"ok", "pruned", "failed", OOM_STATUS}:
        return True
    if statuses == {OOM_STATUS}:  # reopened: any other outcome replaces it (a --resume)
        return status != OOM_STATUS
    return status in ("failed", OOM_STATUS) and statuses != {status}


ENDS_EVERY_ROW = ("failed", OOM_STATUS)
"""Outcomes set on every row of a trial (not only on its open ones)."""
REOPENED = (None, "running", "interrupted", "budget", OOM_STATUS)
"""Row statuses a later outcome replaces (an ``oom`` trial retried by ``--resume`` ends ok)."""


def apply_mark(rows: Iterable[dict[str, Any]], status: str, reason: str | None,
               columns: dict[str, Any] | None = None) -> bool:
    """Set the outcome ``status`` (with ``columns``, e.g. an ``oom`` trial's memory figures)
    on a trial's ``rows`` (in place); False if it has none."""
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
        if cur in REOPENED or status in ENDS_EVERY_ROW:
            row["status"] = status
            if reason:
                row["reason"] = reason
            row.update(columns or {})
    return bool(rows)

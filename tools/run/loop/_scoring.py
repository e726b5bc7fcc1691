"""Judging a finished revision and deciding whether the loop goes on
(docs/spec/loop.md, "Scoring" and "Stopping"): pure, over the revision's
bookkeeping, its score task's record and the history so far."""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

from crucible.run.loop._budget import TimeBudget
from crucible.run.loop._history import LoopHistory
from crucible.run.loop._revision import PASSED, Revision
from crucible.run.loop._spec import LoopSpec

__all__ = ["FAILED", "judge", "stop_reason"]

FAILED = "failed"


def judge(
    spec: LoopSpec,
    rev: Revision,
    record: dict[str, Any] | None,
    emits: Collection[str],
    history: LoopHistory,
    duration_ms: int,
) -> dict[str, Any]:
    """Revision ``rev``'s loop.json entry: its score (the score task's ``metric``
    when it passed with a number), its verdict against the kept revision's
    score and why. ``record``: the score task's record in this revision (None
    when it never settled); ``emits``: the score task's declared fields."""
    output = record.get("output") if record is not None else None
    output = output if isinstance(output, dict) else {}
    fields = {f: output[f] for f in sorted(emits) if f in output}
    score: Any = None
    if rev.abort is not None:
        reason = rev.abort
    elif rev.cut or len(rev.status) < len(rev.body.tasks):
        reason = f"the time budget of {spec.time_budget or 0:g}s ran out mid-revision"
    elif rev.status.get(spec.score) != PASSED:
        reason = f"score task {spec.score!r} {rev.status.get(spec.score)}"
        if record is not None and record.get("note"):
            reason += f": {str(record['note']).splitlines()[0]}"
    else:
        value = output.get(spec.metric)
        if type(value) in (int, float):
            score = value
            reason = ""
        else:
            reason = f"score task {spec.score!r} passed without a number in {spec.metric!r}"
    previous = history.best
    if score is None:
        verdict, kept, delta = "failed", False, None
    else:
        kept = spec.better(score, previous)
        verdict = "improved" if kept else "not_improved"
        delta = None if previous is None else _difference(score, previous)
        if previous is None:
            reason = "the first passed revision"
        elif kept:
            by = "more than a number can hold" if delta is None else f"{abs(delta):g}"
            reason = f"improved on revision {history.kept} by {by}"
        else:
            reason = f"no improvement of at least {spec.min_delta:g} on revision {history.kept}"
    return {
        "revision": rev.n,
        "status": PASSED if score is not None else FAILED,
        "score": score,
        "verdict": verdict,
        "kept": kept,
        "note": reason,
        "delta": delta,
        "fields": fields,
        "duration_ms": duration_ms,
    }


def stop_reason(
    spec: LoopSpec, history: LoopHistory, rev: Revision, budget: TimeBudget
) -> str | None:
    """Why the loop stops now (loop.json's ``stop_reason``), or None to go on."""
    last = history.revisions[-1] if history.revisions else None
    if last is not None and rev.abort is not None:
        return "body_failed"
    if history.kept is not None and history.best is not None and spec.reached(history.best):
        return "target"
    if len(history.revisions) >= spec.max_revisions:
        return "max_revisions"
    if budget.out_of_time():
        return "time_budget"
    if spec.patience is not None and history.stale >= spec.patience:
        return "patience"
    return None


def _difference(score: float, previous: float) -> float | None:
    """``score − previous``, or None when it is past a float's range (-1e308 to
    1e308 is inf, which JSON, loop.json and the session log cannot hold)."""
    delta = score - previous
    return delta if math.isfinite(delta) else None

"""A record written without capture (a skipped task, a timeout, a kill), with
the notes of any held file a consumer changed: it reads what the inputs
writer staged (:mod:`crucible.stage._inputs`) and writes a record
(:mod:`crucible.stage._records`), so it sits apart from both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crucible.stage._inputs import held_units
from crucible.stage._layout import StateLayout
from crucible.stage._plan import PlanView
from crucible.stage._records import STATUSES, _extra, base_record, check_key, write_record
from crucible.stage._share import verify_consumer
from crucible.stage._store import as_path

__all__ = ["record_settled"]


def record_settled(
    pv: PlanView,
    state: Path,
    task: str,
    *,
    status: str,
    note: str,
    key: str | None = None,
    extra: dict[str, Any] | None = None,
    durable: bool = True,
) -> dict[str, Any]:
    """Write a record without capture (a skipped task, a timeout, a kill).

    For a mapped task without ``key`` (one that settled before it expanded: a
    skip, an unreadable map source) this is its aggregate record with no
    instances: ``keys: []`` and zero counts, with the given status and note."""
    if key is not None or pv.task(task).map is None:
        check_key(pv, task, key)
    record = base_record(task, key, status, note)
    tampering = _held_tampering(pv, as_path(state), task, key)
    if tampering:  # a timed-out or killed consumer is checked as capture checks one
        record["note"] = "; ".join([note, *tampering]) if note else "; ".join(tampering)
    if key is None and pv.task(task).map is not None:
        record["keys"] = []
        record["counts"] = dict.fromkeys(STATUSES, 0)
    ex = _extra(extra)
    if ex is not None:
        record["extra"] = ex
    return write_record(as_path(state), record, durable=durable)


def _held_tampering(pv: PlanView, state: Path, task: str, key: str | None) -> list[str]:
    """Notes for staged files the task's (default) workspace holds that were
    changed (docs/spec/inputs.md 3.4); none when it was never staged."""
    if key is None and pv.task(task).map is not None:
        return []  # an aggregate has no workspace of its own
    units = held_units(pv, state, task, key)
    if not units:
        return []
    workspace = StateLayout(state).work_dir(task, key)
    label = task if key is None else f"{task}[{key}]"
    return verify_consumer(state, label, units, workspace)

"""Settled result records: write (atomically), read, and fold a mapped task's instances.

Formats: docs/spec/inputs.md ("Result records"), docs/schemas/result-record.json.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crucible.core import canon
from crucible.core.contract import RESULT_STATUSES
from crucible.core.errors import InputRefused
from crucible.stage import _store
from crucible.stage._loop import loop_of, revision_of
from crucible.stage._plan import PlanView
from crucible.stage._store import RESULT_FORMAT, as_path

__all__ = [
    "RESULT_FORMAT",
    "STATUSES",
    "amend_record",
    "base_record",
    "check_key",
    "checked_extra",
    "load_all",
    "load_record_fast",
    "load_result",
    "remove_result",
    "remove_results",
    "settle_fold",
    "update_record",
    "write_record",
    "write_result",
    "write_result_where",
]

#: What a settled record can say. ``absent`` is not a record status: the index
#: uses it for a producer with no record.
STATUSES = RESULT_STATUSES


def check_key(pv: PlanView, task: str, key: str | None) -> None:
    """A key is required for, and only for, an instance of a mapped task."""
    t = pv.task(task)
    if key is None and t.map is not None:
        raise InputRefused(f"task {task!r} is mapped over {'.'.join(t.map)}: give the instance key")
    if key is not None and t.map is None and revision_of(key) is not None:
        # a loop body task's unit in one revision (inputs.md, "Reserved inputs of the scored loop")
        lv = loop_of(pv)
        if lv is None or task not in lv.body:
            raise InputRefused(
                f"task {task!r} is not in the plan's loop body: it has no revision {key!r}"
            )
        return
    if key is not None and t.map is None:
        raise InputRefused(f"task {task!r} is not mapped: it has no instance {key!r}")
    if key is not None and not isinstance(key, str):
        raise InputRefused(f"a fan-out key is a string, not {type(key).__name__}")


def write_record(state: Path, record: dict[str, Any], *, durable: bool = True) -> dict[str, Any]:
    """Write a settled record (crucible.stage._store); ``durable=False`` leaves
    its fsync to the dispatcher's group commit."""
    _store.store_record(as_path(state), record, durable=durable)
    return record


def write_result(state: Path, record: dict[str, Any], *, durable: bool = True) -> Path:
    """Write a settled record; returns the file it went to (``results/<task>.json``
    or the task's packed ``results/<task>.jsonl``), for a caller that makes it
    durable later (``durable=False``: the dispatcher's group commit)."""
    return _store.store_record(as_path(state), record, durable=durable)


def write_result_where(
    state: Path, record: dict[str, Any], *, durable: bool = True
) -> tuple[str, str]:
    """:func:`write_result`, naming (the file, its directory) as strings: what a
    dispatch worker hands the group commit to fsync, once per task, without
    building Path objects for them."""
    return _store.store_record_where(as_path(state), record, durable=durable)


def remove_result(state: Path, task: str, key: str | None = None, *, durable: bool = True) -> None:
    """Remove a unit's settled record, so that it runs again (a keyed unit's gets
    a tombstone line in its packed file; nothing when there is none)."""
    _store.remove_record(as_path(state), task, key, durable=durable)


def remove_results(state: Path, task: str, keys: list[str] | None, *, durable: bool = True) -> None:
    """Remove the records of several keyed units of ``task`` (one append), or
    with ``keys`` None of all of them (the packed file goes)."""
    if keys is None:
        _store.remove_packed(as_path(state), task, durable=durable)
        return
    present = load_all(as_path(state), task)
    _store.remove_keys(as_path(state), task, [k for k in keys if k in present], durable=durable)


def update_record(
    state: Path, task: str, key: str | None = None, *, durable: bool = True, **members: Any
) -> dict[str, Any]:
    """Set ``members`` in a settled record (e.g. ``tolerated``) and write it back."""
    record = load_result(as_path(state), task, key)
    if record is None:
        raise InputRefused(f"task {task!r} key {key!r} has no record to amend")
    record.update(members)
    return write_record(as_path(state), record, durable=durable)


def base_record(task: str, key: str | None, status: str, note: str) -> dict[str, Any]:
    if status not in STATUSES:
        raise InputRefused(f"status {status!r} is not one of {', '.join(STATUSES)}")
    if not isinstance(note, str):
        raise InputRefused("a note is a string")
    record: dict[str, Any] = {"format": RESULT_FORMAT, "task": task}
    if key is not None:
        record["key"] = key
    record.update(status=status, note=note, retryable=False)
    return record


def checked_extra(extra: dict[str, Any] | None) -> dict[str, Any] | None:
    """A record's ``extra`` as given, refused unless it is a JSON object with a
    canonical form (checked before anything is written)."""
    if extra is None:
        return None
    if not isinstance(extra, dict):
        raise InputRefused("extra must be a JSON object")
    canon.dumps(extra)  # refuse what has no canonical form before anything is written
    return extra


def amend_record(
    record: dict[str, Any],
    *,
    status: str,
    note: str,
    retryable: bool = False,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A settled record with its verdict changed, in memory (the caller writes
    it once); everything else is kept, ``extra`` members are merged."""
    base_record(record["task"], record.get("key"), status, note)  # checks status and note
    out = dict(record)
    out.update(status=status, note=note, retryable=bool(retryable))
    ex = checked_extra(extra)
    if ex is not None:
        out["extra"] = {**record.get("extra", {}), **ex}
    return out


def load_result(state: Path, task: str, key: str | None = None) -> dict[str, Any] | None:
    """The settled record of a task (or of one instance), or None when there is none."""
    return _store.load_one(as_path(state), task, key)


def load_all(state: Path, task: str) -> _store.Records:
    """Every keyed unit's record of ``task`` by key, in one read (each parsed
    when looked up: _store.Records)."""
    return _store.load_keyed(as_path(state), task)


def load_record_fast(state: Path, task: str, key: str) -> dict[str, Any] | None:
    """A keyed unit's record from one read of its task's packed file (repeated
    calls parse only what was appended since): a fold's instances."""
    return _store.load_keyed(as_path(state), task).get(key)


def settle_fold(
    pv: PlanView, state: Path, task: str, keys: list[str], *, durable: bool = True
) -> dict[str, Any]:
    """Write a mapped task's aggregate record from its instances' records.

    ``keys`` are the raw instance keys in item order. The aggregate passes when
    every instance passed (an empty fold passes); otherwise it fails, and its
    note names how many did not pass and the first of them: the first failure,
    skipped instances (a false condition) counted apart, when any failed.
    """
    t = pv.task(task)
    if t.map is None:
        raise InputRefused(f"task {task!r} is not mapped; it has no fold to settle")
    if len(set(keys)) != len(keys):
        raise InputRefused(f"task {task!r}: fan-out keys must be unique")
    state = as_path(state)
    counts = {s: 0 for s in STATUSES}
    first_bad: tuple[str, dict[str, Any]] | None = None
    first_failed: tuple[str, dict[str, Any]] | None = None
    # one pass over results/<task>.jsonl: each key's status, and the records of
    # those that did not pass (a million passed lines are not kept: issue 33)
    status_of, odd = _store.scan_keyed(state, task)
    for k in keys:
        s = status_of.get(k)
        if s is None:
            raise InputRefused(
                f"instance {k!r} of task {task!r} has no settled record; settle it first",
                where=str(_store.packed_path(state, task)),
            )
        counts[s] += 1
        if s != "passed" and first_bad is None:
            first_bad = (k, _store.parse_record_line(odd[k]))
        if s == "failed" and first_failed is None:
            first_failed = (k, _store.parse_record_line(odd[k]))
    del status_of, odd
    if first_bad is None:
        status, note = "passed", f"{len(keys)} of {len(keys)} instances passed"
    else:
        bad = len(keys) - counts["passed"]
        skipped = counts["skipped"]
        status = "failed"
        if first_failed is not None and skipped:
            # skips (a false condition) are no failure: named apart, after the failures
            k, rec = first_failed
            tally = f"{bad - skipped} of {len(keys)} instances failed, {skipped} skipped"
        else:
            k, rec = first_bad
            tally = f"{bad} of {len(keys)} instances did not pass"
        # the instance note's first line: a failed attempt's goes on with its stderr
        headline = str(rec["note"]).split("\n", 1)[0]
        note = f"{tally}; first {k!r}: {rec['status']}: {headline}"
    record = base_record(task, None, status, note)
    record["keys"] = list(keys)
    record["counts"] = counts
    return write_record(state, record, durable=durable)

"""Settled result records: write (atomically), read, and fold a mapped task's instances.

Formats: docs/spec/inputs.md ("Result records"), docs/schemas/result-record.json.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from crucible.core import canon
from crucible.core.errors import InputRefused, OperationalError, ParseError
from crucible.stage._fsio import write_atomic
from crucible.stage._layout import StateLayout
from crucible.stage._loop import loop_of, revision_of
from crucible.stage._plan import view

__all__ = [
    "RESULT_FORMAT",
    "STATUSES",
    "amend_result",
    "load_record_fast",
    "load_result",
    "record_settled",
    "settle_fold",
    "write_record",
]

RESULT_FORMAT = "crucible.result/1"
#: What a settled record can say. ``absent`` is not a record status: the index
#: uses it for a producer with no record.
STATUSES = ("passed", "failed", "skipped")


def check_key(plan: Any, task: str, key: str | None) -> None:
    """A key is required for, and only for, an instance of a mapped task."""
    pv = view(plan)
    t = pv.task(task)
    if key is None and t.map is not None:
        raise InputRefused(f"task {task!r} is mapped over {'.'.join(t.map)}: give the instance key")
    if key is not None and t.map is None and revision_of(key) is not None:
        # a loop body task's unit in one revision (inputs.md, "Reserved inputs of the scored loop")
        lv = loop_of(plan, pv)
        if lv is None or task not in lv.body:
            raise InputRefused(f"task {task!r} is not in the plan's loop body: it has no revision {key!r}")
        return
    if key is not None and t.map is None:
        raise InputRefused(f"task {task!r} is not mapped: it has no instance {key!r}")
    if key is not None and not isinstance(key, str):
        raise InputRefused(f"a fan-out key is a string, not {type(key).__name__}")


def write_record(state: Path, record: dict[str, Any]) -> dict[str, Any]:
    path = StateLayout(state).result_path(record["task"], record.get("key"))
    write_atomic(path, canon.dumps(record))
    return record


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


def _extra(extra: dict[str, Any] | None) -> dict[str, Any] | None:
    if extra is None:
        return None
    if not isinstance(extra, dict):
        raise InputRefused("extra must be a JSON object")
    canon.dumps(extra)  # refuse what has no canonical form before anything is written
    return extra


def record_settled(
    plan: Any,
    state: Path,
    task: str,
    *,
    status: str,
    note: str,
    key: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write a record without capture (a skipped task, a timeout, a kill).

    For a mapped task without ``key`` (one that settled before it expanded: a
    skip, an unreadable map source) this is its aggregate record with no
    instances: ``keys: []`` and zero counts, with the given status and note."""
    if key is not None or view(plan).task(task).map is None:
        check_key(plan, task, key)
    record = base_record(task, key, status, note)
    tampering = _held_tampering(plan, Path(state), task, key)
    if tampering:  # a timed-out or killed consumer is checked as capture checks one
        record["note"] = "; ".join([note, *tampering]) if note else "; ".join(tampering)
    if key is None and view(plan).task(task).map is not None:
        record["keys"] = []
        record["counts"] = dict.fromkeys(STATUSES, 0)
    ex = _extra(extra)
    if ex is not None:
        record["extra"] = ex
    return write_record(Path(state), record)


def _held_tampering(plan: Any, state: Path, task: str, key: str | None) -> list[str]:
    """Notes for staged files the task's (default) workspace holds that were
    changed (docs/spec/inputs.md 3.4); none when it was never staged."""
    from crucible.stage._inputs import held_units
    from crucible.stage._share import verify_consumer

    if key is None and view(plan).task(task).map is not None:
        return []  # an aggregate has no workspace of its own
    units = held_units(plan, state, task, key)
    if not units:
        return []
    workspace = StateLayout(state).work_dir(task, key)
    label = task if key is None else f"{task}[{key}]"
    return verify_consumer(state, label, units, workspace)


def amend_result(
    plan: Any,
    state: Path,
    task: str,
    *,
    key: str | None = None,
    status: str,
    note: str,
    retryable: bool = False,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Change a settled record's verdict (e.g. dispatch failing an evaluate task
    on its verdict) and rewrite it atomically; everything else is kept. ``extra``
    members are merged into the record's ``extra``."""
    check_key(plan, task, key)
    record = load_result(Path(state), task, key)
    if record is None:
        raise InputRefused(f"task {task!r} key {key!r} has no record to amend")
    base_record(task, key, status, note)  # checks status and note
    record.update(status=status, note=note, retryable=bool(retryable))
    ex = _extra(extra)
    if ex is not None:
        record["extra"] = {**record.get("extra", {}), **ex}
    return write_record(Path(state), record)


def _checked(record: Any, path: str, task: str, key: str | None) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise ParseError("a result record must be a JSON object", where=path)
    if record.get("format") != RESULT_FORMAT:
        raise InputRefused(
            f"unknown record format {record.get('format')!r} (expected {RESULT_FORMAT})",
            where=f"{path}:$.format",
        )
    if record.get("task") != task or record.get("key") != key:
        raise InputRefused(
            f"record is for task {record.get('task')!r} key {record.get('key')!r}, "
            f"not {task!r} key {key!r} (plan/state mismatch)",
            where=path,
        )
    if record.get("status") not in STATUSES:
        raise InputRefused(f"unknown status {record.get('status')!r}", where=f"{path}:$.status")
    return record


def _read(path: str) -> bytes | None:
    # Plain fds, no buffered file object: a fold reads 10,000 of these.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OperationalError(f"cannot read result record: {exc.strerror}", where=path) from None
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise OperationalError(f"cannot read result record: {exc.strerror}", where=path) from None
    finally:
        os.close(fd)


def load_result(state: Path, task: str, key: str | None = None) -> dict[str, Any] | None:
    """The settled record of a task (or of one instance), or None when there is none."""
    path = str(StateLayout(Path(state)).result_path(task, key))
    data = _read(path)
    if data is None:
        return None
    try:
        record = canon.loads(data)
    except canon.CanonError as exc:
        raise ParseError(exc.message, where=path) from None
    return _checked(record, path, task, key)


def load_record_fast(path: str, task: str, key: str | None) -> dict[str, Any] | None:
    """:func:`load_result` for records stage wrote itself, read in bulk (a fold's
    instances): one orjson pass instead of the strict double parse. Values read
    this way are re-serialized canonically before they reach a consumer."""
    import orjson

    data = _read(path)
    if data is None:
        return None
    try:
        record = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ParseError(f"invalid JSON: {exc}", where=path) from None
    return _checked(record, path, task, key)


def settle_fold(plan: Any, state: Path, task: str, keys: list[str]) -> dict[str, Any]:
    """Write a mapped task's aggregate record from its instances' records.

    ``keys`` are the raw instance keys in item order. The aggregate passes when
    every instance passed (an empty fold passes); otherwise it fails, and its
    note names how many did not pass and the first of them.
    """
    t = view(plan).task(task)
    if t.map is None:
        raise InputRefused(f"task {task!r} is not mapped; it has no fold to settle")
    if len(set(keys)) != len(keys):
        raise InputRefused(f"task {task!r}: fan-out keys must be unique")
    state = Path(state)
    counts = {s: 0 for s in STATUSES}
    first_bad: tuple[str, dict[str, Any]] | None = None
    for k in keys:
        rec = load_result(state, task, k)
        if rec is None:
            raise InputRefused(
                f"instance {k!r} of task {task!r} has no settled record; settle it first",
                where=str(StateLayout(state).result_path(task, k)),
            )
        counts[rec["status"]] += 1
        if rec["status"] != "passed" and first_bad is None:
            first_bad = (k, rec)
    if first_bad is None:
        status, note = "passed", f"{len(keys)} of {len(keys)} instances passed"
    else:
        bad = len(keys) - counts["passed"]
        k, rec = first_bad
        status = "failed"
        # the instance note's first line: a failed attempt's goes on with its stderr
        headline = str(rec["note"]).split("\n", 1)[0]
        note = f"{bad} of {len(keys)} instances did not pass; first {k!r}: {rec['status']}: {headline}"
    record = base_record(task, None, status, note)
    record["keys"] = list(keys)
    record["counts"] = counts
    return write_record(state, record)

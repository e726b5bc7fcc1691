"""The scored loop's reserved inputs ``revision``, ``history`` and ``kept``
(docs/spec/loop.md, "Reserved inputs"; docs/spec/inputs.md, "Reserved inputs
of the scored loop").

Before revision N the engine calls :func:`write_reserved` (or
:func:`reserve`, which builds the values from ``STATE/loop.json``'s revisions
and the kept revision's records). It writes, each atomically:

- ``STATE/reserved/revision.json``: N;
- ``STATE/reserved/history.json``: one record per earlier revision, newest last,
  the oldest dropped first until its canonical JSON fits the budget
  (:func:`history_value`);
- ``STATE/reserved/kept.json``: null, or the kept revision's number, score and
  each body task's declared fields (:func:`kept_value`);
- ``STATE/reserved/meta.json`` (schema ``reserved-meta.json``): how many
  history records were dropped, of how many, under which budget — stage puts
  ``dropped`` in the index (v2) or the whole object (v1).

Stage then hands them to the body, the tasks after the loop and the epilogues,
and stages the kept revision's captured files under ``inputs/@kept/<task>/``.
The value builders are pure; only the writers touch the disk.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from crucible.core import canon
from crucible.core.atomic import write_bytes

__all__ = [
    "HISTORY_FIELDS",
    "META_FORMAT",
    "META_NAME",
    "declared_fields",
    "history_record",
    "history_value",
    "kept_from_state",
    "kept_value",
    "reserve",
    "revision_key",
    "write_reserved",
]

#: the members of one history record, as the seed names them
HISTORY_FIELDS = ("revision", "score", "verdict", "note", "kept", "fields")
META_NAME = "meta.json"
META_FORMAT = "crucible.reserved-meta/1"  # = crucible.stage.META_FORMAT (a test holds them equal)
#: the smallest budget that can hold a list at all ("[]")
_EMPTY_LIST = 2


def revision_key(revision: int) -> str:
    """The instance key of revision ``revision``: ``@rev<N>`` (stage's rule)."""
    # lazy: stage is not loaded with this module; only revision_key() needs it
    from crucible.stage import revision_key as key

    return key(revision)


def history_record(entry: Mapping[str, Any]) -> dict[str, Any]:
    """One history record from one ``STATE/loop.json`` revision entry: its
    number, score, verdict, note, whether it was kept, and the scoring task's
    declared fields (``{}`` when it had none, e.g. a failed revision)."""
    fields = entry.get("fields")
    return {
        "revision": entry["revision"],
        "score": entry.get("score"),
        "verdict": entry.get("verdict"),
        "note": entry.get("note", ""),
        "kept": bool(entry.get("kept", False)),
        "fields": dict(fields) if isinstance(fields, Mapping) else {},
    }


def history_value(
    revisions: Sequence[Mapping[str, Any]], budget: int
) -> tuple[list[dict[str, Any]], int]:
    """``(records, dropped)``: a history record per revision entry, in the
    order given (oldest first, newest last), keeping the longest newest suffix
    whose canonical JSON (RFC 8785: ``[`` records joined by ``,`` ``]``) is at
    most ``budget`` bytes. ``dropped`` counts the oldest records left out, so
    ``dropped + len(records) == len(revisions)``. Records are never cut short:
    one record over the whole budget is dropped like any other."""
    if type(budget) is not int or budget < _EMPTY_LIST:
        raise ValueError(f"a history budget is an integer >= {_EMPTY_LIST}, not {budget!r}")
    records = [history_record(r) for r in revisions]
    size = _EMPTY_LIST
    keep = 0
    for record in reversed(records):
        grown = size + len(canon.dumps(record)) + (1 if keep else 0)
        if grown > budget:
            break
        size = grown
        keep += 1
    dropped = len(records) - keep
    return records[dropped:], dropped


def declared_fields(
    plan: Mapping[str, Any], task: str, record: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The fields ``task`` declares in ``emits``, as its record's output holds them."""
    emits: Mapping[str, Any] = {}
    for t in plan.get("tasks", []):
        if isinstance(t, Mapping) and t.get("name") == task:
            emits = t.get("emits") or {}
            break
    output = record.get("output") if record else None
    if not isinstance(output, Mapping):
        return {}
    return {name: output[name] for name in emits if name in output}


def kept_value(
    revision: int | None, score: Any, outputs: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any] | None:
    """The ``kept`` input: null before any revision is kept, else
    ``{"revision", "score", "outputs": {<body task>: <its declared fields>}}``."""
    if revision is None:
        return None
    if type(revision) is not int or revision < 1:
        raise ValueError(f"a kept revision is an integer >= 1, not {revision!r}")
    return {
        "revision": revision,
        "score": score,
        "outputs": {task: dict(fields) for task, fields in outputs.items()},
    }


def _state_of(layout: Any) -> Path:
    """A ``crucible.stage.StateLayout`` or a state directory path."""
    return Path(getattr(layout, "state", layout))


def kept_from_state(
    layout: Any, plan: Mapping[str, Any], revision: int | None, score: Any
) -> dict[str, Any] | None:
    """:func:`kept_value` with each body task's declared fields read from its
    record of revision ``revision`` (a line of ``STATE/results/<task>.jsonl``)."""
    if revision is None:
        return None
    # lazy: stage is not loaded with this module; only kept_from_state() needs it
    from crucible.stage import load_result

    state = _state_of(layout)
    key = revision_key(revision)
    body = sorted(plan["loop"]["body"])
    outputs = {t: declared_fields(plan, t, load_result(state, t, key)) for t in body}
    return kept_value(revision, score, outputs)


def _history_parts(history: Any) -> tuple[list[Any], int | None]:
    """``history`` as :func:`history_value` returns it, or a bare list (drop unknown)."""
    if isinstance(history, tuple) and len(history) == 2 and isinstance(history[0], list):
        records, dropped = history
        if type(dropped) is not int or dropped < 0:
            raise ValueError(f"dropped is an integer >= 0, not {dropped!r}")
        return records, dropped
    if isinstance(history, list):
        return history, None
    raise TypeError("history is a list, or the (records, dropped) pair history_value returns")


def write_reserved(
    layout: Any,
    revision: int,
    history: Any,
    kept: dict[str, Any] | None,
    *,
    budget: int | None = None,
    durable: bool = True,
) -> None:
    """Write ``STATE/reserved/{revision,history,kept,meta}.json``, each
    atomically (canonical JSON). ``history`` is the ``(records, dropped)``
    pair :func:`history_value` returns, or a bare list — then ``meta.json``
    says nothing of a drop (it does not know of one), so pass the pair. Call it before the
    revision's body is staged: stage reads the four files then, never while
    they are written."""
    if type(revision) is not int or revision < 1:
        raise ValueError(f"a revision is an integer >= 1, not {revision!r}")
    records, dropped = _history_parts(history)
    root = _state_of(layout) / "reserved"
    root.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {"format": META_FORMAT}
    if dropped is not None:
        meta["history"] = {"dropped": dropped, "total": dropped + len(records)}
        if budget is not None:
            meta["history"]["budget"] = budget
    # canon.dumps first, all of them: a value outside the domain refuses
    # before anything is written
    blobs = [
        (META_NAME, canon.dumps(meta)),
        ("revision.json", canon.dumps(revision)),
        ("history.json", canon.dumps(records)),
        ("kept.json", canon.dumps(kept)),
    ]
    for name, data in blobs:
        write_bytes(root / name, data, durable=durable)


def reserve(
    layout: Any,
    plan: Mapping[str, Any],
    revision: int,
    revisions: Sequence[Mapping[str, Any]],
    *,
    durable: bool = True,
) -> tuple[list[dict[str, Any]], int, dict[str, Any] | None]:
    """Everything before revision ``revision`` in one call: ``revisions`` are
    ``STATE/loop.json``'s entries of the earlier revisions (after the loop: all
    of them, with ``revision`` the last one run). The history is bounded by
    ``plan.loop.history_bytes`` (default 65,536); ``kept`` is the last entry
    marked kept, with its body tasks' declared fields from their records.
    Returns ``(history, dropped, kept)`` as written."""
    loop = plan["loop"]
    budget = int(loop.get("history_bytes", 65536))
    records, dropped = history_value(revisions, budget)
    kept_entry = next((r for r in reversed(revisions) if r.get("kept")), None)
    kept = (
        None
        if kept_entry is None
        else kept_from_state(layout, plan, int(kept_entry["revision"]), kept_entry.get("score"))
    )
    write_reserved(layout, revision, (records, dropped), kept, budget=budget, durable=durable)
    return records, dropped, kept

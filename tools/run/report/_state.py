"""Reading a state dir for ``report``: every file through its schema.

A state dir may be hand-edited, damaged or hostile. The report reads
``plan.json``, ``session.jsonl`` and ``results/`` only as regular files (never
through a symlink, never blocking on a FIFO or a device), reads the plan through
the plan model (crucible.core.plan: :class:`StatePlan`) and checks each other
value it uses against docs/schemas/session-event.json and result-record.json,
so a bad value is one ``file:line: message`` (exit 2), never a crash. The checks are
written out by hand (the report reads 30,000 events of a 10,000-instance run;
a generic validator costs ~50 us each); tests/run/test_report_state.py holds
them to the schemas.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, TypeAlias

from crucible.core.errors import (
    CrucibleError,
    InputRefused,
    Location,
    OperationalError,
    ParseError,
    UnsupportedVersion,
)
from crucible.core.plan import Plan, PlanShapeError
from crucible.core.structs import dataclass
from crucible.run.executors._usage import USAGE_FIELDS
from crucible.run.session import events

__all__ = [
    "Event",
    "EventTuple",
    "StatePlan",
    "iter_event_tuples",
    "iter_events",
    "iter_records",
    "load_plan",
    "load_record",
    "open_lines",
    "read_events",
    "read_regular",
]

_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z")
#: event kinds whose fields the report reads; other kinds (added by later
#: versions) are skipped after their common fields are checked
_KNOWN = ("plan_admitted", "task_started", "task_finished", "run_finished", "shutdown")
#: the canonical JSON domain (docs/spec/canonical-json.md): integers within
#: +-(2^53-1); a value outside it could not be printed back by --json
_SAFE = 2**53 - 1


def read_regular(path: Path, what: str) -> bytes | None:
    """The bytes of a regular file, or None when it does not exist.

    Opened with O_NOFOLLOW and O_NONBLOCK: a symlink is refused (nothing outside
    the state dir is read), and a FIFO or device is refused after ``fstat``
    without waiting for a writer (exit 2, like any wrong kind of path)."""
    fd = _open_regular(path, what)
    if fd is None:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise OperationalError(f"cannot read {what}: {exc.strerror}", where=str(path)) from None
    finally:
        os.close(fd)


def _open_regular(path: Path, what: str) -> int | None:
    """A read-only descriptor of a regular file (None: it does not exist);
    a symlink, FIFO, device or directory is refused without waiting on it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ParseError(
                f"{what} is a symlink; state files are not read through links", where=str(path)
            ) from None
        raise OperationalError(f"cannot read {what}: {exc.strerror}", where=str(path)) from None
    try:
        mode = os.fstat(fd).st_mode
    except OSError as exc:
        os.close(fd)
        raise OperationalError(f"cannot read {what}: {exc.strerror}", where=str(path)) from None
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ParseError(f"{what} is not a regular file ({_kind(mode)})", where=str(path))
    return fd


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a file"


def _type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer" if -_SAFE <= value <= _SAFE else "integer outside +-(2^53-1)"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _int(value: Any, minimum: int | None = None) -> bool:
    return type(value) is int and -_SAFE <= value <= _SAFE and (minimum is None or value >= minimum)


def _load_json(data: bytes, where: str) -> Any:
    # lazy: not loaded with this module; only _load_json() needs it
    import orjson

    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ParseError(f"invalid JSON: {exc}", where=where) from None


# -- plan.json -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StatePlan:
    """``STATE/plan.json`` read through the plan model (crucible.core.plan): the
    typed plan the report reads, and the JSON object it was read from (what
    stage's :class:`~crucible.stage.StateDir` is built over, for a fan-out's items)."""

    model: Plan
    raw: dict[str, Any]

    def declared_resources(self) -> dict[str, dict[str, int]]:
        """Each task's declared ``resources`` (``cpus``, ``memory`` in bytes), where
        the plan declares them (IR v3); an amount that is not a positive integer is
        left out (the report only shows them)."""
        found: dict[str, dict[str, int]] = {}
        for t in self.model.tasks:
            if t.resources is None:
                continue
            asked = (("cpus", t.resources.cpus), ("memory", t.resources.memory))
            kept = {k: v for k, v in asked if v is not None and _int(v, 1)}
            if kept:
                found[t.name] = kept
        return found


def load_plan(state: Path) -> StatePlan:
    """``STATE/plan.json``, checked by the plan model (a value the model refuses
    is one ``plan.json:$.path: message``, exit 2, as for any damaged state file)."""
    # lazy: stage is not loaded with this module; only load_plan() needs it
    from crucible.stage import StateLayout

    path = StateLayout(state).plan_path
    data = read_regular(path, "plan.json")
    if data is None:
        raise InputRefused("not a crucible state dir (no plan.json)", where=str(state))
    raw = _load_json(data, str(path))
    if not isinstance(raw, dict) or not isinstance(raw.get("tasks"), list):
        raise ParseError("plan.json is not a plan (no tasks array)", where=str(path))
    try:
        model = Plan.from_json(raw)
    except (PlanShapeError, UnsupportedVersion) as exc:
        where = Location(str(path), path=exc.location.path)
        raise ParseError(exc.message, where=where) from None
    return StatePlan(model, raw)


# -- session.jsonl ---------------------------------------------------------------


@dataclass(slots=True)
class Event:
    """One session event, checked: only what the report reads."""

    kind: str
    session: int
    time: float
    line: int
    fields: dict[str, Any]


#: members the report reads that the checks below treat on their own
_SPECIAL = frozenset({"task", "attempt", "status", "duration"})
#: scalar members' accepted JSON types, per event kind: the writer's table
#: (crucible.run.session.events.MEMBERS, held to docs/schemas/session-event.json)
_OPTIONAL: dict[str, dict[str, tuple[str, ...]]] = {
    kind: {
        name: types
        for name, types in events.MEMBERS[kind].items()
        if name not in _SPECIAL and set(types) <= {"string", "integer", "boolean"}
    }
    for kind in ("task_started", "task_finished", "shutdown")
}
#: task_finished members the report shows when an event carries them, though
#: no writer of today emits them
_OPTIONAL["task_finished"].update({"log": ("string",), "stderr_tail": ("string",)})
_NONNEG = {
    "task_finished": ("output_bytes", "files_bytes", "instances"),
}
#: task_finished's usage members (crucible.run.executors._usage): null, or a number >= 0
#: (seconds) / an integer >= 0 (the others)
_USAGE_SECONDS = ("cpu_user_s", "cpu_sys_s")
_USAGE_COUNTS = tuple(f for f in USAGE_FIELDS if f not in _USAGE_SECONDS)


def _check_usage(value: dict[str, Any], where: str) -> None:
    for name in _USAGE_SECONDS + _USAGE_COUNTS:
        v = value.get(name)
        if v is None:
            continue
        if name in _USAGE_SECONDS:
            ok = not isinstance(v, bool) and isinstance(v, int | float) and 0 <= v < _SAFE
        else:
            ok = _int(v, 0)
        if not ok:
            kind = "a number" if name in _USAGE_SECONDS else "an integer"
            raise ParseError(f"{name} must be null or {kind} >= 0, not {v!r}", where=where)


#: the epoch second of each ``YYYY-MM-DDTHH:MM:SS`` a log names: a run's
#: events share few seconds, and parsing a date costs more than the rest of
#: an event's checks (a million-instance log has three million events)
_seconds: dict[str, float] = {}
#: each whole ``time`` text read lately, as epoch seconds: neighbouring events
#: share milliseconds (two events an instance), and a hit skips the pattern
#: and the arithmetic; cleared when full (neighbours are what it serves)
_times: dict[str, float] = {}
_TIMES_KEPT = 4096


def _timestamp(text: Any, where: str) -> float:
    """An event's ``time`` (RFC 3339 UTC with milliseconds) as epoch seconds."""
    at = _time_or_none(text)
    if at is not None:
        return at
    if not isinstance(text, str) or not _TIME.fullmatch(text):
        raise ParseError(
            f"time {text!r} is not an RFC 3339 UTC time with milliseconds", where=where
        )
    raise ParseError(f"time {text!r} is not a valid date and time", where=where)


def _time_or_none(text: Any) -> float | None:
    """:func:`_timestamp` of a valid ``time``; None for any other value (the
    caller says what is wrong)."""
    at = _times.get(text) if type(text) is str else None
    if at is not None:
        return at
    if type(text) is not str or not _TIME.fullmatch(text):
        return None
    second = _seconds.get(text[:19])
    if second is None:
        try:
            second = datetime.fromisoformat(text[:19] + "+00:00").timestamp()
        except ValueError:
            return None
        if len(_seconds) > 100_000:  # a log spanning days: keep the cache small
            _seconds.clear()
        _seconds[text[:19]] = second
    at = second + int(text[20:23]) / 1000
    if len(_times) >= _TIMES_KEPT:
        _times.clear()
    _times[text] = at
    return at


# -- the fast path: an event or record that passes every check, cleared in one
# loop over its members (a million-instance run has three million events and a
# million records: the checks below, member by member, cost ~60 us each);
# anything else goes through the checks that name what is wrong.

_PY_TYPES = {
    "string": (str,),
    "integer": (int,),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}
#: a member's rule on the fast path: the Python types it may have, and the
#: least value it may hold when it is a number (every number stays below
#: 2^53-1: one at +-(2^53-1) itself goes the slow way, which decides it)
_Rule = tuple[frozenset[type], int]
_NONE = type(None)
_SECONDS_RULE: _Rule = (frozenset({_NONE, int, float}), 0)  # null or a number >= 0
_COUNT_RULE: _Rule = (frozenset({_NONE, int}), 0)  # null or an integer >= 0
_NONNEG_RULE: _Rule = (frozenset({int}), 0)
_POSITIVE_RULE: _Rule = (frozenset({int}), 1)
_DURATION_RULE = _SECONDS_RULE


def _py_types(types: tuple[str, ...]) -> _Rule:
    """The rule of a member of one of the JSON ``types``."""
    return frozenset(t for name in types for t in _PY_TYPES[name]), 1 - _SAFE


def _fast_table(kind: str) -> dict[str, _Rule]:
    table: dict[str, _Rule] = {
        name: _py_types(types) for name, types in _OPTIONAL.get(kind, {}).items()
    }
    if kind == "task_started":
        table["attempt"] = _POSITIVE_RULE
    if kind == "task_finished":
        table["attempt"] = _POSITIVE_RULE
        table["duration"] = _DURATION_RULE
        table.update({name: _NONNEG_RULE for name in _NONNEG[kind]})
        table.update({name: _SECONDS_RULE for name in _USAGE_SECONDS})
        table.update({name: _COUNT_RULE for name in _USAGE_COUNTS})
    return table


def _fast_ok(value: dict[str, Any], table: dict[str, _Rule]) -> bool:
    """Whether every member ``table`` names passes its rule (no message: the
    slow checks say what is wrong)."""
    for name, v in value.items():
        rule = table.get(name)
        if rule is None:
            continue
        t = type(v)
        if t not in rule[0]:
            return False
        if (t is int or t is float) and not rule[1] <= v < _SAFE:
            return False
    return True


_FAST_EVENTS: dict[str, dict[str, _Rule]] = {}


def _check_event(value: dict[str, Any], where: str) -> Event:
    """The event ``value`` (a line's object), checked; ``where`` names it in an error."""
    fast = _fast_event(value)
    if fast is None:
        return _check_event_slowly(value, where)
    return Event(*fast, 0, value)


def _fast_event(value: dict[str, Any]) -> tuple[str, int, float] | None:
    """The event ``value``'s kind, session and time when it passes every check
    at once; None: the slow checks decide (and say what is wrong)."""
    kind = value.get("event")
    if type(kind) is not str:
        return None
    table = _FAST_EVENTS.get(kind)
    if table is None:
        if kind not in ("task_started", "task_finished", "shutdown"):
            return None
        table = _FAST_EVENTS[kind] = _fast_table(kind)
    session = value.get("session")
    if (
        type(session) is int
        and 1 <= session <= _SAFE
        and (kind == "shutdown" or type(value.get("task")) is str)
        and (kind != "task_started" or "attempt" in value)
        and (kind != "task_finished" or type(value.get("status")) is str)
        and _fast_ok(value, table)
        and (at := _time_or_none(value.get("time"))) is not None
    ):
        return kind, session, at
    return None


def _check_event_slowly(value: dict[str, Any], where: str) -> Event:
    for name in ("event", "session", "time"):
        if name not in value:
            raise ParseError(f"missing required field {name!r}", where=where)
    kind, session, text = value["event"], value["session"], value["time"]
    if not isinstance(kind, str):
        raise ParseError(f"event must be a string, not {_type(kind)}", where=where)
    if not _int(session, 1):
        raise ParseError(f"session must be an integer >= 1, not {session!r}", where=where)
    at = _timestamp(text, where)
    if kind in ("task_started", "task_finished"):
        task = value.get("task")
        if not isinstance(task, str):
            raise ParseError(f"task must be a string, not {_type(task)}", where=where)
        if kind == "task_started" and not _int(value.get("attempt"), 1):
            raise ParseError(
                f"attempt must be an integer >= 1, not {value.get('attempt')!r}", where=where
            )
        if kind == "task_finished":
            if not isinstance(value.get("status"), str):
                raise ParseError(
                    f"status must be a string, not {_type(value.get('status'))}", where=where
                )
            if "attempt" in value and not _int(value["attempt"], 1):
                raise ParseError(
                    f"attempt must be an integer >= 1, not {value['attempt']!r}", where=where
                )
            duration = value.get("duration")
            if duration is not None and (
                isinstance(duration, bool)
                or not isinstance(duration, int | float)
                or not 0 <= duration < _SAFE
            ):
                raise ParseError(f"duration must be a number >= 0, not {duration!r}", where=where)
            for name in _NONNEG[kind]:
                if name in value and not _int(value[name], 0):
                    raise ParseError(
                        f"{name} must be an integer >= 0, not {value[name]!r}", where=where
                    )
            _check_usage(value, where)
    for name, types in _OPTIONAL.get(kind, {}).items():
        if name in value and _type(value[name]) not in types:
            raise ParseError(f"{name} must be a {types[0]}, not {_type(value[name])}", where=where)
    return Event(kind, session, at, 0, value)


def read_events(state: Path) -> list[Event]:
    """Every event of ``STATE/session.jsonl`` the report reads, checked, in log
    order (:func:`iter_events`, as a list)."""
    return list(iter_events(state))


def iter_events(state: Path) -> Iterator[Event]:
    """Each event of ``STATE/session.jsonl`` the report reads, checked, in log
    order, read as the caller consumes them (a million-instance log is ~0.5 GB:
    never held whole). A torn last line (a crash before its fsync) is ignored,
    as the dispatcher does; any other bad line is ``session.jsonl:N: message``."""
    for kind, session, at, line, fields in iter_event_tuples(state):
        yield Event(kind, session, at, line, fields)


#: an :class:`Event`'s fields as a tuple, in their order (what a reader of every
#: event of a wide fan-out's log takes: no object made per event)
EventTuple: TypeAlias = tuple[str, int, float, int, dict[str, Any]]


def iter_event_tuples(state: Path) -> Iterator[EventTuple]:
    """:func:`iter_events`, each event as an :data:`EventTuple`."""
    # lazy: not loaded with this module; only iter_event_tuples() needs it
    import orjson

    # lazy: stage is not loaded with this module; only iter_event_tuples() needs it
    from crucible.stage import StateLayout

    path = StateLayout(state).session_path
    name = str(path)
    known = frozenset(_KNOWN)
    with open_lines(path, "session.jsonl") as lines:
        for number, raw in enumerate(lines, start=1):
            if not raw.endswith(b"\n"):
                return  # a torn last line
            try:
                value = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                if not raw.strip():
                    continue  # a blank line
                raise ParseError(f"invalid JSON: {exc}", where=f"{name}:{number}") from None
            fast = _fast_event(value) if type(value) is dict else None
            if fast is None:  # the checks that say what is wrong (the location built here only)
                if not isinstance(value, dict):
                    raise ParseError("line is not a JSON object", where=f"{name}:{number}")
                slow = _check_event_slowly(value, f"{name}:{number}")
                fast = slow.kind, slow.session, slow.time
            if fast[0] in known:
                yield fast[0], fast[1], fast[2], number, value


@contextlib.contextmanager
def open_lines(path: Path, what: str) -> Iterator[Iterator[bytes]]:
    """The lines of a regular file (each with its ``\\n``; the last one perhaps
    without), read in 1 MiB blocks; nothing when it does not exist. Opened as
    :func:`read_regular` opens it: a symlink, FIFO or device is refused."""
    fd = _open_regular(path, what)
    if fd is None:
        yield iter(())
        return
    f = os.fdopen(fd, "rb", buffering=1 << 20)
    try:
        yield _lines(f, path, what)
    finally:
        f.close()


def _lines(f: Any, path: Path, what: str) -> Iterator[bytes]:
    try:
        yield from f
    except OSError as exc:
        raise OperationalError(f"cannot read {what}: {exc.strerror}", where=str(path)) from None


# -- results/ ---------------------------------------------------------------------

_RECORD_TYPES: dict[str, tuple[str, ...]] = {
    # optional record members the report reads (docs/schemas/result-record.json;
    # log, stderr_tail, cached, tolerated: docs/spec/run.md)
    "key": ("string",),
    "attempt": ("integer",),
    "exit_code": ("integer",),
    "keys": ("array",),
    "counts": ("object",),
    "extra": ("object",),
    "log": ("string",),
    "stderr_tail": ("string",),
    "cached": ("boolean",),
    "tolerated": ("boolean",),
    "usage": ("object",),
}


#: packed files read by this report: path -> (identity, records by key)
_packed: dict[str, tuple[tuple[int, int, int], dict[str, Any]]] = {}


def _keyed_record(path: Path, task: str, key: str) -> Any:
    """A keyed unit's record from its task's packed file (read once per report,
    refused like any state file that is not a regular one)."""
    # lazy: stage.readers is not loaded with this module; only _keyed_record() needs it
    from crucible.stage.readers import parse_packed

    where = str(path)
    try:
        st = os.lstat(path)
        ident = (st.st_ino, st.st_size, st.st_mtime_ns)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OperationalError(f"cannot read result records: {exc.strerror}", where=where) from None
    hit = _packed.get(where)
    if hit is None or hit[0] != ident:
        data = read_regular(path, "result records")
        if data is None:
            return None
        try:
            hit = (ident, parse_packed(data, where, task))
        except ParseError:
            raise
        except CrucibleError as exc:  # a line of another task, an unknown status
            raise ParseError(exc.message, where=exc.where or where) from None
        _packed[where] = hit
    return hit[1].get(key)


def iter_records(state: Path, task: str) -> Iterator[tuple[str, dict[str, Any] | None]]:
    """Each line of ``task``'s packed records (``results/<task>.jsonl``) in
    file order, as (key, record checked) or (key, None) for a tombstone; a
    later line for a key replaces an earlier one. Read as the caller consumes
    them (never the whole file at once). A damaged line followed by another is
    ``file:line: message``; a damaged or unfinished last line is a torn append,
    ignored (as the dispatcher reads it: crucible.stage._store)."""
    # lazy: not loaded with this module; only iter_records() needs it
    import orjson

    # lazy: stage, stage.readers are not loaded with this module; only iter_records() needs it
    from crucible.stage import StateLayout
    from crucible.stage.readers import TOMBSTONE

    path = StateLayout(state).result_path(task, "")
    name = str(path)
    damaged: str | None = None
    with open_lines(path, "result records") as lines:
        for number, raw in enumerate(lines, start=1):
            if damaged is not None:  # a damaged line that was not the last one
                raise ParseError("not a JSON record (a damaged line)", where=damaged)
            if not raw.endswith(b"\n"):
                return  # an append not finished
            try:
                value = orjson.loads(raw)
            except orjson.JSONDecodeError:
                damaged = f"{name}:{number}"
                continue
            k = value.get("key") if type(value) is dict else None
            if type(k) is str and TOMBSTONE not in value and _fast_record(value, task, k):
                yield k, value  # the common case: the location is never needed
                continue
            where = f"{name}:{number}"
            if not isinstance(value, dict) or not isinstance(value.get("key"), str):
                raise ParseError(
                    "a packed result line is a JSON object with a string key", where=where
                )
            k = value["key"]
            if value.get(TOMBSTONE) is True:
                if value.get("task") != task:
                    raise ParseError(
                        f"tombstone is for task {value.get('task')!r}, not {task!r}", where=where
                    )
                yield k, None
                continue
            yield k, _check_loaded_slowly(value, f"{where} (key {k!r})", task, k)


def load_record(state: Path, task: str, key: str | None) -> dict[str, Any] | None:
    """The settled record of a unit, checked, or None when there is none."""
    # lazy: stage is not loaded with this module; only load_record() needs it
    from crucible.stage import StateLayout

    path = StateLayout(state).result_path(task, key)
    if key is not None:
        where = f"{path} (key {key!r})"
        record = _keyed_record(path, task, key)
        if record is None:
            return None
    else:
        data = read_regular(path, "result record")
        if data is None:
            return None
        where = str(path)
        record = _load_json(data, where)
    return _check_loaded(record, where, task, key)


class _RecordRules:
    """What the fast path of a record compares with, made on first use (stage
    and core.contract are not loaded with this module)."""

    def __init__(self) -> None:
        # lazy: core.contract, stage are not loaded with this module; only a record's check needs them
        from crucible.core.contract import RESULT_STATUSES
        from crucible.stage import RESULT_FORMAT

        self.format = RESULT_FORMAT
        self.statuses = RESULT_STATUSES  # a tuple: a status of any JSON value is looked up
        table: dict[str, _Rule] = {name: _py_types(types) for name, types in _RECORD_TYPES.items()}
        del table["keys"]  # an aggregate's: checked slowly
        self.members = table
        self.usage: dict[str, _Rule] = {name: _SECONDS_RULE for name in _USAGE_SECONDS}
        self.usage.update({name: _COUNT_RULE for name in _USAGE_COUNTS})


_record_rules: list[_RecordRules] = []


def _check_loaded(record: Any, where: str, task: str, key: str | None) -> dict[str, Any]:
    """A record read back, checked against result-record.json (what the report reads)."""
    if _fast_record(record, task, key):
        assert isinstance(record, dict)  # what _fast_record found
        return record
    return _check_loaded_slowly(record, where, task, key)


def _fast_record(record: Any, task: str, key: str | None) -> bool:
    """Whether ``record`` passes every check at once (False: the slow checks decide)."""
    if not _record_rules:
        _record_rules.append(_RecordRules())
    rules = _record_rules[0]
    return (
        type(record) is dict
        and record.get("format") == rules.format
        and record.get("status") in rules.statuses
        and type(record.get("note")) is str
        and type(record.get("retryable")) is bool
        and record.get("task") == task
        and record.get("key") == key
        and "keys" not in record
        and _fast_ok(record, rules.members)
        and (type(record.get("usage")) is not dict or _fast_ok(record["usage"], rules.usage))
    )


def _check_loaded_slowly(record: Any, where: str, task: str, key: str | None) -> dict[str, Any]:
    # lazy: only _check_loaded_slowly() needs it (start-up)
    from crucible.core.contract import RESULT_STATUSES as STATUSES
    from crucible.stage import RESULT_FORMAT

    if not isinstance(record, dict):
        raise ParseError("a result record must be a JSON object", where=where)
    for name in ("format", "task", "status", "note", "retryable"):
        if name not in record:
            raise ParseError(f"missing required field {name!r}", where=where)
    if record["format"] != RESULT_FORMAT:
        raise ParseError(
            f"unknown record format {record['format']!r} (expected {RESULT_FORMAT})",
            where=f"{where}:$.format",
        )
    if record["status"] not in STATUSES:
        raise ParseError(f"unknown status {record['status']!r}", where=f"{where}:$.status")
    if not isinstance(record["note"], str):
        raise ParseError(
            f"note must be a string, not {_type(record['note'])}", where=f"{where}:$.note"
        )
    if not isinstance(record["retryable"], bool):
        raise ParseError(
            f"retryable must be a boolean, not {_type(record['retryable'])}",
            where=f"{where}:$.retryable",
        )
    for name, types in _RECORD_TYPES.items():
        if name in record and _type(record[name]) not in types:
            raise ParseError(
                f"{name} must be a{'n' if types[0][0] in 'aeiou' else ''} {types[0]}, "
                f"not {_type(record[name])}",
                where=f"{where}:$.{name}",
            )
    if record["task"] != task or record.get("key") != key:
        raise ParseError(
            f"record is for task {record['task']!r} key {record.get('key')!r}, "
            f"not {task!r} key {key!r}",
            where=where,
        )
    keys = record.get("keys")
    if keys is not None and not all(isinstance(k, str) for k in keys):
        raise ParseError("keys must be an array of strings", where=f"{where}:$.keys")
    if "usage" in record:
        _check_usage(record["usage"], f"{where}:$.usage")
    return record

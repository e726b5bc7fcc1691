"""``crucible-dispatch report``: what happened in a state dir, as a table, NDJSON
rows (docs/schemas/report-row.json), or a self-contained HTML timeline.

Status comes from ``results/`` (what is settled); times and attempts come from
the session log, across every session of the run (resumes included). Every
state file is read through its schema (:mod:`crucible.run.report._state`): a
damaged one is one ``file:line: message`` and exit 2. Normative text:
docs/spec/run.md, "Report".
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from operator import eq
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, overload

from crucible.core import canon
from crucible.core.errors import CrucibleError, InputRefused
from crucible.core.structs import dataclass, field
from crucible.run._display import clip, escape, name_signals, signal_name
from crucible.run.report._accounting import refused_label
from crucible.run.report._fold import FOLD_ABOVE, Folded
from crucible.run.report._state import (
    Event,
    EventTuple,
    StatePlan,
    iter_event_tuples,
    iter_records,
    load_plan,
    load_record,
    read_regular,
)
from crucible.run.report._usage import (
    UnitUsage,
    cpu_text,
    pct_text,
    rss_text,
    size_text,
    task_json,
    task_stats,
    unit_json,
    unit_usage,
    usage_figures,
    usage_line,
)

if TYPE_CHECKING:  # built when a fan-out's keys are first needed (_Items)
    from crucible.stage import StateDir

__all__ = [
    "FOLD_ABOVE",
    "Attempt",
    "Report",
    "Row",
    "Session",
    "collect",
    "render_table",
    "row_json",
]

#: statuses in the order notes and legends list them
STATUS_ORDER = (
    "passed",
    "failed",
    "skipped",
    "interrupted",
    "running",
    "pending",
    "not_selected",
)
#: table cells: a key is cut to this many characters (``--json`` keeps it whole)
KEY_CELL_MAX = 40
#: table cells: a note is cut to this many characters
NOTE_CELL_MAX = 160
#: failed instances of a mapped task detailed under its row in the task table
FAILED_SHOWN = 3


@dataclass(slots=True)
class Attempt:
    """One attempt of a unit, as the session log tells it."""

    session: int
    number: int | None
    start: float | None
    end: float | None = None
    status: str = "running"
    note: str = ""
    exit_code: int | None = None
    #: its ``task_finished``'s fields (usage: crucible.run.report._usage)
    fields: dict[str, Any] | None = None


@dataclass(slots=True)
class Session:
    number: int
    start: float
    end: float
    closed: bool = False  # its ``shutdown`` is in the log


@dataclass(slots=True)
class Row:
    task: str
    key: str | None
    status: str = "pending"
    note: str | None = None
    attempts: int = 0
    start: float | None = None
    end: float | None = None
    duration: float | None = None
    exit_code: int | None = None
    output_bytes: int | None = None
    files_bytes: int | None = None
    instances: int | None = None
    counts: dict[str, int] = field(default_factory=dict)
    mapped: bool = False
    tries: list[Attempt] = field(default_factory=list)
    log: str | None = None
    stderr_tail: str | None = None
    cached: bool = False
    #: why the task cache did not restore it (task_finished.cache_miss), if asked
    cache_miss: str | None = None
    tolerated: bool = False
    #: its last attempt failed with ``retry: true`` and no next attempt started
    awaiting_retry: bool = False
    #: what its last attempt cost (None: not measured); a mapped task's: None
    usage: UnitUsage | None = None
    #: a mapped task: its instances' usage (crucible.run.report._usage)
    member_usage: list[UnitUsage] = field(default_factory=list)
    #: a mapped task of more than FOLD_ABOVE instances: the plain ones, as
    #: columns instead of rows (crucible.run.report._fold)
    folded: Folded | None = None

    @property
    def name(self) -> str:
        return self.task if self.key is None else f"{self.task}[{self.key}]"

    @property
    def label(self) -> str:
        """Status as people read it: ``failed (tolerated)``, ``passed (cached)``."""
        if self.tolerated and self.status == "failed":
            return "failed (tolerated)"
        if self.cached and self.status == "passed":
            return "passed (cached)"
        if self.status == "failed" and (refused := refused_label(self.note)) is not None:
            return refused  # an accounted run's refusal (docs/spec/export.md §7)
        return self.status.replace("_", " ")


class Report(list[Row]):
    """The rows of a report (plan order; instances in item order after their
    task), plus the sessions of the run."""

    sessions: list[Session]
    #: the scored loop's revisions (STATE/loop.json; crucible.run.report._loop_view), or None
    loop: Any
    #: each task's declared resources (cpus, memory), for the HTML's Resources
    resources: dict[str, dict[str, int]]

    def __init__(
        self,
        rows: list[Row],
        sessions: list[Session],
        loop: Any = None,
        resources: dict[str, dict[str, int]] | None = None,
    ) -> None:
        super().__init__(rows)
        self.sessions = sessions
        self.loop = loop
        self.resources = resources or {}


def _apply(r: Row, e: Event) -> None:
    f = e.fields
    if e.kind == "task_started":
        r.attempts += 1
        r.tries.append(Attempt(e.session, f["attempt"], e.time))
        r.awaiting_retry = False
        return
    r.awaiting_retry = f.get("retry") is True
    attempt = f.get("attempt")
    open_try = next(
        (
            t
            for t in reversed(r.tries)
            if t.end is None and t.session == e.session and attempt in (None, t.number)
        ),
        None,
    )
    duration = f.get("duration")
    if open_try is None and attempt is not None:
        # Finished without a start event (a damaged or hand-written log).
        start = e.time - duration if duration is not None else e.time
        open_try = Attempt(e.session, attempt, start)
        r.tries.append(open_try)
        r.attempts += 1
    if open_try is not None:
        open_try.end = e.time
        open_try.status = f["status"]
        open_try.note = f.get("note", "")
        open_try.exit_code = f.get("exit_code")
        open_try.fields = f
    r.status = f["status"]
    r.note = f.get("note")
    if "exit_code" in f:
        r.exit_code = f["exit_code"]
    if duration is not None:
        r.duration = float(duration)
    measured = unit_usage(f, r.duration if duration is not None else None)
    if measured is not None:
        r.usage = measured
    for name in ("output_bytes", "files_bytes"):
        if name in f:
            setattr(r, name, f[name])
    if "instances" in f:
        r.instances = f["instances"]
    for name in ("log", "stderr_tail"):
        if name in f:
            setattr(r, name, f[name])
    r.cached = f.get("cached", r.cached)
    r.cache_miss = f.get("cache_miss", r.cache_miss)
    r.tolerated = f.get("tolerated", r.tolerated)


def _close_open_tries(r: Row, sessions: dict[int, Session]) -> None:
    """An attempt whose end is not in the log: still running while its session
    is the last and has no ``shutdown``; otherwise its session ended without
    recording it (the dispatcher was killed outright): interrupted."""
    last = max(sessions) if sessions else None
    for t in r.tries:
        if t.end is not None:
            continue
        s = sessions[t.session]
        if t.session == last and not s.closed:
            t.status = "running"
        else:
            t.status = "interrupted"
            t.end = s.end
    if r.tries:
        r.start = r.tries[-1].start
        r.end = r.tries[-1].end
        if r.tries[-1].status in ("running", "interrupted"):
            r.status = r.tries[-1].status
        elif r.awaiting_retry:
            # Its failed attempt's record was removed while the retry waited.
            s = sessions[r.tries[-1].session]
            r.status = "running" if r.tries[-1].session == last and not s.closed else "interrupted"


def _settle(r: Row, record: dict[str, Any] | None) -> None:
    if record is None:
        return
    r.status = record["status"]
    r.note = record["note"]
    if "exit_code" in record:
        r.exit_code = record["exit_code"]
    for name in ("log", "stderr_tail"):
        if name in record:
            setattr(r, name, record[name])
    if r.usage is None and isinstance(record.get("usage"), dict):  # a log without it
        r.usage = unit_usage(record["usage"], r.duration)
    extra = record.get("extra") or {}
    r.cached = bool(record.get("cached", extra.get("cached", r.cached)))
    if r.cached and r.output_bytes is None and "output" in record:
        # a cache hit writes no output file: its size is its recorded output's
        from crucible.core import canon

        r.output_bytes = len(canon.dumps(record["output"]))
    r.tolerated = bool(record.get("tolerated", extra.get("tolerated", r.tolerated)))


class _Items:
    """The instance keys of the plan's fan-outs as stage lists them (from the
    state: a map source's record, a listed fan-out's or a matrix's items), over
    one :class:`~crucible.stage.StateDir` of the report's plan, built when a
    fan-out first needs it (None after: the plan is one stage refuses)."""

    def __init__(self, state: Path, plan: StatePlan) -> None:
        self.state = state
        self.plan = plan
        self._state_dir: StateDir | None = None
        self._built = False

    def _dir(self) -> StateDir | None:
        if not self._built:
            self._built = True
            # lazy: stage is not loaded with this module; only a fan-out's keys need it
            from crucible.stage import StateDir

            try:
                self._state_dir = StateDir(self.plan.raw, self.state, model=self.plan.model)
            except CrucibleError:
                self._state_dir = None  # what stage refuses: the log's keys
        return self._state_dir

    def keys(self, task: str, source: str | None) -> list[str] | None:
        """``task``'s instance keys in item order, or None when stage cannot tell
        them (the source unsettled or failed, or holding no array/object)."""
        if source is None:
            spec = self.plan.model.by_name.get(task)
            # a listed fan-out (items, param, sequence) or a matrix: the plan says
            listed = spec is not None and (
                spec.matrix is not None or (spec.map is not None and spec.map_ref is None)
            )
            if not listed:
                return None
        elif load_record(self.state, source, None) is None:
            return None
        # The source's record (if any) was read through its schema just above;
        # stage reads the items from it.
        state_dir = self._dir()
        if state_dir is None:
            return None
        try:
            return [k for k, _ in state_dir.map_items(task)]
        except CrucibleError:
            return None


class _Numbers(Sequence[str]):
    """The keys ``"0"`` .. ``"n-1"`` without a string held for each (the item
    keys of a numbered fold, crucible.run.report._fold: ~60 MiB at a million)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [str(n) for n in range(self.n)[i]]
        return str(range(self.n)[i])

    def __iter__(self) -> Iterator[str]:
        return map(str, range(self.n))


def _item_keys(
    items: _Items, task: str, source: str | None, record: dict[str, Any] | None, seen: list[str]
) -> Sequence[str]:
    """A mapped task's instance keys in item order: the aggregate record's
    ``keys`` once settled, else the map source's items, or a listed fan-out's
    or a matrix's (so instances that never started are counted), else the keys
    the log names."""
    # the record's keys (checked with it): the caller does not change them
    keys: Sequence[str] | None = None if record is None else record.get("keys")
    if keys is None:
        keys = items.keys(task, source)
    if keys is None:
        return seen
    if not seen:
        return keys
    unknown = set(seen)  # the few keys seen, not a set of every key
    for k in keys:
        unknown.discard(k)
    extra = [k for k in seen if k in unknown]
    return [*keys, *extra] if extra else keys


def _aggregate(agg: Row, instances: list[Row], pending: int = 0) -> None:
    """A mapped task's totals over its instance rows, its folded instances
    (``agg.folded``) and ``pending`` more that never started and have no row."""
    folded = agg.folded
    n_folded, f_attempts, f_spans, f_out, f_files, f_cached = (
        folded.totals() if folded is not None else (0, 0, {}, None, None, True)
    )
    total = len(instances) + n_folded + pending
    if total:
        agg.instances = total
    agg.counts = {}
    for inst in instances:
        agg.counts[inst.status] = agg.counts.get(inst.status, 0) + 1
    if n_folded:
        agg.counts["passed"] = agg.counts.get("passed", 0) + n_folded
    if pending:
        agg.counts["pending"] = agg.counts.get("pending", 0) + pending
    agg.attempts = sum(i.attempts for i in instances) + f_attempts
    # Busy time per session, summed: the idle gap between two sessions is not
    # the task's duration.
    spans: dict[int, list[float]] = {s: list(lo_hi) for s, lo_hi in f_spans.items()}
    for i in instances:
        for t in i.tries:
            if t.start is None:
                continue
            lo_hi = spans.setdefault(t.session, [t.start, t.end or t.start])
            lo_hi[0] = min(lo_hi[0], t.start)
            lo_hi[1] = max(lo_hi[1], t.end or t.start)
    starts = [lo for lo, _ in spans.values()]
    ends = [t.end for i in instances for t in i.tries if t.end is not None]
    ends += [hi for s, (_, hi) in f_spans.items()]
    agg.start = min(starts, default=None)
    agg.end = max(ends, default=None)
    if spans:
        agg.duration = round(sum(hi - lo for lo, hi in spans.values()), 6)
    agg.member_usage = [i.usage for i in instances if i.usage is not None]
    if instances or n_folded:
        if any(i.output_bytes is not None for i in instances) or f_out is not None:
            agg.output_bytes = sum(i.output_bytes or 0 for i in instances) + (f_out or 0)
        if any(i.files_bytes is not None for i in instances) or f_files is not None:
            agg.files_bytes = sum(i.files_bytes or 0 for i in instances) + (f_files or 0)
        # every instance restored from the cache: so is the task
        agg.cached = agg.cached or (all(i.cached for i in instances) and f_cached)


def _unsettled_status(agg: Row, open_run: bool) -> str:
    """The status of a mapped task with no aggregate record, from its instances."""
    c = agg.counts
    if c.get("running"):
        return "running"
    if not any(c.get(s) for s in ("passed", "failed", "skipped", "interrupted")):
        return agg.status  # nothing started: pending, or what its own event said
    if open_run:
        return "running"
    return "interrupted"


def _unsettled_note(agg: Row) -> str:
    parts = [
        f"{agg.counts[s]} {'not started' if s == 'pending' else s.replace('_', ' ')}"
        for s in STATUS_ORDER
        if agg.counts.get(s)
    ]
    parts += [f"{v} {k}" for k, v in sorted(agg.counts.items()) if k not in STATUS_ORDER]
    return f"{agg.instances} instances" + (": " + ", ".join(parts) if parts else "")


def _replay(
    state: Path,
    top: dict[str, Row],
    inst: dict[str, dict[str, Row]],
    folds: dict[str, Folded],
) -> dict[int, Session]:
    """Read the log once, applying its task events to the rows of the units
    they name (a task in ``folds`` folds each plain instance as it finishes:
    crucible.run.report._fold); returns the sessions it saw. Events are read
    as tuples (no object per event: a wide fan-out's log has two an instance);
    an :class:`Event` is made for a row only."""
    sessions: dict[int, Session] = {}
    #: a folded task's instances started and not yet finished: their start
    #: event only (a row is made when they turn out not to be plain)
    starts: dict[str, dict[str, EventTuple]] = {name: {} for name in folds}
    session: Session | None = None
    for e in iter_event_tuples(state):
        kind, number, at, _, f = e
        if session is None or session.number != number:
            session = sessions.get(number)
            if session is None:
                session = sessions[number] = Session(number, at, at)
        # widen the session the event belongs to (every event counts, in any order)
        if at < session.start:
            session.start = at
        elif at > session.end:
            session.end = at
        if kind == "shutdown":
            session.closed = True
            continue
        if kind != "task_started" and kind != "task_finished":
            continue
        name, key = f["task"], f.get("key")
        if name not in top or (key is not None and name not in inst):
            continue  # not a unit of this plan: nothing to show it under
        if key is None:
            _apply(top[name], Event(*e))
            continue
        rows = inst[name]
        r = rows.get(key)
        folded = folds.get(name)
        if r is None and folded is not None:
            started = starts[name]
            if folded.slot(key) is not None:
                r = rows[key] = _unfold(folded, key)  # another attempt: a row again
            elif key in started:
                first = started.pop(key)
                if kind == "task_finished" and _fold_plain(folded, first, e):
                    continue
                r = rows[key] = Row(name, key)
                _apply(r, Event(*first))
            elif kind == "task_started":
                started[key] = e  # the common case: folded when it finishes
                continue
        if r is None:
            r = rows[key] = Row(name, key)
        _apply(r, Event(*e))
        if folded is not None and kind == "task_finished" and _foldable(r):
            _fold(folded, r)
            del rows[key]
    for name, started in starts.items():  # never finished: rows
        for key, first in started.items():
            r = inst[name][key] = Row(name, key)
            _apply(r, Event(*first))
    return sessions


def _fold_plain(folded: Folded, start: EventTuple, end: EventTuple) -> bool:
    """Fold an instance from its start and finish events when that one attempt
    is plain (what :func:`_apply` then :func:`_foldable` would find, without
    making its row: the common case of a wide fan-out); False: not plain."""
    _, session, start_time, _, s = start
    _, end_session, end_time, _, f = end
    if (
        f["status"] != "passed"
        or f.get("retry") is True
        or f.get("exit_code")
        or f.get("note")
        or f.get("cache_miss")
        or end_session != session
        or f.get("attempt") not in (None, s["attempt"])
        or "log" in f
        or "stderr_tail" in f
    ):
        return False
    duration = f.get("duration")
    wall = None if duration is None else float(duration)
    folded.add(
        f["key"], session, start_time, end_time, wall, f.get("output_bytes"),
        f.get("files_bytes"), f.get("cached", False), usage_figures(f, wall),
    )  # fmt: skip
    return True


def _foldable(r: Row) -> bool:
    """One attempt, finished and passed, with nothing to say: a plain instance."""
    if len(r.tries) != 1 or r.status != "passed" or r.awaiting_retry or r.exit_code:
        return False
    t = r.tries[0]
    return (
        t.end is not None
        and t.start is not None
        and t.status == "passed"
        and not t.note
        and not t.exit_code
        and not r.cache_miss
    )


def _fold(folded: Folded, r: Row) -> None:
    """Fold a :func:`_foldable` instance row (the caller drops it)."""
    t = r.tries[0]
    assert r.key is not None and t.start is not None and t.end is not None
    folded.add(
        r.key, t.session, t.start, t.end, r.duration, r.output_bytes, r.files_bytes,
        r.cached, None if r.usage is None else r.usage.figures(),
    )  # fmt: skip


def _unfold(folded: Folded, key: str) -> Row:
    """A folded instance's row again (its one passed attempt, figures and flags)."""
    kept = folded.take(key)
    r = Row(folded.task, key, status="passed", note="", attempts=1, exit_code=0)
    r.tries.append(Attempt(kept.session, 1, kept.start, kept.end, "passed", "", 0))
    r.cached = kept.cached
    r.duration = kept.duration
    r.output_bytes = kept.output_bytes
    r.files_bytes = kept.files_bytes
    r.usage = kept.usage
    return r


def _plain_record(folded: Folded, i: int, record: dict[str, Any]) -> bool:
    """Whether the record of the instance folded in slot ``i`` says what its
    fold says (passed, cached alike, nothing more to read from it), so it
    stays folded."""
    if record["status"] != "passed":
        return False
    extra = record.get("extra") or {}
    if record.get("tolerated", extra.get("tolerated")):
        return False
    cached = bool(record.get("cached", extra.get("cached", False)))
    if cached != bool(folded.cached[i]):
        return False
    if cached and folded.output_bytes[i] < 0 and "output" in record:
        return False  # its output's size is read from the record
    return folded.usage_known(i) or not isinstance(record.get("usage"), dict)


def _folded_records(
    state: Path, task: str, folded: Folded, seen: dict[str, Row]
) -> dict[str, dict[str, Any] | None]:
    """The records of a folded task's instances that are rows or must become
    rows, by key (None: its last line is a tombstone), in one pass over its
    packed file; a folded instance whose record agrees with its fold is not
    kept (so memory stays with the rows, not the instances)."""
    odd: dict[str, dict[str, Any] | None] = {}
    for key, record in iter_records(state, task):
        i = None if record is None else folded.slot(key)
        if record is not None and i is not None and _plain_record(folded, i, record):
            odd.pop(key, None)  # its last line is the plain one
        else:
            odd[key] = record
    for key in odd:
        if key in folded:
            seen[key] = _unfold(folded, key)
    return odd


def _instances(
    state: Path,
    items: _Items,
    agg: Row,
    record: dict[str, Any] | None,
    seen: dict[str, Row],
    source: str | None,
    sessions: dict[int, Session],
) -> list[Row]:
    """A mapped task's instance rows in item order, settled; ``agg`` gets
    their totals (and, before its own record exists, its status and note).
    A folded task (``agg.folded``): the rows of its notable instances only,
    the others counted (crucible.run.report._fold)."""
    folded = agg.folded
    members: list[Row] = []
    pending = 0
    if folded is None:
        for k in _item_keys(items, agg.task, source, record, list(seen)):
            r = seen.get(k) or Row(agg.task, k)
            _close_open_tries(r, sessions)
            _settle(r, load_record(state, agg.task, k))
            members.append(r)
    else:
        records = _folded_records(state, agg.task, folded, seen)
        for k in folded.outliers():
            seen[k] = _unfold(folded, k)
        for k in _item_keys(items, agg.task, source, record, list(seen)):
            row = seen.get(k)
            if row is None and k in records:
                row = Row(agg.task, k)  # a record with no event (a log cut short)
            if row is None:
                if k not in folded:
                    pending += 1  # never started: counted, not a row
                continue
            _close_open_tries(row, sessions)
            _settle(row, records.get(k))
            members.append(row)
    if folded is not None:
        folded.pending = pending
    if record is not None and "keys" in record:
        agg.instances = len(record["keys"])
    if members or folded or pending:
        _aggregate(agg, members, pending)
        if record is None:
            open_run = not sessions[max(sessions)].closed if sessions else False
            agg.status = _unsettled_status(agg, open_run)
            if agg.status != "pending" or not agg.note:
                agg.note = _unsettled_note(agg)
    return members


def _new_fold(
    items: _Items, task: str, source: str | None, record: dict[str, Any] | None, above: int
) -> Folded | None:
    """A fold for a mapped task of more than ``above`` instances, as far as its
    record or its map source tells before the log is read (None: not wider);
    its keys kept as numbers when they are ``"0"`` .. ``"n-1"``."""
    keys = _item_keys(items, task, source, record, [])
    n = len(keys)
    if n <= above:
        return None
    numbered = all(map(eq, keys, map(str, range(n))))  # no list of n strings made
    if numbered and record is not None and "keys" in record:
        record["keys"] = _Numbers(n)  # the same keys, not held as strings
    return Folded(task, n if numbered else None)


def collect(state: Path, task: str | None = None, *, fold_above: int | None = FOLD_ABOVE) -> Report:
    """Rows in plan order: one per task, each mapped task followed by its
    instances in item order (only ``task``'s rows when given). Without
    ``task``, a mapped task of more than ``fold_above`` instances keeps rows
    for its notable instances only (crucible.run.report._fold; None: never)."""
    plan = load_plan(state)
    # A scored loop's body task is shown as a group of its revisions (@rev<N>).
    from crucible.run.report import _loop_view as loop_view

    body = loop_view.body_tasks(plan.model.loop)
    # (name, mapped, the task its map reads or None) in plan order; a matrix
    # (edition 4) fans out as a map does
    tasks = [
        (t.name, t.fans_out or t.name in body, None if t.map_ref is None else t.map_ref.producer)
        for t in plan.model.tasks
    ]
    items = _Items(state, plan)
    names = [name for name, _, _ in tasks]
    if task is not None and task not in names:
        raise InputRefused(
            f"no task {task!r} in this run's plan (tasks: {', '.join(names)})", where=str(state)
        )
    top = {name: Row(name, None, mapped=mapped) for name, mapped, _ in tasks}
    inst: dict[str, dict[str, Row]] = {name: {} for name, mapped, _ in tasks if mapped}
    # a mapped task's record now (its size decides a fold); another's when its
    # row is settled (a map source's record holds every item: not kept)
    records = {
        n: load_record(state, n, None)
        for n, mapped, _ in tasks
        if mapped and (task is None or n == task)
    }
    folds: dict[str, Folded] = {}
    if task is None and fold_above is not None:
        for name, mapped, source in tasks:
            if mapped and name not in body:
                fold = _new_fold(items, name, source, records.get(name), fold_above)
                if fold is not None:
                    folds[name] = top[name].folded = fold
    by_number = _replay(state, top, inst, folds)
    sessions = [by_number[n] for n in sorted(by_number)]
    rows: list[Row] = []
    for name, mapped, source in tasks:
        if task is not None and name != task:
            continue
        agg = top[name]
        _close_open_tries(agg, by_number)
        record = records.pop(name) if mapped else load_record(state, name, None)
        _settle(agg, record)
        rows.append(agg)
        if mapped:
            rows.extend(_instances(state, items, agg, record, inst[name], source, by_number))
    loop = None
    if task is None:  # the loop's revisions, under the whole run's table only
        loop = loop_view.load(state, plan.model.loop)
    return Report(rows, sessions, loop, plan.declared_resources())


# -- table ----------------------------------------------------------------------


_size = size_text  # one rule for sizes in the table and the usage lines


def _seconds(s: float | None) -> str:
    return "-" if s is None else f"{s:.3f}s"


def display_note(r: Row) -> str:
    """The note as people read it: signals named, control characters escaped,
    and without the log path and output tail it repeats when those are shown
    under it (the dispatcher appends " (see PATH)" and "\\n" + tail)."""
    return escape(short_note(r))


def short_note(r: Row) -> str:
    if not r.note and r.cache_miss and r.status == "passed":
        return f"cache miss: {r.cache_miss}"
    note = name_signals(r.note or "", r.exit_code)
    tail = "\n" + r.stderr_tail.rstrip("\n") if r.stderr_tail else ""
    if tail and tail in note:
        # at the end; or, in a state written before the retry's reason went on
        # the first line, followed by that reason ("…\nTAIL; no retry: …")
        note = note.replace(tail, "", 1)
    if r.log is not None:
        for suffix in (f" (see {r.log})", f" (log: {r.log})"):  # today's, and earlier runs'
            if note.endswith(suffix):
                note = note[: -len(suffix)]
            elif f"{suffix}; " in note:  # a reason follows it
                note = note.replace(f"{suffix}; ", "; ", 1)
    return note


#: how a retry policy's reason for no retry starts (crucible.run.engine._control.next_retry)
_NO_RETRY = "; no retry: "


def note_cell(r: Row) -> str:
    """The NOTE cell: the display note cut to NOTE_CELL_MAX characters, the
    retry policy's reason for no retry kept whole (what was cut is before it)."""
    note = display_note(r)
    at = note.rfind(_NO_RETRY)
    if len(note) <= NOTE_CELL_MAX or at < 0:
        return clip(note, NOTE_CELL_MAX)
    reason = note[at:]
    return clip(note[:at], max(NOTE_CELL_MAX - len(reason), 20)) + reason


def display_name(r: Row, key_max: int = KEY_CELL_MAX) -> str:
    if r.key is None:
        return escape(r.task)
    return f"{escape(r.task)}[{clip(escape(r.key), key_max)}]"


def tail_lines(text: str) -> list[str]:
    """The lines of a stderr tail, each escaped (a line never splits a row)."""
    return [escape(line) for line in text.rstrip("\n").split("\n")] if text else []


def _details(r: Row) -> list[str]:
    """Lines under a failed unit: its log path and the end of its stderr."""
    if r.status != "failed" or (r.log is None and not r.stderr_tail):
        return []
    lines = []
    if r.log is not None:
        lines.append(f"    log: {escape(r.log)}")
    lines += [f"    | {clip(line, NOTE_CELL_MAX)}" for line in tail_lines(r.stderr_tail or "")]
    return lines


#: the table's usage columns: CPU (user+sys), %CPU (CPU / wall), peak RSS, block I/O
USAGE_HEADER = ("CPU", "%CPU", "PEAK_RSS", "READ", "WRITE")


def usage_cells(r: Row) -> tuple[str, str, str, str, str]:
    """A unit's last attempt's figures; a mapped task's: CPU summed, %CPU of
    the sums, the largest peak RSS, I/O summed (``-``: not measured)."""
    if r.mapped and r.key is None:
        units = r.member_usage
        more = r.folded
        found = task_stats(units, more)
        cpu, read, write, rss = (
            found.get(a) for a in ("cpu_s", "read_bytes", "write_bytes", "max_rss_kib")
        )
        bound = rss is not None and all(u.rss_bound for u in units if u.max_rss_kib == rss.max)
        if rss is not None and more is not None:
            bound = bound and more.rss_bound_at(rss.max)
        # CPU over the summed wall time of the same units
        timed = [u for u in units if u.cpu_s is not None and u.wall_s]
        cpu_sum, wall = more.timed() if more is not None else (0.0, 0.0)
        wall += sum(u.wall_s or 0.0 for u in timed)
        cpu_sum += sum(u.cpu_s or 0.0 for u in timed)
        pct = None if not wall else 100.0 * cpu_sum / wall
        return (
            cpu_text(None if cpu is None else cpu.sum),
            pct_text(pct),
            rss_text(None if rss is None else rss.max, bound),
            _size(None if read is None else int(read.sum)),
            _size(None if write is None else int(write.sum)),
        )
    u = r.usage
    if u is None:
        return ("-", "-", "-", "-", "-")
    return (
        cpu_text(u.cpu_s),
        pct_text(u.cpu_pct),
        rss_text(u.max_rss_kib, u.rss_bound),
        _size(u.read_bytes),
        _size(u.write_bytes),
    )


def render_table(rows: list[Row], out: IO[str], *, instances: bool) -> None:
    """A plain fixed-width table (mapped tasks one row each unless ``instances``);
    under a failed unit, its log path and stderr tail."""
    header: tuple[str, ...] = (
        "TASK",
        "STATUS",
        "ATTEMPTS",
        "DURATION",
        "OUTPUT",
        "FILES",
        *USAGE_HEADER,
        "NOTE",
    )
    lines: list[tuple[tuple[str, ...], list[str]]] = []
    failed_members: dict[str, list[Row]] = {}
    for r in rows:
        if r.key is not None and r.status == "failed":
            failed_members.setdefault(r.task, []).append(r)
    for r in rows:
        if r.key is not None and not instances:
            continue
        cells: tuple[str, ...] = (
            display_name(r),
            r.label,
            str(r.attempts),
            _seconds(r.duration),
            _size(r.output_bytes),
            _size(r.files_bytes),
            *usage_cells(r),
            note_cell(r),
        )
        details = _details(r)
        if r.key is None and r.mapped and not instances:
            bad = failed_members.get(r.task, [])
            for member in bad[:FAILED_SHOWN]:
                details.append(f"    {display_name(member)}: {note_cell(member)}")
                details += ["  " + line for line in _details(member)]
            if len(bad) > FAILED_SHOWN:
                details.append(
                    f"    ... {len(bad) - FAILED_SHOWN} more failed instances "
                    f"(report STATE {escape(r.task)})"
                )
            spread = usage_line(r.member_usage, r.folded)
            if spread:
                details.append(f"    {spread}")
        lines.append((cells, details))
    widths = [
        max(len(h), *(len(cells[i]) for cells, _ in lines)) if lines else len(h)
        for i, h in enumerate(header)
    ]
    for row_cells, details in ((header, []), *lines):
        padded = "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row_cells[:-1]))
        out.write(f"{padded}  {row_cells[-1]}".rstrip(" ") + "\n")
        for line in details:
            out.write(line + "\n")
    if isinstance(rows, Report) and rows.loop is not None:  # a scored loop's revisions
        from crucible.run.report import _loop_view as loop_view

        loop_view.render_table(rows.loop, out)


# -- NDJSON rows ----------------------------------------------------------------


def row_json(r: Row) -> dict[str, Any]:
    """One ``report --json`` row (docs/schemas/report-row.json): raw key and
    note, whole; absent values left out."""
    data: dict[str, Any] = {
        "task": r.task,
        "key": r.key,
        "status": r.status,
        "note": name_signals(r.note or "", r.exit_code) if r.note is not None else None,
        "attempts": r.attempts,
        "duration": r.duration,
        "exit_code": r.exit_code,
        "signal": signal_name(-r.exit_code)
        if r.exit_code is not None and r.exit_code < 0
        else None,
        "output_bytes": r.output_bytes,
        "files_bytes": r.files_bytes,
        "log": r.log,
        "stderr_tail": r.stderr_tail,
        "cache_miss": r.cache_miss,
    }
    # flags appear only when true (report-row.json), so a plain row stays short
    data.update(
        {flag: True for flag, on in (("cached", r.cached), ("tolerated", r.tolerated)) if on}
    )
    if r.key is None and r.mapped and r.instances is not None:
        data["instances"] = r.instances
        data["instance_status"] = dict(r.counts)
    if r.key is None and r.mapped:
        data["usage"] = task_json(r.member_usage, r.folded)
    elif r.usage is not None:
        data.update(unit_json(r.usage))
    return {k: v for k, v in data.items() if v is not None}


def render_outputs(state: Path, out: IO[str]) -> None:
    """The run's results (``STATE/outputs.json``), under the table when the plan
    declares any: each present one as canonical JSON (cut), each absent one with
    its reason."""
    # lazy: stage is not loaded with this module; only render_outputs() needs it
    from crucible.stage import StateLayout

    path = StateLayout(state).outputs_path
    data = read_regular(path, "outputs.json")
    if data is None:
        return
    try:
        value = canon.loads(data)
    except canon.CanonError as exc:
        raise canon.CanonError(exc.message, where=str(path)) from None
    if not isinstance(value, dict):
        return
    found = value.get("@absent")
    absent: dict[str, Any] = found if isinstance(found, dict) else {}
    names = sorted(
        {k for k in value if not k.startswith("@")} | set(absent), key=lambda k: k.encode()
    )
    if not names:
        return
    out.write("\nRESULTS\n")
    for name in names:
        if name in value and not name.startswith("@"):
            shown = canon.dumps(value[name]).decode("utf-8")
            out.write(f"  {escape(name)} = {clip(escape(shown), NOTE_CELL_MAX)}\n")
        else:
            why = absent[name]
            text = why.get("reason", "absent") if isinstance(why, dict) else "absent"
            note = why.get("note") if isinstance(why, dict) else None
            detail = f": {note}" if isinstance(note, str) and note else ""
            out.write(f"  {escape(name)}: absent ({escape(str(text))}{escape(detail)})\n")


def render_freed(state: Path, out: IO[str]) -> None:
    """The temporary files freed in this state (``STATE/freed/``), under the
    table when there are any: per producer, the files and bytes freed."""
    from crucible.run.engine._temps import read_freed  # the report's only use of the engine

    freed = read_freed(state)
    if not freed:
        return
    total = sum(int(d.get("bytes", 0)) for d in freed.values())
    out.write(f"\nTEMPORARY FILES FREED ({total} bytes)\n")
    for task in sorted(freed, key=lambda k: k.encode()):
        doc = freed[task]
        out.write(
            f"  {escape(task)}: {int(doc.get('files', 0))} files, {int(doc.get('bytes', 0))} bytes\n"
        )

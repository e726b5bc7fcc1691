"""Durable steps: memo, then ledger, then do the work.

* At-least-once executed: a crash between the work and its record re-executes it;
  racing callers may both run it. Bodies must be safe to repeat.
* Exactly-once recorded: one fsync'd line lands before the caller gets the value;
  a later call with the same identity replays it without running the body.
* Only settled facts: :meth:`Outcome.ok` and :meth:`Outcome.failed` (a failure the
  caller declares deterministic) are recorded; :meth:`Outcome.transient` and any
  exception raised by the body never are.
* Never fails the caller: every ledger problem is reported through ``warn`` and
  ends in "execute the work".
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from crucible.core import canon
from crucible.core.structs import dataclass, field
from crucible.ledger._files import (
    GENERATION_SIZE,
    LEDGER_NAME,
    Appender,
    describe,
    exclusive_lock,
    open_regular_file,
    quarantine,
    read_all,
)
from crucible.ledger._identity import content_step
from crucible.ledger._index import (
    Summary,
    Table,
    build,
    catch_up,
    generation_of,
    identity_hash,
    summary_of,
)
from crucible.ledger._record import (
    decode_line,
    fact_line,
    frame_problem,
    read_line_at,
    utc_now,
)
from crucible.ledger._scan import Scan, scan

__all__ = ["Ledger", "OpenReport", "Outcome", "Reply", "stderr_warn"]

Warn = Callable[[str], None]
#: what the memo keeps of a fact: (status, value, at)
_Known = tuple[str, Any, "str | None"]


def stderr_warn(message: str) -> None:
    """The default reporter: one line on the stderr of the moment."""
    sys.stderr.write(f"crucible-ledger: warning: {message}\n")
    sys.stderr.flush()


@dataclass(frozen=True)
class Outcome:
    """What a step body produced. ``settled`` facts are recorded; others are only
    returned. Use the constructors."""

    value: Any
    status: str = "ok"
    settled: bool = True

    @classmethod
    def ok(cls, value: Any) -> Outcome:
        return cls(value, "ok", True)

    @classmethod
    def failed(cls, value: Any) -> Outcome:
        """A deterministic failure: a fact of the identity, recorded and replayed."""
        return cls(value, "failed", True)

    @classmethod
    def transient(cls, value: Any, status: str = "failed") -> Outcome:
        """A possibly-flaky result (timeout, transport error, kill): never recorded."""
        return cls(value, status, False)


@dataclass(frozen=True)
class Reply:
    """A step's answer. ``cached`` is True only for a replay."""

    scope: str
    step: str
    status: str
    value: Any
    cached: bool = False
    at: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The reply object; ``cached`` appears only when true, so an ordinary
        (executed) reply is unchanged by the ledger."""
        out: dict[str, Any] = {
            "scope": self.scope,
            "step": self.step,
            "status": self.status,
            "value": self.value,
        }
        if self.cached:
            out["cached"] = True
        return out


@dataclass
class OpenReport:
    """What opening found: the ledger's figures (from its index, or from a scan
    when the index had to be rebuilt or could not be used) and whether the file
    was quarantined."""

    path: Path
    summary: Summary = field(default_factory=Summary)
    quarantined: Path | None = None
    unreadable: str | None = None
    #: how the lookups are served: "index" (steps.idx as it was), "rebuilt",
    #: "caught-up" (steps.idx extended), "memory" (no usable index), "empty"
    source: str = "empty"


def _garbage(result: Scan) -> str:
    return (
        f"no line is a ledger record ({result.bad_lines} bad lines, first at line "
        f"{result.bad_line_numbers[0]})"
    )


def _check_identity(scope: object, step: object) -> None:
    """A programming error, not a ledger problem: raised, never swallowed."""
    if not isinstance(scope, str) or not scope or not isinstance(step, str) or not step:
        raise ValueError("scope and step must be non-empty strings")


class Ledger:
    """A ledger directory holding ``steps.jsonl``.

    ``Ledger(dir)`` reads the file once and indexes identity -> latest record.
    With ``readonly=False`` (the default) an unreadable file is quarantined and a
    missing directory created; with ``readonly=True`` nothing on disk changes.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        readonly: bool = False,
        warn: Warn | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LEDGER_NAME
        self.readonly = readonly
        self._warn = warn if warn is not None else stderr_warn
        #: identity -> (status, value, at) of what this Ledger found or recorded
        #: (a tuple: a Reply is built for each replay anyway, and a record, on
        #: the fsync-bound path, should not build one more)
        self._memo: dict[tuple[str, str], _Known] = {}
        self._read_fd: int | None = None
        self._table: Table | None = None
        #: identities the table does not cover (or all of them, without a table)
        self._overlay: dict[tuple[str, str], int] = {}
        self._appender = Appender(self.directory)
        self.report = self._open()

    # -- opening --------------------------------------------------------------
    def _open(self) -> OpenReport:
        if not self.readonly:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                self._warn(f"cannot create ledger directory {self.directory}: {exc.strerror}")
        report = OpenReport(self.path)
        reason: str | None = None
        seen: os.stat_result | None = None
        try:
            # what we judge, so a quarantine renames this file and no later one
            seen = os.lstat(self.path) if os.path.lexists(self.path) else None
            fd = open_regular_file(self.path)
        except ValueError as exc:
            reason, fd = str(exc), None
        except OSError as exc:
            reason, fd = exc.strerror or str(exc), None
        if fd is not None:
            self._read_fd = fd
            try:
                reason = self._index(fd, report)
            except OSError as exc:
                reason = exc.strerror or str(exc)
            if reason is not None:
                self.close_reader()
                report.summary = Summary()
        if reason is not None:
            report.unreadable = reason
            report.quarantined = self._quarantine(reason, seen)
            return report
        summary = report.summary
        if summary.bad_lines or summary.torn_tail:
            parts: list[str] = []
            if summary.bad_lines:
                parts.append(
                    f"{summary.bad_lines} bad line(s) (first at line {summary.first_bad_line})"
                )
            if summary.torn_tail:
                parts.append("a torn tail")
            self._warn(f"{self.path}: skipped {' and '.join(parts)}")
        return report

    def _index(self, fd: int, report: OpenReport) -> str | None:
        """Serve lookups from ``steps.idx`` when it matches the file; else bring it
        up to date under the lock, or (no lock, no write) index in memory. Returns
        why the file is unreadable (garbage), or None."""
        info = os.fstat(fd)
        table = Table.open(self.directory)
        if table is not None and table.matches(fd, info, generation_of(self.directory)) == "fresh":
            self._table, report.summary, report.source = table, table.summary, "index"
            return None
        if table is not None:
            table.close()
        try:
            with exclusive_lock(self.directory) as lock_fd:
                return self._reindex(fd, lock_fd, report)
        except OSError:
            pass  # a read-only place, a planted lock: index in memory, as before
        return self._index_in_memory(fd, report)

    def _reindex(self, fd: int, lock_fd: int, report: OpenReport) -> str | None:
        info = os.fstat(fd)  # appends may have landed before we got the lock
        generation = os.pread(lock_fd, GENERATION_SIZE, 0).ljust(GENERATION_SIZE, b"\0")
        table = Table.open(self.directory, write=True)
        state = "stale" if table is None else table.matches(fd, info, generation)
        if table is not None and state == "behind":
            catch_up(table, fd, info.st_size)
            report.source = "caught-up"
            if table.replaced():  # grown into a new file
                table.close()
                table = Table.open(self.directory)
        elif state == "stale":
            if table is not None:
                table.close()
            data = read_all(fd)
            result = scan(data, hashed=True)
            if result.garbage:
                return _garbage(result)
            build(self.directory, data, result, info, generation)
            table = Table.open(self.directory)
            report.source = "rebuilt"
        else:
            report.source = "index"
        if table is None:  # pragma: no cover - just written
            raise OSError("index not written")
        self._table, report.summary = table, table.summary
        return None

    def _index_in_memory(self, fd: int, report: OpenReport) -> str | None:
        data = read_all(fd)
        result = scan(data)
        if result.garbage:
            return _garbage(result)
        self._overlay = result.index
        report.summary = summary_of(result, data, os.fstat(fd), b"")
        report.summary.identities = len(result.index)
        report.source = "memory"
        return None

    def _quarantine(self, reason: str, seen: os.stat_result | None) -> Path | None:
        if self.readonly:
            self._warn(f"{self.path} is unreadable ({reason}); reading it as empty")
            return None
        try:
            target = quarantine(self.path, seen)
        except OSError as exc:
            self._warn(
                f"{self.path} is unreadable ({reason}) and could not be quarantined "
                f"({describe(exc)}); continuing without it"
            )
            return None
        if target is not None:
            self._warn(
                f"{self.path} is unreadable ({reason}); quarantined as {target.name}, "
                "starting a fresh ledger"
            )
        return target

    def close_reader(self) -> None:
        if self._read_fd is not None:
            os.close(self._read_fd)
            self._read_fd = None
        if self._table is not None:
            self._table.close()
            self._table = None
        self._overlay = {}

    def close(self) -> None:
        self.close_reader()
        self._appender.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading --------------------------------------------------------------
    def __len__(self) -> int:
        """Identities in the ledger when opened."""
        return self.report.summary.identities

    def _position(self, identity: tuple[str, str]) -> int | None:
        pos = self._overlay.get(identity)
        if pos is None and self._table is not None:
            try:
                pos = self._table.lookup(identity_hash(*identity))
            except OSError as exc:
                self._warn(f"{self._table.path}: cannot read the index: {exc.strerror}")
        return pos

    def _read_record(self, identity: tuple[str, str]) -> dict[str, Any] | None:
        pos = self._position(identity)
        if pos is None or self._read_fd is None:
            return None
        try:
            line = read_line_at(self._read_fd, pos)
        except OSError as exc:
            self._warn(f"{self.path}: cannot read the record at byte {pos}: {exc.strerror}")
            return None
        record, problem = decode_line(line)
        if record is None:
            self._warn(f"{self.path}: the record at byte {pos} is damaged ({problem}); ignoring it")
            return None
        if (record["scope"], record["step"]) != identity:
            return None  # two identities of one 64-bit hash: the earlier is a miss
        return record

    def lookup(self, scope: str, step: str) -> Reply | None:
        """A replay (``cached=True``) from the memo or the ledger, or None. A ledger
        hit rehydrates the memo."""
        return self._lookup(scope, step)[0]

    def _lookup(self, scope: str, step: str) -> tuple[Reply | None, bool]:
        """(replay or None, whether it came from the ledger rather than the memo)."""
        _check_identity(scope, step)
        identity = (scope, step)
        known = self._memo.get(identity)
        from_ledger = known is None
        if known is None:
            record = self._read_record(identity)
            if record is None:
                return None, False
            known = self._memo[identity] = (record["status"], record["value"], record["at"])
        # built directly: dataclasses.replace costs more than the rest of a hit's
        # lookup (a task-cache run looks up every unit)
        return Reply(scope, step, known[0], known[1], True, known[2]), from_ledger

    def records(self, scope: str | None = None) -> list[bytes]:
        """The canonical payload bytes of the latest record of each identity, in
        file order (optionally one scope only)."""
        out: list[bytes] = []
        if self._read_fd is None:
            return out
        overlay = self._overlay
        positions = set(overlay.values())
        if self._table is not None:
            positions.update(self._table.offsets())
        for pos in sorted(positions):
            line = read_line_at(self._read_fd, pos)
            record, _problem = decode_line(line)
            if record is None:
                continue
            identity = (record["scope"], record["step"])
            if identity in overlay and overlay[identity] != pos:
                continue  # superseded by a record the table does not cover yet
            if scope is None or record["scope"] == scope:
                out.append(line[28:-1])
        return out

    # -- writing --------------------------------------------------------------
    def record(self, scope: str, step: str, outcome: Outcome, *, key: Any = None) -> bool:
        """Append the fact durably. False (reported through ``warn``) if it could
        not be recorded; the memo holds it either way."""
        _check_identity(scope, step)
        status, value, at = outcome.status, outcome.value, utc_now()
        self._memo[(scope, step)] = (status, value, at)
        if self.readonly:
            self._warn(f"{self.path}: opened read-only; {step} not recorded")
            return False
        try:
            line = fact_line(scope, step, status, value, key, at)
        except canon.CanonError as exc:
            self._warn(f"{step}: value cannot be recorded ({exc}); returning it unrecorded")
            return False
        try:
            self._appender.append(line, (scope, step))
        except OSError as exc:
            self._warn(f"cannot append to {self.path} ({describe(exc)}); {step} not recorded")
            return False
        return True

    def record_many(self, facts: list[tuple[str, str, Outcome, Any]]) -> int:
        """Append every ``(scope, step, outcome, key)`` of ``facts`` as one batch:
        one write and one fsync under the lock, each record indexed there. Returns
        how many were recorded: a value outside the canonical domain is left out
        (warned), and a failed append records none of them (warned once). The
        memo holds every fact either way."""
        entries: list[tuple[bytes, tuple[str, str] | None]] = []
        for scope, step, outcome, key in facts:
            _check_identity(scope, step)
            status, value, at = outcome.status, outcome.value, utc_now()
            self._memo[(scope, step)] = (status, value, at)
            if self.readonly:
                continue
            try:
                entries.append((fact_line(scope, step, status, value, key, at), (scope, step)))
            except canon.CanonError as exc:
                self._warn(f"{step}: value cannot be recorded ({exc}); returning it unrecorded")
        return self._append_batch(entries, len(facts))

    def _append_batch(self, entries: list[tuple[bytes, tuple[str, str] | None]], facts: int) -> int:
        """Append ``entries`` (made of ``facts`` facts) as one batch; how many
        were recorded (0, warned, when read-only or the append failed)."""
        if self.readonly:
            if facts:
                self._warn(f"{self.path}: opened read-only; {facts} facts not recorded")
            return 0
        try:
            self._appender.append_many(entries)
        except OSError as exc:
            self._warn(
                f"cannot append to {self.path} ({describe(exc)}); {len(entries)} facts not recorded"
            )
            return 0
        return len(entries)

    @staticmethod
    def encode_fact(scope: str, step: str, outcome: Outcome, *, key: Any = None) -> bytes:
        """The ledger line :meth:`record` would append for this fact, for a
        process that hands it to another to append (:meth:`append_encoded`): a
        task-cache worker leaves the appends of a batch to its dispatcher.
        Raises CanonError for a value outside the canonical domain and
        ValueError for an unsettled outcome."""
        _check_identity(scope, step)
        if not outcome.settled:
            raise ValueError("only settled outcomes are recorded (Outcome.ok / Outcome.failed)")
        return fact_line(scope, step, outcome.status, outcome.value, key, utc_now())

    def append_encoded(self, facts: list[tuple[bytes, str, str]]) -> int:
        """Append lines made by :meth:`encode_fact` — ``(line, scope, step)``
        each — as one batch (one write, one fsync under the lock, each indexed),
        as :meth:`record_many` does, without encoding them again. The memo is
        not filled (their values are not decoded). Returns how many were
        recorded (0, warned, when the append failed or the ledger is read-only;
        a line whose frame or checksum is broken is left out, warned: its
        payload is not parsed again, and an index slot under the wrong identity
        would only be a miss, as a lookup checks the identity it reads)."""
        if self.readonly:  # one warning, no line checked
            return self._append_batch([], len(facts))
        entries: list[tuple[bytes, tuple[str, str] | None]] = []
        for line, scope, step in facts:
            _check_identity(scope, step)
            problem = frame_problem(line[:-1]) if line.endswith(b"\n") else "no line end"
            if problem is not None:
                self._warn(f"{step}: not a ledger line ({problem}); not recorded")
                continue
            entries.append((line, (scope, step)))
        return self._append_batch(entries, len(facts))

    # -- by content key (the API other tools call, e.g. a task cache) -----------
    def lookup_key(self, scope: str, kind: str, key: Any) -> Reply | None:
        """The replay of the step ``content_step(kind, key)``, or None. ``key`` is
        any canonical-domain JSON value; the step embeds its SHA-256 (§3)."""
        return self.lookup(scope, content_step(kind, key))

    def record_key(self, scope: str, kind: str, key: Any, outcome: Outcome) -> bool:
        """Record a settled ``outcome`` under ``content_step(kind, key)``, keeping
        ``key`` in the record (for people and tools that diff keys). False, and
        reported through ``warn``, when it could not be recorded; never raises
        for a ledger problem. An unsettled (transient) outcome is refused."""
        if not outcome.settled:
            raise ValueError("only settled outcomes are recorded (Outcome.ok / Outcome.failed)")
        return self.record(scope, content_step(kind, key), outcome, key=key)

    def step(
        self,
        scope: str,
        step: str,
        body: Callable[[], Any],
        *,
        key: Any = None,
        on_replay: Callable[[Reply], None] | None = None,
    ) -> Reply:
        """Memo, then ledger, then ``body()``. A body returning a plain value is an
        ok outcome; an :class:`Outcome` says what it is; an exception propagates
        and records nothing. ``on_replay`` runs once per ledger hit (not for memo
        hits), to restore caller state a real execution would have set — e.g. the
        seed's build provenance, so that a replayed build unblocks its measures."""
        hit, from_ledger = self._lookup(scope, step)
        if hit is not None:
            if from_ledger and on_replay is not None:
                on_replay(hit)
            return hit
        produced = body()
        outcome = produced if isinstance(produced, Outcome) else Outcome.ok(produced)
        if outcome.settled:
            self.record(scope, step, outcome, key=key)
        return Reply(scope, step, outcome.status, outcome.value)

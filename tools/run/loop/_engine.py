"""The scored loop inside a dispatcher session (docs/spec/loop.md).

The dispatcher (:mod:`crucible.run.engine._dispatcher`) keeps every scheduling decision;
:class:`LoopRun` is the part of it that knows about revisions. Body tasks are
not readied by the task graph: once every task before the loop settled, the
loop queues revision 1's body units (key ``@rev1``) as ordinary units, wakes
each body unit's body consumers as it settles (the body is a DAG scheduled as
any other, ``-j`` applies), and when the revision's last unit settled it scores
the revision, writes ``STATE/loop.json`` and either starts the next revision or
stops. When it stops, each body task's kept-revision record is copied to the
task's plain record path and the body tasks settle, which wakes the tasks after
the loop through the graph as usual.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from crucible.core import atomic, canon
from crucible.core.errors import InputRefused, ParseError
from crucible.run.loop._spec import LoopSpec, revision_key
from crucible.run.session import events

if TYPE_CHECKING:
    from crucible.run.engine._host import LoopHost

__all__ = ["LOOP_FORMAT", "LoopRun", "attach"]

LOOP_FORMAT = "crucible.loop/1"
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
NO_KEPT = "loop kept no revision"


def attach(dispatcher: LoopHost) -> LoopRun | None:
    spec = LoopSpec.from_plan(dispatcher.model)
    return None if spec is None else LoopRun(dispatcher, spec)


class LoopRun:
    """One session's view of the loop: the settled revisions (from loop.json on
    a resume) and the revision running now."""

    def __init__(self, dispatcher: LoopHost, spec: LoopSpec) -> None:
        self.d = dispatcher
        self.spec = spec
        tasks = dispatcher.graph.tasks
        needs = {n: t.needs for n, t in tasks.items()}
        self.body = frozenset(spec.body)
        self.phases = spec.phases(needs)
        self.order = [n for n in dispatcher.graph.order if n in self.body]
        self.body_needs = {t: [n for n in needs[t] if n in self.body] for t in self.body}
        self.body_consumers: dict[str, list[str]] = {t: [] for t in self.body}
        for t in self.order:
            for n in self.body_needs[t]:
                self.body_consumers[n].append(t)
        self.path = dispatcher.layout.loop_path
        #: settled revisions, as loop.json lists them
        self.revisions: list[dict[str, Any]] = []
        self.kept: int | None = None
        self.best: Any = None
        #: revisions in a row without an improvement (failed ones count)
        self.stale = 0
        self.stop_reason: str | None = None
        self.finished = False
        self.started = False
        #: loop time spent in earlier sessions (the settled revisions' durations)
        self.earlier_s = 0.0
        self.session_start: float | None = None
        # the running revision
        self.current: int | None = None
        self.rev_started = 0.0
        self.rev_left: dict[str, int] = {}
        self.rev_status: dict[str, str] = {}
        self.pending = 0
        self.abort: str | None = None
        #: the time budget stopped a unit of the running revision
        self.cut = False
        self._starting = False
        self._queued: int | None = None
        if dispatcher.selected is not None and dispatcher.selected & self.body:
            # --target: a body task brings the whole loop (a revision is the body)
            dispatcher.select_also(self.body | self.phases.before)
        self._load()

    # ------------------------------------------------------------ state file

    def _load(self) -> None:
        """A resume continues from loop.json's settled revisions."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        where = str(self.path)
        try:
            doc = canon.loads(data)
        except canon.CanonError as exc:
            raise ParseError(f"not a loop state file: {exc.message}", where=where) from None
        revisions = doc.get("revisions") if isinstance(doc, dict) else None
        if not isinstance(revisions, list) or not all(isinstance(r, dict) for r in revisions):
            raise InputRefused("not a loop state file: no revisions list", where=where)
        for i, r in enumerate(revisions):
            if r.get("revision") != i + 1:
                raise InputRefused(
                    f"revision {i + 1} is out of order", where=f"{where}:$.revisions[{i}]"
                )
            self._account(r)
        self.revisions = revisions
        self.earlier_s = sum(int(r.get("duration_ms", 0)) for r in revisions) / 1000
        if doc.get("finished") is True:
            self.finished = True
            self.stop_reason = doc.get("stop_reason")

    def _account(self, r: dict[str, Any]) -> None:
        if r.get("kept") is True:
            self.kept, self.best, self.stale = r["revision"], r.get("score"), 0
        else:
            self.stale += 1

    def _doc(self) -> dict[str, Any]:
        return {
            "format": LOOP_FORMAT,
            "direction": self.spec.direction,
            "metric": self.spec.metric,
            "max_revisions": self.spec.max_revisions,
            "revisions": self.revisions,
            "kept_revision": self.kept,
            "best_score": self.best,
            "stop_reason": self.stop_reason,
            "finished": self.finished,
        }

    def _write(self, *, durable: bool = False) -> None:
        """Atomic always, durable only when asked: a revision's entry lost to a
        crash only reruns that revision on resume. The write that says the loop
        finished goes through :meth:`_durable_then`."""
        atomic.write_bytes(self.path, canon.dumps(self._doc()), durable=durable)

    # ------------------------------------------------------------ durability
    #
    # The loop's one ordering rule (docs/spec/run.md, "Order between batches"):
    # the loop.json that says the loop finished is durable BEFORE any
    # body task's plain record is written, for a resume takes those records as
    # the loop being over. A group-commit batch is made durable as a whole (one
    # syncfs gives no order inside it, and writeback may store any of its files
    # first), so loop.json joins one batch and the records it orders wait for
    # that batch to be durable: they are written then, and ride the next batch.
    # Nothing here fsyncs on the scheduling thread inside the dispatcher's loop.

    def _in_place(self) -> bool:
        """Outside the dispatcher's turns (a resume's start-up, before any unit
        runs) no batch is waited for: what the loop writes is fsynced in place,
        as everything read at start-up is durable."""
        return not self.d.in_turns

    def _durable_then(self, then: Callable[[], None], *, write: bool = True) -> None:
        """Make loop.json (as written now, or as read at a resume's start when
        ``write`` is false) durable, then call ``then``: once the next batch is
        durable inside the loop, at once (after an fsync here) outside it."""
        if self._in_place():
            if write:
                self._write(durable=True)
            else:
                # lazy: only _durable_then() needs it (start-up)
                from crucible.run.session._log import _fsync_path

                _fsync_path(str(self.path))
                _fsync_path(str(self.path.parent))
            then()
            return
        if write:
            self._write()
        self.d.log.sync((str(self.path), str(self.path.parent)))
        self.d.after_durable(then)

    def _wrote(self, task: str, key: str | None, durable: bool) -> None:
        """A record written without fsync rides the next batch."""
        if not durable:
            self.d.wrote(task, key)

    # ------------------------------------------------------------- starting

    def maybe_start(self) -> None:
        """Start revision 1 (or the next one, on a resume) once every task
        before the loop settled."""
        d = self.d
        if self.started:
            return
        if all(t in d.status for t in self.body):  # settled in an earlier session
            self.started = True
            self._rewrite_reserved()
            return
        if d.selected is not None and not self.body <= d.selected:
            return
        if any(t not in d.status for t in self.phases.before):
            return
        self.started = True
        self.session_start = time.monotonic()
        d.add_units(-len(self.body))  # counted per revision unit from here
        if self.finished and not self.revisions and self.stop_reason is None:
            # It never ran (a before task it needs did not pass: _skip_body) and
            # its skipped records are gone (--retry-failed, or a crash before
            # they were written): decided again, skipped again or run.
            self.finished = False
        if self.finished:  # loop.json says it stopped; the body's plain records are missing
            self._rewrite_reserved()
            # the loop.json read may be one a crash left unsynced
            self._durable_then(self._conclude, write=False)
            return
        blocked = self._blocked_by()
        if blocked is not None:
            self._skip_body(blocked)
            return
        if self._stop_reason() is not None:
            self._stop(self._stop_reason())
            return
        self._start(len(self.revisions) + 1)

    def _start(self, n: int) -> None:
        """Start revision ``n``. A revision whose units all settle at once (false
        conditions) finishes inside its own start: the next one starts after it
        returns, not inside it (no recursion per revision)."""
        if self._starting:
            self._queued = n
            return
        self._starting = True
        try:
            next_n: int | None = n
            while next_n is not None:
                self._queued = None
                self._start_revision(next_n)
                next_n = self._queued
        finally:
            self._starting = False

    def _blocked_by(self) -> str | None:
        """A task before the loop that did not pass, needed by a body task that
        joins all: the loop does not run."""
        d = self.d
        for t in self.order:
            if d.graph.tasks[t].join != "all":
                continue
            for n in d.graph.tasks[t].needs:
                if n not in self.body and d.status.get(n) != PASSED:
                    status = d.status.get(n)
                    return f"skipped: needs {n!r}, which {'was skipped' if status == SKIPPED else 'failed'}"
        return None

    def _skip_body(self, note: str) -> None:
        self.finished = True
        self._durable_then(lambda: self._settle_skipped(note))

    def _settle_skipped(self, note: str) -> None:
        d = self.d
        durable = self._in_place()
        for t in self.order:
            d.state_dir.record_settled(t, status=SKIPPED, note=note, durable=durable)
            self._wrote(t, None, durable)
            d.log.emit(events.task_finished(task=t, status=SKIPPED, note=note))
            d.add_units(1)
            d.count_settled(SKIPPED)
            d.settle(t, SKIPPED)

    def _start_revision(self, n: int) -> None:
        d = self.d
        key = revision_key(n)
        for t in self.order:  # an interrupted revision reruns whole
            if key in d.state_dir.load_all(t):  # only on a resume
                # Its tombstone rides the next batch, even at start-up: nothing
                # reads revision n's records before one of its new ones is
                # durable, and each follows the tombstone in the same file.
                d.state_dir.remove_result(t, key, durable=False)
                d.wrote(t, key)
        self._write_reserved(n)
        self.current = n
        self.rev_started = time.monotonic()
        self.rev_left = {t: len(self.body_needs[t]) for t in self.order}
        self.rev_status = {}
        self.abort = None
        self.cut = False
        self.pending = 0
        d.add_units(len(self.body))
        d.log.emit(events.revision_started(revision=n))
        roots = [t for t in self.order if self.rev_left[t] == 0]
        self.pending += len(roots)  # before any settles at once (a false condition)
        for t in roots:
            self._ready(t)

    def _rewrite_reserved(self) -> None:
        """A resume of a loop that stopped writes the final reserved inputs again
        for the tasks after it: they are derived from loop.json and written
        without fsync when it stopped, so a power cut may have lost them."""
        if self.finished and self.revisions:
            self._write_reserved(len(self.revisions))

    def _write_reserved(self, n: int) -> None:
        # lazy: run.loop._reserved is not loaded with this module; only _write_reserved() needs it
        from crucible.run.loop import _reserved as _loop_reserved

        _loop_reserved.write(self.d, n, self.revisions)

    # ------------------------------------------------------------ settling

    def forgives(self, name: str, key: str | None) -> bool:
        """A failed scoring unit fails its revision, not the run; so does a unit
        the time budget stopped."""
        if key is None or name not in self.body:
            return False
        return name == self.spec.score or self.cut

    def stop_by(self, name: str, key: str | None) -> tuple[float, ...]:
        """What a revision unit's request carries: the wall-clock time its loop's
        time budget ends (the worker stops the task then), or nothing."""
        budget = self.spec.time_budget
        if budget is None or name not in self.body or key is None:
            return ()
        return (time.time() + max(0.0, budget - self.elapsed()),)

    def budget_cut(self, name: str, key: str | None) -> bool:
        """Was this revision unit's timeout the loop's time budget running out?"""
        budget = self.spec.time_budget
        # 50 ms of slack: the worker's wall-clock deadline and this monotonic
        # clock may disagree by a little
        if (
            name in self.body
            and key is not None
            and budget is not None
            and self.elapsed() >= budget - 0.05
        ):
            self.cut = True
        return self.cut and name in self.body

    def unit_settled(self, name: str, status: str, tolerated: bool = False) -> None:
        """A body unit of the running revision settled (its last attempt, or
        skipped by its join or condition)."""
        assert self.current is not None
        self.rev_status[name] = status
        self.pending -= 1
        failed = status == FAILED and not tolerated
        if failed and name != self.spec.score and self.abort is None and not self.cut:
            self.abort = f"body task {name!r} failed"
        if self.abort is None and not self._out_of_time():
            woken = []
            for c in self.body_consumers[name]:
                self.rev_left[c] -= 1
                if self.rev_left[c] == 0:
                    woken.append(c)
            self.pending += len(woken)  # all counted before any can settle at once
            for c in woken:
                self._ready(c)
        if self.pending == 0:
            self._finish_revision()

    def _ready(self, name: str) -> None:
        """Every body need of ``name`` settled in this revision: queue its unit,
        or settle it skipped (its join, a false condition) or failed (a condition
        error) as the dispatcher does any task (pending already counts it)."""
        # lazy: only _ready() needs it (start-up)
        from crucible.run.engine import _control as control
        from crucible.run.engine._units import Unit

        d = self.d
        assert self.current is not None
        key = revision_key(self.current)
        task = d.graph.tasks[name]
        decided: tuple[str, str] | None = None
        if task.join == "all":
            for n in self.body_needs[name]:
                if self.rev_status.get(n) != PASSED:
                    how = "was skipped" if self.rev_status.get(n) == SKIPPED else "failed"
                    decided = (SKIPPED, f"skipped: needs {n!r}, which {how}")
                    break
        if decided is None and task.when is not None:
            decided = d.control.decide(task, {**d.status, **self.rev_status}, item=control.NO_ITEM)
        if decided is None:
            d.queue(Unit(name, key))
            return
        status, note = decided
        durable = self._in_place()
        d.state_dir.record_settled(name, status=status, note=note, key=key, durable=durable)
        self._wrote(name, key, durable)
        d.log.emit(events.task_finished(task=name, key=key, status=status, note=note))
        d.count_settled(status)
        # its body consumers are queued once the record is durable, as a worker's
        # unit's are (pending still counts it meanwhile)
        d.after_durable(lambda: self.unit_settled(name, status))

    def _out_of_time(self) -> bool:
        budget = self.spec.time_budget
        return budget is not None and self.elapsed() >= budget

    def elapsed(self) -> float:
        start = self.session_start if self.session_start is not None else time.monotonic()
        return self.earlier_s + time.monotonic() - start

    def _finish_revision(self) -> None:
        d = self.d
        n = self.current
        assert n is not None
        key = revision_key(n)
        duration_ms = int((time.monotonic() - self.rev_started) * 1000)
        spec = self.spec
        record = d.state_dir.load_result(spec.score, key) if spec.score in self.rev_status else None
        output = record.get("output") if record is not None else None
        output = output if isinstance(output, dict) else {}
        emits = d.graph.tasks[spec.score].emits
        fields = {f: output[f] for f in sorted(emits) if f in output}
        score: Any = None
        if self.abort is not None:
            reason = self.abort
        elif self.cut or len(self.rev_status) < len(self.body):
            reason = f"the time budget of {spec.time_budget or 0:g}s ran out mid-revision"
        elif self.rev_status.get(spec.score) != PASSED:
            reason = f"score task {spec.score!r} {self.rev_status.get(spec.score)}"
            if record is not None and record.get("note"):
                reason += f": {str(record['note']).splitlines()[0]}"
        else:
            value = output.get(spec.metric)
            if type(value) in (int, float):
                score = value
                reason = ""
            else:
                reason = f"score task {spec.score!r} passed without a number in {spec.metric!r}"
        previous = self.best
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
                reason = f"improved on revision {self.kept} by {by}"
            else:
                reason = f"no improvement of at least {spec.min_delta:g} on revision {self.kept}"
        entry = {
            "revision": n,
            "status": PASSED if score is not None else FAILED,
            "score": score,
            "verdict": verdict,
            "kept": kept,
            "note": reason,
            "delta": delta,
            "fields": fields,
            "duration_ms": duration_ms,
        }
        self.revisions.append(entry)
        self._account(entry)
        self.current = None
        d.add_units(-(len(self.body) - len(self.rev_status)))  # units never queued
        self._write()
        d.log.emit(
            events.revision_finished(
                revision=n,
                score=score,
                verdict=verdict,
                kept=kept,
                reason=reason,
                duration_ms=duration_ms,
            )
        )
        why = self._stop_reason()
        if why is not None:
            self._stop(why)
        elif not d.stopping:
            self._start(n + 1)
        # else: interrupted between revisions; at_end records it

    def _stop_reason(self) -> str | None:
        spec = self.spec
        last = self.revisions[-1] if self.revisions else None
        if last is not None and self.abort is not None:
            return "body_failed"
        if self.kept is not None and self.best is not None and spec.reached(self.best):
            return "target"
        if len(self.revisions) >= spec.max_revisions:
            return "max_revisions"
        if self._out_of_time():
            return "time_budget"
        if spec.patience is not None and self.stale >= spec.patience:
            return "patience"
        return None

    # ------------------------------------------------------------- stopping

    def _stop(self, reason: str | None) -> None:
        self.stop_reason = reason
        self.finished = True
        if self.revisions:  # the tasks after the loop see the final values
            self._write_reserved(len(self.revisions))
        self.d.log.emit(  # in loop.json's batch: the log never says more than it
            events.loop_finished(
                stop_reason=reason,
                revisions=len(self.revisions),
                kept_revision=self.kept,
                best_score=self.best,
            )
        )
        self._durable_then(self._conclude)

    def _conclude(self) -> None:
        """The body tasks settle as the kept revision: its records become their
        plain records (the files stay in the revision's directory, where stage
        finds them for every task outside the body). Called once the loop.json
        that says the loop finished is durable."""
        d = self.d
        durable = self._in_place()
        for t in self.order:
            path = d.layout.result_path(t)
            if self.kept is None:
                note = NO_KEPT
                if not self.revisions:
                    # No revision ran (a time budget spent before the first): no
                    # unit of the body settled, so none was counted or listed;
                    # the run fails by these tasks, and its last line says so.
                    note = f"{NO_KEPT}: no revision ran (stopped by {self.stop_reason})"
                    d.note_failed(t)
                d.state_dir.record_settled(t, status=FAILED, note=note, durable=durable)
                self._wrote(t, None, durable)
                status = FAILED
            else:
                rec = d.state_dir.load_result(t, revision_key(self.kept))
                if rec is None:  # the kept revision was kept because its units settled
                    raise InputRefused(
                        f"kept revision {self.kept} of {t!r} has no record", where=str(path)
                    )
                plain = {k: v for k, v in rec.items() if k != "key"}
                plain["extra"] = {**(rec.get("extra") or {}), "revision": self.kept}
                atomic.write_bytes(path, canon.dumps(plain), durable=durable)
                self._wrote(t, None, durable)
                status = str(rec.get("status", FAILED))
            d.settle(t, status)

    @property
    def fails_run(self) -> bool:
        return self.stop_reason == "body_failed"

    def skip_note(self, name: str) -> str | None:
        """A task right after the loop is skipped, saying why, when nothing was kept."""
        if not (self.finished and self.kept is None and self.revisions):
            return None
        if name in self.phases.after and any(
            n in self.body for n in self.d.graph.tasks[name].needs
        ):
            return NO_KEPT
        return None

    def at_end(self) -> None:
        """The session ends (interrupted, or --fail-fast) with the loop unfinished."""
        if self.started and not self.finished:
            self.stop_reason = "interrupted"
            self._write()


def _difference(score: float, previous: float) -> float | None:
    """``score − previous``, or None when it is past a float's range (-1e308 to
    1e308 is inf, which JSON, loop.json and the session log cannot hold)."""
    delta = score - previous
    return delta if math.isfinite(delta) else None

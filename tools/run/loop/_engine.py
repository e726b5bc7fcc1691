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

from typing import TYPE_CHECKING

from crucible.run.loop._budget import TimeBudget
from crucible.run.loop._history import LOOP_FORMAT, LoopHistory
from crucible.run.loop._revision import PASSED, SKIPPED, BodyGraph, Revision
from crucible.run.loop._scoring import FAILED, judge, stop_reason
from crucible.run.loop._spec import LoopSpec
from crucible.run.loop._writes import NO_KEPT, LoopWriter
from crucible.run.session import events

if TYPE_CHECKING:
    from crucible.run.engine._host import LoopHost

__all__ = ["LOOP_FORMAT", "LoopRun", "attach"]


def attach(dispatcher: LoopHost) -> LoopRun | None:
    spec = LoopSpec.from_plan(dispatcher.model)
    return None if spec is None else LoopRun(dispatcher, spec)


class LoopRun:
    """One session's loop: when it starts, each revision's units as they
    settle, and when it stops. What it remembers is its parts': the settled
    revisions (``history``, loop.json), the running one (``revision``), the
    time budget (``budget``); what it writes goes through ``writer``; the
    verdicts are crucible.run.loop._scoring's."""

    def __init__(self, dispatcher: LoopHost, spec: LoopSpec) -> None:
        self.d = dispatcher
        self.spec = spec
        tasks = dispatcher.graph.tasks
        needs = {n: t.needs for n, t in tasks.items()}
        self.body = frozenset(spec.body)
        self.phases = spec.phases(needs)
        self.graph = BodyGraph(self.body, dispatcher.graph.order, needs)
        self.history = LoopHistory(dispatcher.layout.loop_path, spec)
        self.revision = Revision(self.graph)
        self.writer = LoopWriter(dispatcher, self.history, self.graph.order)
        self.started = False
        self._starting = False
        self._queued: int | None = None
        if dispatcher.selected is not None and dispatcher.selected & self.body:
            # --target: a body task brings the whole loop (a revision is the body)
            dispatcher.select_also(self.body | self.phases.before)
        self.history.load()
        #: loop time spent in earlier sessions: the settled revisions' durations
        self.budget = TimeBudget(spec.time_budget, self.history.duration_s())

    # ------------------------------------------------------------- starting

    def maybe_start(self) -> None:
        """Start revision 1 (or the next one, on a resume) once every task
        before the loop settled."""
        d = self.d
        history = self.history
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
        self.budget.begin()
        d.add_units(-len(self.body))  # counted per revision unit from here
        if history.finished and not history.revisions and history.stop_reason is None:
            # It never ran (a before task it needs did not pass: _skip_body) and
            # its skipped records are gone (--retry-failed, or a crash before
            # they were written): decided again, skipped again or run.
            history.finished = False
        if history.finished:  # loop.json says it stopped; the body's plain records are missing
            self._rewrite_reserved()
            # the loop.json read may be one a crash left unsynced
            self.writer.durable_then(self.writer.conclude, write=False)
            return
        blocked = self._blocked_by()
        if blocked is not None:
            self._skip_body(blocked)
            return
        if self._stop_reason() is not None:
            self._stop(self._stop_reason())
            return
        self._start(len(history.revisions) + 1)

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
        for t in self.graph.order:
            if d.graph.tasks[t].join != "all":
                continue
            for n in d.graph.tasks[t].needs:
                if n not in self.body and d.status.get(n) != PASSED:
                    status = d.status.get(n)
                    return f"skipped: needs {n!r}, which {'was skipped' if status == SKIPPED else 'failed'}"
        return None

    def _skip_body(self, note: str) -> None:
        self.history.finished = True
        self.writer.durable_then(lambda: self.writer.settle_skipped(note))

    def _start_revision(self, n: int) -> None:
        d = self.d
        self.writer.clear_revision(n)
        self.writer.write_reserved(n)
        roots = self.revision.begin(n)
        d.add_units(len(self.body))
        d.log.emit(events.revision_started(revision=n))
        for t in roots:
            self._ready(t)

    def _rewrite_reserved(self) -> None:
        """A resume of a loop that stopped writes the final reserved inputs again
        for the tasks after it: they are derived from loop.json and written
        without fsync when it stopped, so a power cut may have lost them."""
        if self.history.finished and self.history.revisions:
            self.writer.write_reserved(len(self.history.revisions))

    # ------------------------------------------------------------ settling

    def forgives(self, name: str, key: str | None) -> bool:
        """A failed scoring unit fails its revision, not the run; so does a unit
        the time budget stopped."""
        if key is None or name not in self.body:
            return False
        return name == self.spec.score or self.revision.cut

    def stop_by(self, name: str, key: str | None) -> tuple[float, ...]:
        """What a revision unit's request carries: the wall-clock time its loop's
        time budget ends (the worker stops the task then), or nothing."""
        if self.budget.seconds is None or name not in self.body or key is None:
            return ()
        return self.budget.stop_at()

    def budget_cut(self, name: str, key: str | None) -> bool:
        """Was this revision unit's timeout the loop's time budget running out?"""
        if name in self.body and key is not None and self.budget.nearly_out():
            self.revision.cut = True
        return self.revision.cut and name in self.body

    def unit_settled(self, name: str, status: str, tolerated: bool = False) -> None:
        """A body unit of the running revision settled (its last attempt, or
        skipped by its join or condition)."""
        rev = self.revision
        assert rev.n is not None
        rev.settled(name, status)
        failed = status == FAILED and not tolerated
        if failed and name != self.spec.score and rev.abort is None and not rev.cut:
            rev.abort = f"body task {name!r} failed"
        if rev.abort is None and not self.budget.out_of_time():
            for c in rev.wake(name):
                self._ready(c)
        if rev.pending == 0:
            self._finish_revision()

    def _ready(self, name: str) -> None:
        """Every body need of ``name`` settled in this revision: queue its unit,
        or settle it skipped (its join, a false condition) or failed (a condition
        error) as the dispatcher does any task (pending already counts it)."""
        # lazy: only _ready() needs it (start-up)
        from crucible.run.engine import _control as control
        from crucible.run.engine._units import Unit

        d = self.d
        rev = self.revision
        key = rev.key
        task = d.graph.tasks[name]
        decided: tuple[str, str] | None = None
        if task.join == "all":
            skipped = rev.failed_need(name)
            if skipped is not None:
                decided = (SKIPPED, skipped)
        if decided is None and task.when is not None:
            decided = d.control.decide(task, {**d.status, **rev.status}, item=control.NO_ITEM)
        if decided is None:
            d.queue(Unit(name, key))
            return
        status, note = decided
        self.writer.record_decided(name, key, status, note)
        # its body consumers are queued once the record is durable, as a worker's
        # unit's are (pending still counts it meanwhile)
        d.after_durable(lambda: self.unit_settled(name, status))

    def _finish_revision(self) -> None:
        d = self.d
        rev = self.revision
        n = rev.n
        assert n is not None
        duration_ms = rev.duration_ms()
        score_task = self.spec.score
        record = d.state_dir.load_result(score_task, rev.key) if score_task in rev.status else None
        entry = judge(
            self.spec, rev, record, d.graph.tasks[score_task].emits, self.history, duration_ms
        )
        self.history.add(entry)
        rev.n = None
        d.add_units(-rev.unsettled())  # units never queued
        self.history.write()
        d.log.emit(
            events.revision_finished(
                revision=n,
                score=entry["score"],
                verdict=entry["verdict"],
                kept=entry["kept"],
                reason=entry["note"],
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
        return stop_reason(self.spec, self.history, self.revision, self.budget)

    # ------------------------------------------------------------- stopping

    def _stop(self, reason: str | None) -> None:
        history = self.history
        history.stop_reason = reason
        history.finished = True
        if history.revisions:  # the tasks after the loop see the final values
            self.writer.write_reserved(len(history.revisions))
        self.d.log.emit(  # in loop.json's batch: the log never says more than it
            events.loop_finished(
                stop_reason=reason,
                revisions=len(history.revisions),
                kept_revision=history.kept,
                best_score=history.best,
            )
        )
        self.writer.durable_then(self.writer.conclude)

    @property
    def fails_run(self) -> bool:
        return self.history.stop_reason == "body_failed"

    def skip_note(self, name: str) -> str | None:
        """A task right after the loop is skipped, saying why, when nothing was kept."""
        history = self.history
        if not (history.finished and history.kept is None and history.revisions):
            return None
        if name in self.phases.after and any(
            n in self.body for n in self.d.graph.tasks[name].needs
        ):
            return NO_KEPT
        return None

    def at_end(self) -> None:
        """The session ends (interrupted, or --fail-fast) with the loop unfinished."""
        if self.started and not self.history.finished:
            self.history.stop_reason = "interrupted"
            self.history.write()

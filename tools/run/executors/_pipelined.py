"""A local worker's life as a pipelined loop (crucible.run.executors._workers):
it holds one slot from one unit to the next, staging the next units while its
task runs (docs/spec/run.md, "Pipelined workers").

The loop drives a unit's phases (:class:`UnitPhases`, which
crucible.run.executors._unit.UnitRunner implements) and decides only their
order: which staged unit starts when a task exits, when a finished unit's
reply may wait for the next one, and when what is staged goes back."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from crucible.core.errors import CrucibleError
from crucible.run.executors._agent_io import AgentStdout
from crucible.run.executors._attempt import Staged, Started, not_started
from crucible.run.executors._procs import TaskProcess
from crucible.run.executors._slots import Slots
from crucible.run.executors._tasklog import LogSink
from crucible.run.executors._workers import Channel, Inbox

__all__ = [
    "AHEAD",
    "HANDBACK_AFTER",
    "HANDBACK_TIMES",
    "RECENT",
    "Pipeline",
    "UnitPhases",
    "handback_after",
    "serve",
]

#: units a pipelined worker stages ahead of its running one (serve; its pool
#: queues AHEAD + 1 requests to it: crucible.run.executors._workers)
AHEAD = 3
#: how long a pipelined worker's task runs before the unit staged behind it is
#: handed back to start elsewhere (serve): the longest a ready unit waits
#: behind another's task
HANDBACK_AFTER = 0.02
#: ... or this many times the median of the worker's last RECENT task durations
HANDBACK_TIMES = 5
RECENT = 31
PASSED = "passed"


class UnitPhases(Protocol):
    """One unit attempt's phases, as a worker runs them (crucible.run.executors._unit)."""

    slots: Slots
    #: tasks whose settling wakes nothing: their passed replies may wait
    quiet: frozenset[str]

    def begin(self, request: tuple[Any, ...]) -> Staged | dict[str, Any]: ...

    def start(self, staged: Staged) -> Started | dict[str, Any]: ...

    def wait(
        self,
        proc: TaskProcess,
        channel: Channel,
        out_r: int,
        sink: LogSink,
        agent_out: AgentStdout | None = None,
    ) -> tuple[int, str | None, bool]: ...

    def ended(self, started: Started, gone: bool) -> list[str] | None: ...

    def finish(
        self,
        started: Started,
        code: int,
        stop_reason: str | None,
        gone: bool,
        held_notes: list[str] | None,
    ) -> dict[str, Any]: ...


class Pipeline:
    """What a pipelined worker's wait (crucible.run.executors._wait) does besides waiting
    (:func:`serve`): take the next request while none is staged,
    and once the task runs long hand whatever is staged back."""

    def __init__(
        self,
        take: Callable[[], object],
        pending: list[Any],
        hand_back: Callable[[], None],
        after: float = HANDBACK_AFTER,
    ) -> None:
        self._take = take
        self._pending = pending
        self._hand_back = hand_back
        #: how long the task may run before what is staged behind it goes back
        self.after = after
        self.long = False

    def watching(self) -> bool:
        """Whether to wake for a request: none is staged (one staged is taken
        with the next exit instead: no wake-up), or the task runs long (a
        request sent before the dispatcher heard so is handed back at once)."""
        return self.long or not self._pending

    def on_request(self) -> bool:
        """The request pipe is readable; returns whether to keep watching it."""
        self._take()
        if self.long:
            self._hand_back()
        return self.watching()

    def on_long(self) -> None:
        """The task ran HANDBACK_AFTER: what is staged behind it goes elsewhere."""
        self.long = True
        self._hand_back()


def handback_after(recent: deque[float]) -> float:
    """HANDBACK_AFTER, or HANDBACK_TIMES the median of the worker's recent
    task durations when that is more: on a loaded machine a quick task
    waits for a CPU for tens of ms, and handing back what is staged behind
    it would only move the wait (and cost a round trip)."""
    if len(recent) < 3:
        return HANDBACK_AFTER
    ordered = sorted(recent)
    return max(HANDBACK_AFTER, HANDBACK_TIMES * ordered[len(ordered) // 2])


def serve(phases: UnitPhases, inbox: Inbox) -> None:
    """A local worker's life (a pipelined pool, crucible.run.executors._workers): it
    holds one slot from one unit to the next. While its task runs it takes
    the next request and stages it; when the task exits (and what it held
    was checked) the slot passes straight to the staged unit, which starts
    before the one that ended is captured. So a short task costs one
    wake-up of its worker (the exit), not three (request, slot, exit), and
    a slot is idle only for a reap and a spawn. A task that runs past
    HANDBACK_AFTER hands its staged successor back (``handback``: another
    worker starts it), so no unit waits long behind another's task."""
    held: dict[int, None] = {}  # tokens without a final reply
    try:
        _serve(phases, inbox, held)
    except Exception as exc:  # a bug: said for every token held, then gone
        for token in held:
            inbox.fail(token, exc)


def _serve(phases: UnitPhases, inbox: Inbox, held: dict[int, None]) -> None:
    slot = False
    running: tuple[int, Started] | None = None
    #: staged, in the order they start (at most AHEAD)
    pending: list[tuple[int, Staged]] = []
    #: how long this worker's last tasks ran (seconds)
    recent: deque[float] = deque(maxlen=RECENT)

    def answer(token: int, payload: dict[str, Any], name: str | None = None) -> None:
        held.pop(token, None)
        record = payload.get("record")
        if (
            name in phases.quiet
            and payload.get("kind") == "finished"
            and record is not None
            and record.get("status") == PASSED
        ):
            # nothing waits for it: sent with the next reply, or once fewer
            # than two units are staged here (below)
            inbox.defer(token, payload)
        else:
            inbox.reply(token, payload)

    def take(block: bool) -> bool:
        """Take a request and stage it; False when none was whole yet (or,
        without ``block``, none is waiting)."""
        item = inbox.take(block=block)
        if item is None:
            return False
        token, request = item
        held[token] = None
        try:
            staged = phases.begin(request)
        except CrucibleError as exc:  # a refusal it did not expect to meet
            held.pop(token, None)
            inbox.fail(token, exc)
            return True
        if isinstance(staged, dict):
            answer(token, staged)
        else:
            pending.append((token, staged))
        return True

    def hand_back() -> None:  # the running task runs long: what waits goes elsewhere
        while take(block=False):  # sent before the dispatcher heard it runs long
            pass
        for token, staged in pending:
            answer(token, {"kind": "handback", "staged_env": staged.staged_env})
        pending.clear()

    while True:
        if running is None:
            if not pending:
                inbox.flush()  # nothing to run: the dispatcher hears all first
                if not take(block=True):
                    if inbox.closed:
                        break
                    continue
                continue
            token, staged = pending.pop(0)
            if not slot:
                if not phases.slots.acquire(inbox.requests_fd):
                    answer(token, not_started(staged))
                    continue
                slot = True
            started = phases.start(staged)
            if isinstance(started, dict):
                phases.slots.release()
                slot = False
                answer(token, started)
                continue
            running = (token, started)
        token, started = running
        # Stage what the dispatcher sent meanwhile (it is waiting in the pipe:
        # taking it now costs no wake-up), up to AHEAD units.
        while len(pending) < AHEAD and take(block=False):
            pass
        channel = inbox.channel(token)
        channel.pipeline = Pipeline(
            lambda: take(block=False), pending, hand_back, handback_after(recent)
        )
        code, stop_reason, gone = phases.wait(
            started.proc, channel, started.out_r, started.sink, started.agent_out
        )
        held_notes = phases.ended(started, gone)
        recent.append(time.monotonic() - started.proc.started)
        running = None
        if gone:
            raise SystemExit(70)  # nobody to reply to (its group is killed)
        if pending and phases.slots.stopping():
            for nt, ns in pending:
                answer(nt, not_started(ns))
            pending.clear()
        if pending:  # the slot passes on: start the next before capturing this one
            nt, ns = pending.pop(0)
            following = phases.start(ns)
            if isinstance(following, dict):
                phases.slots.release()
                slot = False
                answer(nt, following)
            else:
                running = (nt, following)
        else:
            phases.slots.release()
            slot = False
        try:
            result = phases.finish(started, code, stop_reason, gone, held_notes)
        except CrucibleError as exc:
            held.pop(token, None)
            inbox.fail(token, exc)
        else:
            answer(token, result, started.staged.name)
        if len(pending) < 2:  # the dispatcher refills while the next ones run
            inbox.flush()
    inbox.flush()
    if slot:
        phases.slots.release()

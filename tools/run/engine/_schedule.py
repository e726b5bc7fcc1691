"""A session's scheduling state: what settled and how, what each task still
waits for, the ready queue, retries waiting for their backoff, mapped tasks'
instances, and the counts. :meth:`Schedule.settle` records a task's status and
wakes its consumers once its record is durable (:mod:`crucible.run.engine._durable`).
What to do with a ready task is the dispatcher's (its ``on_ready``)."""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from crucible.run.engine._durable import DurableGate
from crucible.run.engine._graph import TaskGraph
from crucible.run.engine._selection import Selection
from crucible.run.engine._units import FAILED, FAILURES_SHOWN, PASSED, SKIPPED, Counts, Unit

__all__ = ["Schedule"]


class Schedule:
    def __init__(self, graph: TaskGraph, gate: DurableGate, selection: Selection | None) -> None:
        self.graph = graph
        self.gate = gate
        #: tasks this session may run (None: all)
        self.selected: set[str] | None = None if selection is None else selection.selected
        self.status: dict[str, str] = {}
        #: per task, how many of the tasks it waits for are unsettled
        self.remaining: dict[str, int] = {}
        #: units whose dependencies settled, waiting for a worker
        self.ready: deque[Unit] = deque()
        #: units whose task process is running
        self.running = 0
        #: retries waiting for their backoff: (due, sequence, unit)
        self.timers: list[tuple[float, int, Unit]] = []
        self._timer_seq = 0
        #: mapped task -> its instance keys in item order, and how many are unsettled
        self.instances: dict[str, list[str]] = {}
        self.instances_left: dict[str, int] = {}
        self.counts = Counts(total=len(graph.tasks))
        #: tasks whose failure was tolerated (the run's exit code ignores them)
        self.tolerated: set[str] = set()
        #: the first failed units, for the run's last line
        self.failures: list[tuple[str, str | None]] = []
        #: --fail-fast: the unit whose failure stopped the run
        self.fail_fast_by: str | None = None
        #: what the dispatcher does with a task whose dependencies all settled
        self.on_ready: Callable[[str], None] = lambda _name: None
        #: tasks handed to ``on_ready`` (each at most once: see :meth:`ready_once`)
        self.readied: set[str] = set()
        #: a scored loop's before phase, and what the loop does when one of them settles
        self.loop_before: frozenset[str] = frozenset()
        self.on_loop_before: Callable[[], None] = lambda: None
        #: per consumer, the settles of its producers whose wake-up waits for
        #: their batch (settle: a batch is urgent when it readies a consumer)
        self._waking: dict[str, int] = {}
        #: told of every task that settled, once its record is durable (temporary
        #: files: crucible.run.engine._temps); None: nobody listens
        self.on_settled: Callable[[str], None] | None = None

    # ------------------------------------------------------------- settling

    def settle(self, name: str, status: str) -> None:
        """``name`` settled (counting is the caller's): wake its consumers once
        its record is durable. A task nothing waits for (no consumer, not
        before a scored loop) defers nothing: no loop turn waits for its batch."""
        self.status[name] = status
        consumers = self.graph.consumers[name]
        if consumers or name in self.loop_before:
            # urgent when a consumer waits for nothing else (its start waits for
            # this batch: docs/spec/run.md, "Session log")
            urgent = name in self.loop_before
            waking = self._waking
            for consumer in consumers:
                left = self.remaining[consumer] - waking.get(consumer, 0)
                waking[consumer] = waking.get(consumer, 0) + 1
                if left == 1 and consumer not in self.status:
                    urgent = True
            self.gate.after_durable(lambda: self._wake_consumers(name), urgent=urgent)
        if self.on_settled is not None:
            listener = self.on_settled
            self.gate.after_durable(lambda: listener(name), urgent=False)

    def _wake_consumers(self, name: str) -> None:
        waking = self._waking
        for consumer in self.graph.consumers[name]:
            waking[consumer] = waking.get(consumer, 1) - 1
            self.remaining[consumer] -= 1
            if self.remaining[consumer] == 0 and consumer not in self.status:
                self.ready_once(consumer)
        if name in self.loop_before:  # scored loop
            self.on_loop_before()

    def ready_once(self, name: str) -> None:
        """Hand ``name`` to ``on_ready`` unless it was handed already. At start-up
        the dispatcher walks every task whose dependencies settled; a task settled
        on that walk (a false condition, an empty fan-out) wakes its consumers at
        once (nothing is gated before the turns), so a consumer with a settled
        join was queued by the wake and again by the walk: it ran twice."""
        if name in self.readied:
            return
        self.readied.add(name)
        self.on_ready(name)

    def count_settled(self, status: str) -> None:
        if status == PASSED:
            self.counts.passed += 1
        elif status == SKIPPED:
            self.counts.skipped += 1
        else:
            self.counts.failed += 1

    def note_failure(self, label: str, log: str | None, *, fail_fast: bool) -> None:
        """A unit settled failed: keep it for the last line; --fail-fast stops."""
        if len(self.failures) < FAILURES_SHOWN:
            self.failures.append((label, log))
        if fail_fast and self.fail_fast_by is None:
            self.fail_fast_by = repr(label)

    # --------------------------------------------------------------- resume

    def resume(self, selection: Selection | None) -> None:
        """Mark tasks settled by an earlier session; count what is left to wait for."""
        if selection is not None:
            for name in self.graph.order:
                record = selection.kept.get(name)
                if record is not None:
                    status = record.get("status", FAILED)
                    self.status[name] = status
                    if record.get("tolerated") is True:
                        self.tolerated.add(name)
                        if "keys" not in record:
                            self.counts.tolerated += 1
                    self._count_resumed(record, status)
        for name, deps in self.graph.waits_for.items():
            self.remaining[name] = sum(1 for d in deps if d not in self.status)

    def _count_resumed(self, record: dict[str, Any], status: str) -> None:
        """Count a task settled in an earlier session as a run counts it: a mapped
        task with instances is one unit per instance, by their statuses."""
        keys = record.get("keys")
        counts = record.get("counts")
        if isinstance(keys, list) and keys and isinstance(counts, dict):
            self.counts.total += len(keys) - 1
            self.counts.passed += int(counts.get(PASSED, 0))
            self.counts.skipped += int(counts.get(SKIPPED, 0))
            self.counts.failed += (
                len(keys) - int(counts.get(PASSED, 0)) - int(counts.get(SKIPPED, 0))
            )
            return
        self.count_settled(status)

    def expected(self) -> list[str]:
        """The tasks that must pass for the run to pass: the selected ones."""
        if self.selected is None:
            return list(self.graph.order)
        return [n for n in self.graph.order if n in self.selected]

    # -------------------------------------------------------------- retries

    def retry_later(self, unit: Unit, delay: float) -> None:
        self._timer_seq += 1
        heapq.heappush(self.timers, (time.monotonic() + delay, self._timer_seq, unit))

    def release_timers(self) -> None:
        now = time.monotonic()
        while self.timers and self.timers[0][0] <= now:
            _, _, unit = heapq.heappop(self.timers)
            self.ready.append(unit)

    def next_wake(self, stopping: bool) -> float | None:
        """Seconds until the next retry is due (None: none, or stopping)."""
        if self.timers and not stopping:
            return max(0.0, self.timers[0][0] - time.monotonic())
        return None

    def clear(self) -> None:
        """Stopping: nothing queued starts."""
        self.ready.clear()
        self.timers.clear()

"""The record-durability gate (docs/spec/run.md, "Session log"): what a settle
would start waits until the group-commit batch holding its record is durable.

The scheduling thread writes records without fsync (:meth:`DurableGate.wrote`
hands each to the next batch); a callback that may start a dependant is
deferred to the next commit's batch and run once the session log's writer
thread says that batch is on disk. Outside the dispatcher's turns (a resume's
start-up, the loop's end) everything read is already durable: callbacks run
at once."""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the dispatcher imports stage lazily (crucible-dispatch --help)
    from crucible.run.session._log import SessionLog
    from crucible.stage import StateLayout

__all__ = ["DurableGate"]


class DurableGate:
    def __init__(self, log: SessionLog, layout: StateLayout) -> None:
        self.log = log
        self.layout = layout
        #: inside the dispatcher's turns: callbacks wait for their batch (the
        #: dispatcher sets it around its turns)
        self.gating = False
        #: callbacks for the next commit's batch, and (batch, callbacks) waiting
        self._deferred: list[Callable[[], None]] = []
        #: something deferred for the next commit's batch may start a unit
        self.urgent = False
        self._waiting: deque[tuple[int, list[Callable[[], None]]]] = deque()
        self._wake_lock = threading.Lock()
        self._wake_fd = -1

    def watch(self, wake_fd: int) -> None:
        """While the dispatcher runs, the log's writer thread wakes its loop
        through ``wake_fd`` when a batch turns durable."""
        self._wake_fd = wake_fd
        self.log.on_durable = self._durable_wake

    def unwatch(self) -> None:
        """Before ``wake_fd`` is closed: the writer thread may still call in."""
        with self._wake_lock:
            self.log.on_durable = None
            self._wake_fd = -1

    def after_durable(self, fn: Callable[[], None], *, urgent: bool = True) -> None:
        """Run ``fn`` (it may start a dependant) once every record written so far
        is durable: after the next commit's batch is on disk. ``urgent``
        (unless the caller knows ``fn`` starts nothing): that batch is fsync'd
        sooner (crucible.run.session._log.URGENT_COMMIT_WINDOW)."""
        if self.gating:
            self._deferred.append(fn)
            self.urgent = self.urgent or urgent
        else:
            fn()

    def wrote(self, task: str, key: str | None) -> None:
        """A record the scheduling thread wrote without fsync: the next batch
        fsyncs it (and its directory) before its lines."""
        path = self.layout.result_path(task, key)
        self.log.sync((str(path), str(path.parent)))

    @property
    def deferred(self) -> bool:
        """Something waits for the next commit's batch to be durable."""
        return bool(self._deferred)

    @property
    def waiting(self) -> bool:
        """Something waits for a committed batch to be durable."""
        return bool(self._waiting)

    def committed(self, seq: int) -> None:
        """The turn's events went out as batch ``seq``: what was deferred waits for it."""
        if self._deferred:
            self._waiting.append((seq, self._deferred))
            self._deferred = []
        self.urgent = False

    def due(self) -> bool:
        """The oldest batch waited for is durable already (the writer may not
        have woken the loop for it: see :meth:`_durable_wake`)."""
        return bool(self._waiting) and self._waiting[0][0] <= self.log.durable_seq

    def release(self) -> None:
        """Run the callbacks whose batch is durable."""
        durable = self.log.durable_seq
        while self._waiting and self._waiting[0][0] <= durable:
            for fn in self._waiting.popleft()[1]:
                fn()

    def _durable_wake(self) -> None:
        """On the log's writer thread: a batch is durable; wake the loop, when
        something waits for a batch (most settles wake nobody: a task without
        consumers). A batch that turns durable before the loop queued what
        waits for it is seen by the loop itself before it sleeps (:meth:`due`)."""
        if not self._waiting:
            return
        with self._wake_lock:
            if self._wake_fd >= 0:
                with contextlib.suppress(OSError):
                    os.write(self._wake_fd, b"d")

"""The executor seam: what starts a unit, reports its end, and cancels.

The dispatcher (:mod:`crucible.run.engine._dispatcher`) keeps every scheduling decision:
dependency order, joins, conditions, retries, caps, resume and the session log.
An executor only carries one attempt of one unit through the same unit code
(:class:`crucible.run.executors._unit.UnitRunner`: stage, spawn, wait, capture) wherever
it runs, and reports back through descriptors the dispatcher's one selector
watches. The contract is written in docs/spec/run.md ("Executors"); a third
executor (a batch scheduler, Kubernetes jobs) is one module implementing
:class:`Executor` and one branch in
:func:`crucible.run.executors._create.create`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from crucible.core.errors import OperationalError
from crucible.run.executors._slots import Slots
from crucible.run.executors._workers import Reply, WorkerPool

if TYPE_CHECKING:
    from crucible.run.executors._reaper import Reaper

__all__ = ["EXECUTORS", "Executor", "ExecutorLost", "LocalExecutor"]


class ExecutorLost(OperationalError):
    """``read`` found the executor gone (a Dask scheduler stopped mid-run): the
    run ends at once (exit 3) with ``run_finished`` logged; the units in flight
    stay unsettled, for a resume (docs/spec/run.md, "Executors")."""


EXECUTORS = ("local", "dask", "dask-local", "slurm")


class Executor(Protocol):
    """Runs ``("unit", name, key, attempt, staged_env)`` requests.

    ``submit`` never blocks on the unit; ``read(fd)`` (for a readable fd of
    ``reply_fds``) returns the replies waiting there: at most one interim
    ("started", payload ``{"kind": "started", "pid": ...}``) and exactly one
    final reply per submitted token, in any order across tokens."""

    @property
    def peak_rss_kib(self) -> int:
        """Peak RSS of the executor's local helper processes (0 if none)."""
        ...

    @property
    def pids_are_local(self) -> bool:
        """Whether the pids in "started" replies are this host's processes."""
        ...

    @property
    def reply_fds(self) -> list[int]: ...

    @property
    def in_flight(self) -> int:
        """Submitted tokens without a final reply."""
        ...

    @property
    def idle(self) -> int:
        """How many more units may be submitted now."""
        ...

    def submit(self, token: int, request: tuple[Any, ...]) -> None: ...

    def flush(self) -> None:
        """Send what was submitted since the last flush (an executor may hold
        submissions to send them together); called after each round of submits."""
        ...

    def read(self, fd: int) -> list[Reply]: ...

    def stop(self) -> None:
        """Start nothing new; terminate every running task's group (SIGKILL after
        the kill grace). Every in-flight token still gets its final reply."""
        ...

    def kill(self) -> None:
        """SIGKILL every running task's group now."""
        ...

    def close(self) -> None:
        """Release everything (idempotent); after stop, no task process is left."""
        ...


class LocalExecutor:
    """Today's forked workers (crucible.run.executors._workers) with the slot pipes."""

    def __init__(self, pool: WorkerPool, slots: Slots, reaper: Reaper | None = None) -> None:
        self.pool = pool
        self.slots = slots
        #: kills the tasks' groups should the dispatcher and its workers all die
        #: (a SIGKILL of their process group): started before the pool forks
        self.reaper = reaper

    #: forked here: every task pid is this host's
    pids_are_local = True

    @property
    def peak_rss_kib(self) -> int:
        return self.pool.peak_rss_kib

    @property
    def reply_fds(self) -> list[int]:
        return self.pool.reply_fds

    def watch(self, callback: Callable[[int], None]) -> None:
        """The pool forks at its first unit (crucible.run.executors._workers): each reply fd
        is handed to ``callback`` once it exists."""
        self.pool.watch(callback)

    @property
    def in_flight(self) -> int:
        return self.pool.in_flight

    @property
    def idle(self) -> int:
        return self.pool.idle

    def submit(self, token: int, request: tuple[Any, ...]) -> None:
        self.pool.submit(token, request)

    def flush(self) -> None:
        pass  # each request was written to its worker at once

    def read(self, fd: int) -> list[Reply]:
        return self.pool.read(fd)

    def stop(self) -> None:
        self.slots.stop()

    def kill(self) -> None:
        self.slots.kill()

    def close(self) -> None:
        self.pool.close()
        if self.reaper is not None:
            # the workers are reaped: nothing is registered, the reaper exits
            # (and lets go of the state lock it holds)
            from crucible.run.executors import _procs

            _procs.watch_groups(None)
            self.reaper.close()

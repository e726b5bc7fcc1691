"""Cache hits on the scheduling thread (docs/spec/cache.md, "When a unit is keyed").

A unit is keyed from the plan and the settled records before anything is done
for it (:mod:`crucible.run.cache._keyer`), so a hit needs no workspace, no
staging, no worker and no slot: the dispatcher's own thread looks each ready
unit up in the cache's ledger (opened once per run, lookups through its on-disk
index), lays the stored files back by hard link, writes the result record and
settles the unit, all in the same turn of its loop, whose events are then
written as one batch. Only the units that miss go on to a worker, with their
key, which stages and runs them and records the ones that pass — and the hits
whose files are large, which a worker checks and restores without staging.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from crucible.core.plan import Task
from crucible.run.cache._unit import UnitCache, cacheable

if TYPE_CHECKING:  # built by the run (crucible.run.session._runner)
    from crucible.stage import StateDir

__all__ = ["INLINE_BYTES", "CacheHits", "ReadyQueue"]

#: A hit whose store files total more than this is checked (every file hashed)
#: and restored by a worker, before it stages anything: hashing them here would
#: hold up every other unit's start and settlement meanwhile.
INLINE_BYTES = 4 << 20
#: what a ledger record of the wrong shape makes the hit path raise
_BROKEN = (AttributeError, KeyError, TypeError, ValueError)


class _Unit(Protocol):
    name: str
    key: str | None
    attempt: int


class ReadyQueue(deque[Any]):
    """The dispatcher's ready queue, counting the units appended at its right end
    since the hit path last looked (``fresh``), so that each ready unit is looked
    up once, however long it then waits for a worker: rescanning every waiting
    unit on every turn would make a wide fan-out quadratic. The dispatcher
    appends at the right and pops at the left only."""

    def __init__(self) -> None:
        super().__init__()
        self.fresh = 0

    def append(self, unit: Any) -> None:
        super().append(unit)
        self.fresh += 1

    def popleft(self) -> Any:
        unit = super().popleft()
        self.fresh = min(self.fresh, len(self))
        return unit

    def clear(self) -> None:
        super().clear()
        self.fresh = 0

    def take_fresh(self) -> list[Any]:
        """Remove and return the fresh units, in the order they came."""
        n, self.fresh = self.fresh, 0
        out = [self.pop() for _ in range(n)]
        out.reverse()
        return out

    def put_back(self, units: list[Any]) -> None:
        """Append ``units`` as looked at already."""
        self.extend(units)


class CacheHits:
    """The hit path of one dispatcher session."""

    def __init__(
        self,
        directory: Path,
        *,
        state_dir: StateDir,
        tasks: Mapping[str, Task],
        environ: Mapping[str, str],
        agent_cmd: str | None,
        emit_cap: int,
        warn: Callable[[str], None],
        pack_dir: str = "",
    ) -> None:
        self.tasks = tasks
        self.warn = warn
        from crucible.run.cache._keyer import Keyer  # lazy, as UnitCache had it

        keyer = Keyer(
            state_dir.plan,
            state_dir.state,
            plan_view=state_dir.view,
            # a plain dict: every unit's key reads it (os.environ encodes each name)
            environ=dict(environ),
            agent_cmd=agent_cmd,
            emit_cap=emit_cap,
            pack_dir=pack_dir,
            cache_dir=directory,
        )
        self.cache = UnitCache(directory, keyer)
        #: units looked up already: a unit that missed is not looked up again when
        #: it comes back to the ready queue (from a task's parallelism gate)
        self._tried: set[tuple[str, str | None]] = set()
        #: keyed units on their way to a worker: their key, and whether they hit
        #: (with files too large to check on this thread)
        self._handoff: dict[tuple[str, str | None], tuple[str, Any]] = {}
        self._directory = directory
        #: the ledger the session log's writer thread appends the workers'
        #: deferred cache records to (its own: opened on that thread)
        self._recorder: Any = None

    def take(
        self,
        ready: ReadyQueue,
        settle: Callable[[Any, dict[str, Any]], None],
        *,
        stop: Callable[[], bool] | None = None,
    ) -> int:
        """Settle every fresh unit of ``ready`` that hits, through ``settle(unit,
        reply)`` (which may queue its consumers: they are looked up in the same
        pass); the units that miss stay in ``ready``, in order. Once ``stop()``
        is true (a signal: a pass over 10^5 hits takes seconds) the pass ends:
        the units not looked at stay in ``ready`` too. Returns the hits."""
        with self.cache.keyer.steady():
            return self._take(ready, settle, stop)

    def _take(
        self,
        ready: ReadyQueue,
        settle: Callable[[Any, dict[str, Any]], None],
        stop: Callable[[], bool] | None,
    ) -> int:
        hits = 0
        batch = ready.take_fresh()
        while batch:
            missed: list[Any] = []
            for i, unit in enumerate(batch):
                if stop is not None and stop():
                    ready.put_back(missed + batch[i:])
                    return hits
                reply = self._look_up(unit)
                if reply is None:
                    missed.append(unit)
                else:
                    hits += 1
                    settle(unit, reply)
            batch = ready.take_fresh()  # what those hits made ready, after the misses
            ready.put_back(missed)
        return hits

    def _look_up(self, unit: _Unit) -> dict[str, Any] | None:
        ident = (unit.name, unit.key)
        # A retry follows a failure: only passed results are cached.
        if unit.attempt != 1 or ident in self._tried:
            return None
        self._tried.add(ident)
        if not cacheable(self.tasks[unit.name]):
            return None
        cache = self.cache
        ck = cache.key(unit.name, unit.key)
        reply = None
        try:
            hit = None if ck is None else cache.find(ck)
            if hit is not None and hit.files_bytes > INLINE_BYTES:
                self._handoff[ident] = ("hit", ck)  # checked and restored there, unstaged
            elif hit is not None:
                reply = cache.restore_reply(ck, hit, unit.attempt)
        except _BROKEN as exc:  # a record of the wrong shape (a hand-edited ledger)
            self.warn(f"cache: cannot use the record of {unit.name!r}: {exc}; running it")
        if reply is None and ck is not None and ident not in self._handoff:
            self._handoff[ident] = ("key", ck)  # the worker need not key it again
        for warning in cache.take_warnings():
            self.warn(warning)
        return reply

    def handoff(self, unit: _Unit) -> tuple[str, Any] | None:
        """What a worker is told about ``unit`` (crucible.run.executors._unit): ``("hit", key)``
        to restore it there, ``("key", key)`` for a miss, None when not keyed."""
        return self._handoff.pop((unit.name, unit.key), None)

    def record_facts(self, facts: list[Any]) -> None:
        """On the session log's writer thread, once a batch is durable: append
        the cache records the workers encoded for the units it settled
        (``cache_fact`` of their replies) as one ledger batch — one write and
        one fsync for all of them, where each worker appended and fsynced its
        own under the ledger's lock (docs/spec/cache.md, "Hit, miss, and what
        is recorded"). A failure is a warning: those units miss next time."""
        if self._recorder is None:
            # lazy: run.cache._store is not loaded with this module; only record_facts() needs it
            from crucible.run.cache._store import TaskCache

            self._recorder = TaskCache(self._directory, warn=self.warn)
        try:
            self._recorder.append_facts(facts)
        except (OSError, ValueError, TypeError) as exc:
            self.warn(f"cache: cannot record {len(facts)} units: {exc}")

    def ready_queue(self) -> ReadyQueue:
        """The ready queue the dispatcher must use with this hit path."""
        return ReadyQueue()

    def close(self) -> None:
        """The lookups' ledger (the recorder is the session log's: close_recorder)."""
        self.cache.close()

    def close_recorder(self) -> None:
        """Once the session log's writer thread has ended (SessionLog.on_close)."""
        if self._recorder is not None:
            self._recorder.close()
            self._recorder = None

"""Which submitted units go to Dask together, and when (docs/spec/run.md, "Executors").

A Dask future costs the scheduler, the client and the worker about a
millisecond of CPU, more than a short task itself, so the Dask executor sends
the units of one task that wait at once as one future: a *batch*, whose units
its worker runs one after another. The window bounds the batches in flight
(each runs one task process at a time, so with ``--executor dask`` at most
``-j`` run at once there); a unit the window has no room for waits here, and
goes with the next flush after a batch left the window.

A batch is as large as the waiting units need to fill the free places (so no
place stays empty while units wait), and at most its task's batch size: that
starts at :data:`BATCH_MAX`, halves after a batch of the task handed units back
(its task ran long: the worker answered the units behind it ``handback``), and
doubles again after one whose tasks each ran less than the handback threshold
(``crucible.run.executors._unit.HANDBACK_AFTER``).
"""

from __future__ import annotations

from typing import Any

from crucible.core.structs import dataclass
from crucible.run.executors._pipelined import HANDBACK_AFTER

__all__ = ["BATCH_MAX", "Batches"]

#: the most unit attempts one future carries
BATCH_MAX = 8

Unit = tuple[int, tuple[Any, ...]]


@dataclass
class _Batch:
    task: str
    #: its tokens without a final reply yet
    left: set[int]
    handed_back: bool = False
    #: the longest its tasks ran (seconds; None: none reported one)
    longest: float | None = None


class Batches:
    """The units submitted and not sent yet, and the batches in flight."""

    def __init__(self, window: int) -> None:
        #: batches kept in flight at most
        self.window = window
        #: submitted, not sent yet (token order: tokens grow)
        self.pending: list[Unit] = []
        self._batches: dict[str, _Batch] = {}
        self._batch_of: dict[int, str] = {}
        self._size: dict[str, int] = {}

    @property
    def in_flight(self) -> int:
        """Batches sent with a token still without a final reply."""
        return len(self._batches)

    @property
    def room(self) -> int:
        """How many more units fit: full batches in every free place."""
        # never below 0: a unit sent again waits here while its old batch
        # still holds its place (and the dispatcher submits while room is truthy)
        return max(0, (self.window - len(self._batches)) * BATCH_MAX - len(self.pending))

    def size(self, task: str) -> int:
        """The size of the task's next batches."""
        return self._size.get(task, BATCH_MAX)

    def add(self, unit: Unit) -> None:
        self.pending.append(unit)

    def again(self, unit: Unit) -> None:
        """A sent unit to send again (its token leaves its batch)."""
        self.leave(unit[0])
        self.pending.append(unit)
        self.pending.sort(key=lambda u: u[0])

    def take(self) -> dict[str, list[list[Unit]]]:
        """What to send now, by task: as many batches as the window has room
        for (see the module doc); what does not fit stays pending. The caller
        names each and says so with :meth:`sent`."""
        free = self.window - len(self._batches)
        if not self.pending or free <= 0:
            return {}
        size = -(-len(self.pending) // free)  # ceil
        by_task: dict[str, list[Unit]] = {}
        for unit in self.pending:
            by_task.setdefault(unit[1][1], []).append(unit)
        batches: dict[str, list[list[Unit]]] = {}
        held: list[Unit] = []
        for task, units in by_task.items():
            step = max(1, min(size, self.size(task)))
            for at in range(0, len(units), step):
                if free <= 0:
                    held.extend(units[at:])
                    break
                batches.setdefault(task, []).append(units[at : at + step])
                free -= 1
        self.pending = sorted(held, key=lambda u: u[0])
        return batches

    def sent(self, key: str, task: str, tokens: list[int]) -> None:
        self._batches[key] = _Batch(task, set(tokens))
        for token in tokens:
            self._batch_of[token] = key

    def leave(self, token: int, handed_back: bool = False, ran: float | None = None) -> None:
        """``token`` got its final reply (``handed_back``: a handback; ``ran``:
        how long its task ran), or is sent again. A batch with no token left
        frees its place in the window and sets its task's next batch size."""
        key = self._batch_of.pop(token, None)
        if key is None or (batch := self._batches.get(key)) is None:
            return
        batch.handed_back = batch.handed_back or handed_back
        if ran is not None:
            batch.longest = ran if batch.longest is None else max(batch.longest, ran)
        batch.left.discard(token)
        if batch.left:
            return
        del self._batches[key]
        size = self.size(batch.task)
        if batch.handed_back:
            self._size[batch.task] = max(1, size // 2)
        elif batch.longest is not None and batch.longest < HANDBACK_AFTER:
            self._size[batch.task] = min(BATCH_MAX, size * 2)

    def drain(self) -> list[int]:
        """The tokens never sent, now forgotten (stopping: not started)."""
        tokens = [token for token, _ in self.pending]
        self.pending.clear()
        return tokens

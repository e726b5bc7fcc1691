"""``parallelism = N``: at most N units of one mapped task in flight at once.

A unit is in flight from the moment the scheduling thread hands it to a worker
until the worker's final reply (staging, the task process, capture), so at most
N of the task's processes run at once, whatever ``-j`` allows (Argo's
``parallelism``, GitHub's ``max-parallel``). Units over the limit wait here, in
order, and go back to the ready queue one per finished unit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Generic, TypeVar

from crucible.core.plan import Task

__all__ = ["ParallelismGate"]

U = TypeVar("U")


class ParallelismGate(Generic[U]):
    def __init__(self, tasks: Mapping[str, Task]) -> None:
        self.limits = {n: t.parallelism for n, t in tasks.items() if t.parallelism is not None}
        self.active = dict.fromkeys(self.limits, 0)
        self.held: dict[str, deque[U]] = {n: deque() for n in self.limits}

    def take(self, name: str, unit: U) -> bool:
        """True: hand ``unit`` to a worker now. False: it waits here."""
        limit = self.limits.get(name)
        if limit is None:
            return True
        if self.active[name] < limit:
            self.active[name] += 1
            return True
        self.held[name].append(unit)
        return False

    def release(self, name: str) -> U | None:
        """A unit of ``name`` is no longer in flight: the next waiting one, if any."""
        if name not in self.limits:
            return None
        self.active[name] -= 1
        held = self.held[name]
        return held.popleft() if held else None

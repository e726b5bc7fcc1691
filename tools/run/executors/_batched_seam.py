"""The executor seam's bookkeeping shared by the executors that send batches
of units to a cluster (crucible.run.executors.dask._executor, crucible.run.executors.slurm._executor):
units held until ``flush`` groups them, one wake-up pipe for their replies, and
``--follow`` tailing their logs on the shared state."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from crucible.run.executors._log_tail import LogTailer
from crucible.run.executors._workers import Reply
from crucible.run.executors.dask._batches import Batches

__all__ = ["BatchedSeam"]


class BatchedSeam:
    """``submit``, ``in_flight``, ``idle``, ``reply_fds`` and ``peak_rss_kib``
    of the Executor protocol (crucible.run.executors._seam) for an executor that
    sets these attributes in its constructor."""

    #: units submitted and not yet answered, by token
    _live: dict[int, Any]
    #: each live unit's request, by token (to answer it, or send it again)
    _requests: dict[int, tuple[Any, ...]]
    batches: Batches
    _tailer: LogTailer | None
    _log_path: Callable[[str, str | None], Any]
    #: the read end the dispatcher polls; written when replies arrived
    _wake_r: int
    #: where each started unit runs (a worker's address, a node), by token
    _started: dict[int, str]

    @property
    def peak_rss_kib(self) -> int:
        return 0  # no local helper processes (the workers or jobs are the cluster's)

    @property
    def reply_fds(self) -> list[int]:
        return [self._wake_r]

    @property
    def in_flight(self) -> int:
        return len(self._live)

    @property
    def idle(self) -> int:
        return self.batches.room

    def submit(self, token: int, request: tuple[Any, ...]) -> None:
        # Held until flush: the units of one fill go out together (one Dask
        # graph, one sbatch array), not one per unit.
        self._live[token] = None
        self._requests[token] = request
        self.batches.add((token, request))
        if self._tailer is not None:
            _, name, key = request[:3]
            self._tailer.add(token, self._log_path(name, key), name, key)

    def _drain_wake(self) -> None:
        """Empty the wake-up pipe: its bytes only say that replies are queued."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass

    def _heard_start(self, token: int, worker: str, payload: Any, replies: list[Reply]) -> bool:
        """A unit's start, the first time it is heard (a start may be heard
        twice): where it runs, and its interim reply. False: heard before."""
        if token in self._started:
            return False
        self._started[token] = worker
        replies.append(Reply(token, "interim", payload))
        return True

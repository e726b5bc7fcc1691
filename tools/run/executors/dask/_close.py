"""A Dask worker that closes stops the run's units there first.

A worker closes while it runs units when a batch system ends it: dask-jobqueue
starts workers as SLURM/PBS jobs with ``--lifetime`` below the job's walltime,
and a worker that reaches it retires (``Worker.close_gracefully``). The
scheduler then fails the futures the worker held (``KilledWorker``: the
dispatcher retries their units, crucible.run.executors.dask._executor), but the worker's
threads would run each unit's task to its end before the process exits: the
unit would have run twice, once on the retiring worker and once again where
the dispatcher retried it. This plugin's ``teardown``, which ``Worker.close``
calls before it waits for its threads, stops the run's units on that worker
as the dispatcher's stop does (SIGTERM to each task's group, SIGKILL after the
kill grace): a retired worker's units are retried, none runs to its end twice.

Imported only where Dask is (by the executor, and by the workers when they
unpickle the plugin).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

__all__ = ["StopOnClose"]


class StopOnClose(WorkerPlugin):  # type: ignore[misc]
    """Registered on every worker for one run (name: ``crucible-close-RUN``)."""

    def __init__(self, run_id: str, stop: Callable[[str], None]) -> None:
        self.run_id = run_id
        #: stops the run's units on this worker (the executor's ``stop_on_worker``,
        #: pickled by reference: this module never imports the executor's)
        self.stop = stop

    def teardown(self, worker: Any) -> None:
        self.stop(self.run_id)

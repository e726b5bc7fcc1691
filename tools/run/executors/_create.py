"""Which executor a run uses: the one branch per executor that the seam
(:mod:`crucible.run.executors._seam`) promises. Apart from the seam so that an
executor's module may import the seam's types without a circle; the Dask and
SLURM executors are imported only by a run that names them (their imports are
heavy)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from crucible.run._options import RunOptions
from crucible.run.executors._environ import workspace_marker
from crucible.run.executors._seam import Executor, LocalExecutor
from crucible.run.executors._slots import Slots
from crucible.run.executors._unit import UnitRunner
from crucible.run.executors._workers import Channel, WorkerPool

__all__ = ["create"]


def create(
    options: RunOptions,
    *,
    jobs: int,
    slots: Slots,
    runner: UnitRunner,
    serve: Callable[[Any, Channel], Any],
    lock: Any = None,
    warn: Callable[[str], None] | None = None,
) -> Executor:
    """The executor ``options.executor`` names. The local one forks its workers
    at its first unit (a fully cached run forks none: crucible.run.executors._workers)."""
    if options.executor == "local":
        # one pipelined worker per slot (crucible.run.executors._unit.UnitRunner.serve):
        # each stages its next unit while its task runs
        from crucible.run.executors import _procs
        from crucible.run.executors._reaper import Reaper
        from crucible.run.session._admit import worker_count

        # The workers and the dispatcher are one process group, the tasks each
        # their own session: a SIGKILL of the group would orphan the running
        # tasks. A reaper (in a session of its own) started before the workers
        # fork kills them then, and holds the state lock (``lock``) until they
        # are dead: docs/spec/run.md, "Orphans".
        reaper = Reaper(
            options.kill_grace,
            (lock.fileno(),) if lock is not None else (),
            marker=workspace_marker(options.state),
        )

        def start_reaper() -> None:
            reaper.start()
            _procs.watch_groups(reaper)

        pool = WorkerPool(
            worker_count(jobs), serve, lazy=True, inbox_loop=runner.serve, before_fork=start_reaper
        )
        return LocalExecutor(pool, slots, reaper)
    if options.executor == "slurm":
        # lazy: run.executors.slurm._executor is not loaded with this module; only create() needs it
        from crucible.run.executors.slurm._executor import SlurmExecutor

        return SlurmExecutor(options, jobs=jobs, runner=runner)
    # lazy: run.executors.dask._executor is not loaded with this module; only create() needs it
    from crucible.run.executors.dask._executor import DaskExecutor

    return DaskExecutor(options, jobs=jobs, runner=runner, warn=warn)

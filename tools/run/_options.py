"""The options of one dispatcher run, built once at the command edge."""

from __future__ import annotations

from pathlib import Path

from crucible.core.structs import dataclass

#: the most task slots (-j) a run may ask for (run.md); here, not in admit, so
#: the command line reads it without importing admission at start-up
JOBS_MAX = 256

__all__ = ["JOBS_MAX", "RunOptions"]


@dataclass(frozen=True)
class RunOptions:
    """Everything one run was asked for (run/_click_cli.py's options, and
    library callers' ``run_plan``), built once at the command edge."""

    plan: Path
    state: Path
    params_file: str | None = None
    #: raw ``NAME=VALUE`` texts of ``-p``, in command-line order
    params: tuple[str, ...] = ()
    #: tasks run at once; None = CPU count
    jobs: int | None = None
    #: shell command line of the agent stand-in (run with ``sh -c``)
    agent_cmd: str | None = None
    #: per-field cap on declared emits; None = $CRUCIBLE_EMIT_CAP or 65,536
    emit_cap: str | int | None = None
    resume: bool = False
    #: with ``resume``: failed and skipped units, and everything downstream, run again
    retry_failed: bool = False
    #: start over in a state dir that holds a run (the old one moves to STATE.prev)
    fresh: bool = False
    #: ``--reuse``: start over as ``fresh``, reusing every unit of the earlier
    #: run whose cache key did not change (docs/spec/cache.md, "After an edit")
    reuse: bool = False
    #: print what would run and why; run nothing, write nothing
    dry_run: bool = False
    #: run only these tasks and their ancestors (empty: every task)
    targets: tuple[str, ...] = ()
    #: stop starting units after the first failure; terminate the running ones
    fail_fast: bool = False
    #: stream every task's output lines to this callback's stream, prefixed
    follow: bool = False
    #: ``--keep-workspaces``: no workspace is recycled (run.md, "State directory")
    keep_workspaces: bool = False
    #: mirror the session log to this file, or ``-`` for stdout
    events: str | None = None
    #: show the live progress display (the CLI sets this when stderr is a TTY)
    progress: bool = False
    #: first retry waits this many seconds, doubling per attempt (capped at 30 s)
    backoff: float = 0.5
    #: after SIGTERM to a task's group, wait this long before SIGKILL
    kill_grace: float = 3.0
    #: ``--outputs -|FILE``: also write STATE/outputs.json there at the end
    outputs: str | None = None
    #: ``--publish-dir DIR``: publish ``[workflow.publish]`` files there at the end
    publish_dir: Path | None = None
    #: ``--cache DIR``: the task cache (docs/spec/cache.md); None = off
    cache: Path | None = None
    #: ``--sandbox``: every task runs sandboxed (docs/spec/cache.md, "The sandbox")
    sandbox: bool = False
    #: ``--executor``: ``local`` (forked workers), ``dask`` (a running cluster at
    #: ``scheduler``), ``dask-local`` (a LocalCluster for the run) or ``slurm`` (job
    #: arrays through sbatch); see run/executors/_seam.py
    executor: str = "local"
    #: ``--scheduler tcp://HOST:PORT`` (``--executor dask``)
    scheduler: str | None = None
    #: ``--workers N`` (``--executor dask-local``); None = min(-j, CPU count)
    workers: int | None = None
    #: ``--threads-per-worker`` (``--executor dask-local``); None = its share of
    #: -j plus its share of the units staged ahead (dask_executor.local_layout)
    threads_per_worker: int | None = None
    #: ``--enforce-memory``: a task's ``resources.memory`` is its RLIMIT_DATA
    #: (crucible.run.executors._usage.memory_limit_argv)
    enforce_memory: bool = False
    #: ``--slurm-partition``, ``--slurm-account``, ``--slurm-qos``, ``--slurm-extra``
    #: (``--executor slurm``; run/executors/slurm/_executor.py)
    slurm_partition: str | None = None
    slurm_account: str | None = None
    slurm_qos: str | None = None
    slurm_extra: str | None = None
    #: ``--actor NAME``: who asserts an accounted run's selections and retries
    #: (docs/spec/export.md §4); None = the login name
    actor: str | None = None

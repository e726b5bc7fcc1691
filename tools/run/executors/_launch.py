"""Starting one attempt's process with its pipes: the one spelling shared by the
local unit runner (crucible.run.executors._unit) and a Dask worker's (crucible.run.executors.dask._executor),
which only wraps it (its threads start tasks one at a time, and its reaper
watches each task's group)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crucible.run.executors._agent_io import AgentStdout
from crucible.run.executors._procs import TaskProcess, spawn

if TYPE_CHECKING:
    from crucible.run.executors._sandbox import SandboxSpec

__all__ = ["Launched", "launch", "serialised"]

#: the started task, its stdout+stderr pipe's read end (non-blocking), an agent's stdout
Launched = tuple[TaskProcess, int, AgentStdout | None]


def launch(
    argv: list[str],
    env: dict[str, str],
    workspace: Path,
    timeout: Any,
    stdin: str,
    agent: bool,
    sandbox: SandboxSpec | None = None,
) -> Launched:
    """Start the task with stdout+stderr on a pipe (an agent's stdout on a
    second one); return it, the pipe's read end (non-blocking) and the
    agent's stdout."""
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    resp_r, resp_w = os.pipe2(os.O_CLOEXEC) if agent else (-1, -1)
    try:
        now = time.monotonic()
        proc = spawn(
            argv,
            env=env,
            cwd=workspace,
            log_fd=out_w,
            started=now,
            deadline=None if timeout is None else now + float(timeout),
            stdin=stdin,
            stdout_fd=resp_w if agent else None,
            sandbox=sandbox,
        )
    except BaseException:
        os.close(out_r)
        if agent:
            os.close(resp_r)
        raise
    finally:
        os.close(out_w)
        if agent:
            os.close(resp_w)
    os.set_blocking(out_r, False)
    if not agent:
        return proc, out_r, None
    os.set_blocking(resp_r, False)
    return proc, out_r, AgentStdout(resp_r)


def serialised(
    lock: AbstractContextManager[Any], started: Callable[[int], None]
) -> Callable[..., Launched]:
    """:func:`launch` (same arguments) holding ``lock``, handing each started
    pid to ``started`` before the lock is released (so no start is missed by
    whoever watches)."""

    def launch_serialised(*args: Any, **kwargs: Any) -> Launched:
        with lock:
            launched = launch(*args, **kwargs)
            started(launched[0].pid)
        return launched

    return launch_serialised

"""An attempt between its phases (crucible.run.executors._unit): staged, then started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crucible.core.plan import Task
from crucible.core.structs import dataclass
from crucible.run.executors._agent_io import AgentStdout
from crucible.run.executors._procs import TaskProcess
from crucible.run.executors._tasklog import LogSink

__all__ = ["Staged", "Started", "not_started"]


@dataclass
class Staged:
    """A unit attempt made ready to start (crucible.run.executors._unit.UnitRunner.begin)."""

    name: str
    key: str | None
    attempt: int
    task: Task
    workspace: Path
    output: Path
    staged_env: dict[str, str] | None
    prepared: dict[str, Any]
    cache_key: Any
    #: a scored loop's time budget (wall clock), as [when] or []
    stop_by: list[Any]


@dataclass
class Started:
    """A started attempt (crucible.run.executors._unit.UnitRunner.start)."""

    staged: Staged
    proc: TaskProcess
    out_r: int
    agent_out: AgentStdout | None
    sink: LogSink
    #: the producer units whose files it holds (None: look them up)
    held: Any


def not_started(staged: Staged) -> dict[str, Any]:
    """Stopping: a staged unit is not started and stays unsettled."""
    return {"kind": "not_started", "staged_env": staged.staged_env}

"""A unit with nothing to stage (docs/spec/inputs.md 3.7): no ``inputs/`` tree.

A command or evaluate task (IR v2) that declares no inputs, is handed no
ancestor's files and has no reserved input but an empty ``params`` object gets
no ``inputs/`` tree in its workspace: what it would hold (an empty params
object and an index listing it) says nothing the task can use, and costs three
inodes per unit, two of them directories (the most expensive thing a no-op
task makes on ext4). ``CRUCIBLE_INPUTS_DIR`` names instead one shared, empty,
read-only directory per state, ``STATE/shared/@empty``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from crucible.core.errors import OperationalError
from crucible.core.fsio import clear_path
from crucible.stage._plan import PlanView, TaskView

__all__ = [
    "EMPTY_VALUES",
    "drop_old_tree",
    "empty_values_dir",
    "may_stage_nothing",
    "nothing_to_stage",
]

#: under STATE/shared (stage's own; '@' names never collide with a task's)
EMPTY_VALUES = "@empty"

#: states whose empty directory this process already made
_made: set[str] = set()


def nothing_to_stage(pv: PlanView, t: TaskView, reserved: dict[str, Any]) -> bool:
    """True for a unit whose staged tree would hold only ``params = {}``."""
    if not may_stage_nothing(pv, t.name):
        return False
    return not any(name != "params" for name in reserved) and reserved.get("params") == {}


def may_stage_nothing(pv: PlanView, task: str) -> bool:
    """What :func:`nothing_to_stage` asks of the plan alone (IR v2 or later, a
    command or evaluate task, no declared inputs, no ancestor's files), once
    per task: False, and a unit of ``task`` always has something to stage."""
    memo = pv.memo.setdefault("may_stage_nothing", {})
    found: bool | None = memo.get(task)
    if found is None:
        t = pv.tasks[task]
        found = (
            pv.version >= 2
            and t.kind in ("command", "evaluate")
            and not t.model.inputs
            and not pv.file_ancestors(task)
        )
        memo[task] = found
    return found


def empty_values_dir(state: Path) -> Path:
    """``STATE/shared/@empty``: created once (mode 0555), never written."""
    path = Path(state).absolute() / "shared" / EMPTY_VALUES
    key = str(path)
    if key in _made:
        return path
    try:
        os.makedirs(path, exist_ok=True)
        if os.lstat(path).st_mode & 0o777 != 0o555:
            os.chmod(path, 0o555)
    except OSError as exc:
        raise OperationalError(
            f"cannot create the empty inputs directory: {exc.strerror or exc}", where=key
        ) from None
    _made.add(key)
    return path


def drop_old_tree(inputs_dir: Path) -> None:
    """A tree an earlier staging left (before the unit had nothing to stage, or
    by an older version) is removed, so the workspace holds no stale inputs."""
    clear_path(inputs_dir)

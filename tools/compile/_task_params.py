"""A task's ``params`` key (edition 4): the params it may read.

Only the listed params are staged for the task, offered to its ``when`` and
part of its cache key (docs/spec/cache.md), so a change of another param does
not rerun it. Here, across tasks: every listed name is a declared param, and
a ``when`` or a ``map``/matrix source of the task reads only listed params.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from crucible.compile._checker import Checker
from crucible.compile._diagnostics import KeyPath
from crucible.compile._sequences import sequence_params

__all__ = ["check_task_params"]


def _fanout_reads(task: Mapping[str, Any], path: KeyPath) -> list[tuple[str, KeyPath]]:
    """(param, where) for each param the task's map or matrix axes read (a
    sequence's bounds too)."""
    out: list[tuple[str, KeyPath]] = []
    sources: list[tuple[Any, KeyPath]] = [(task.get("map"), (*path, "map"))]
    matrix = task.get("matrix")
    if isinstance(matrix, dict):
        for axis in matrix.get("axes", ()):
            sources.append((axis.get("source"), (*path, "matrix", axis["name"])))
    for src, where in sources:
        if isinstance(src, dict) and isinstance(src.get("param"), str):
            out.append((src["param"], where))
        elif isinstance(src, dict) and isinstance(src.get("sequence"), dict):
            out.extend((name, (*where, key)) for key, name in sequence_params(src["sequence"]))
    return out


def _when_reads(task: Mapping[str, Any]) -> list[tuple[str, int, int]]:
    """(param, line, col) for each ``params.X`` the task's ``when`` reads."""
    # lazy: compile._conditions is not loaded with this module; only _when_reads() needs it
    from crucible.compile._conditions import condition_reads, parse_condition

    when = task.get("when")
    if when is None:
        return []
    tree = parse_condition(when)
    if isinstance(tree, str):  # reported by the structural pass
        return []
    return [
        (r.parts[1], r.line, r.col)
        for r in condition_reads(tree)
        if r.parts[0] == "params" and len(r.parts) > 1
    ]


def check_task_params(
    chk: Checker,
    declared: Mapping[str, Any],
    tasks: Sequence[Mapping[str, Any]],
    paths: Sequence[KeyPath],
) -> None:
    for task, path in zip(tasks, paths, strict=True):
        listed = task.get("params")
        if listed is None:
            continue
        name = task["name"]
        for i, param in enumerate(listed):
            if param not in declared:
                known = ", ".join(sorted(declared)) or "none"
                chk.error(
                    "task-params-unknown",
                    (*path, "params", i),
                    f"task {name!r} lists param {param!r}, which is not declared "
                    f"in [workflow.params] (declared: {known})",
                )
        for param, where in _fanout_reads(task, path):
            if param in declared and param not in listed:
                chk.error(
                    "task-params-unread",
                    where,
                    f"task {name!r} fans out over params.{param}, which its params "
                    f"key does not list; add {param!r} to params",
                )
        for param, line, col in _when_reads(task):
            if param in declared and param not in listed:
                chk.error(
                    "task-params-unread",
                    (*path, "when"),
                    f"when of task {name!r} at {line}:{col}: params.{param} is not "
                    f"in the task's params; add {param!r} to params",
                )

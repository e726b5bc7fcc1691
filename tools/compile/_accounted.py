"""Accounted packs (docs/spec/export.md §1–§3): ``[workflow.limits]``, the stage-tree
shape their tasks must have, and the workflow record the plan carries.

A pack that declares ``[workflow.limits]`` is accounted: dispatch keeps RFC 0024's
accounting while it runs, so its tasks must map onto a workflow record (one root,
every other task mapping over the root's one output field). Everything the record
cannot state is refused here, each with a located diagnostic naming the rule.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from crucible.compile._checker import Checker, type_name
from crucible.compile._diagnostics import KeyPath

__all__ = [
    "LIMIT_DEFAULTS",
    "LIMIT_KEYS",
    "camel_limits",
    "check_accounted",
    "check_limits",
    "check_plan_accounting",
    "record_stages",
]

#: ``[workflow.limits]`` keys (RFC 0024's bounds, workflow.md §2) and their defaults (ours)
LIMIT_DEFAULTS: dict[str, int] = {
    "max_bytes": 1 << 30,
    "max_files": 1 << 20,
    "max_instances": 65536,
    "max_attempts": 16,
    "max_records": 65536,
    "max_case_bytes": 1 << 20,
    "max_payload_bytes": 1 << 20,
}
LIMIT_KEYS: tuple[str, ...] = tuple(LIMIT_DEFAULTS)
_MAX_SAFE = (1 << 53) - 1
_STAGE_RE = re.compile(r"\A[a-z][a-z0-9-]{0,31}\Z")

#: task keys an accounted pack refuses, when set to something but their default
_REFUSED_KEYS: dict[str, str] = {
    "join": "a settled join reads several producers' outcomes",
    "epilogue": "an epilogue reads the run's outcome",
    "matrix": "a matrix expands without a producer's record",
    "when": "a condition settles a task without an attempt",
    "retry": "an automatic retry is an attempt no actor asserted",
    "retries": "an automatic retry is an attempt no actor asserted",
    "on_failure": "a tolerated failure is not a record state",
    "allow_exit": "a tolerated exit is not a record state",
    "cache": "a cache hit is an attempt that never ran",
    "emits_files": "captured files are bytes outside the record",
}
#: the value of a refused key that means "not used"
_UNUSED: dict[str, Any] = {
    "join": "all",
    "epilogue": False,
    "retries": 0,
    "emits_files": [],
}


def camel_limits(limits: Mapping[str, int]) -> dict[str, int]:
    """``max_bytes`` → ``maxBytes``: the workflow record's spelling (workflow.md §2)."""
    out: dict[str, int] = {}
    for key in LIMIT_KEYS:
        head, *rest = key.split("_")
        out[head + "".join(p.capitalize() for p in rest)] = limits[key]
    return out


def check_limits(chk: Checker, path: KeyPath, raw: Any) -> dict[str, int] | None:
    """``[workflow.limits]`` → every bound, defaults filled in (None after an error)."""
    if not isinstance(raw, dict):
        chk.wrong_type(path, raw, "[workflow.limits] must be a table")
        return None
    ok = True
    limits = dict(LIMIT_DEFAULTS)
    for key, value in raw.items():
        if key not in LIMIT_DEFAULTS:
            chk.error(
                "unknown-key",
                (*path, key),
                f"unknown key {key!r} in [workflow.limits] (known: {', '.join(LIMIT_KEYS)})",
            )
            ok = False
        elif type(value) is not int or not 1 <= value <= _MAX_SAFE:
            chk.error(
                "bad-limit",
                (*path, key),
                f"{key} must be a positive integer (at most 2^53-1), not {_shown(value)}",
            )
            ok = False
        else:
            limits[key] = value
    return limits if ok else None


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return repr(value) if isinstance(value, str) else str(value)
    return type_name(value)


def _pointer(field: str) -> str:
    return "/" + field.replace("~", "~0").replace("/", "~1")


def _source(task: Mapping[str, Any]) -> tuple[str, str] | None:
    """(producer, field) of a ``map = "<task>.<field>"``; None for any other source."""
    src = task.get("map")
    if not isinstance(src, str) or "." not in src or src.startswith("params."):
        return None
    producer, field = src.split(".", 1)
    return producer, field


def check_accounted(
    chk: Checker,
    workflow: dict[str, Any],
    tasks: list[dict[str, Any]],
    paths: list[KeyPath],
    has_loop: bool,
) -> None:
    """Check an accounted pack's shape; on success put ``record`` in ``workflow``."""
    before = len(chk.diagnostics)
    if has_loop:
        chk.error(
            "accounted-key",
            ("loop",),
            "an accounted pack ([workflow.limits]) has no [loop]: a revision loop is not a "
            "workflow record stage tree",
        )
    name = workflow.get("name", "")
    if not 1 <= len(name) <= 128 or any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        chk.error(
            "accounted-name",
            ("workflow", "name"),
            "an accounted pack's name must be 1-128 characters without control characters "
            "(it is the workflow record's name)",
        )
    order = {t["name"]: i for i, t in enumerate(tasks)}
    roots = [i for i, t in enumerate(tasks) if "map" not in t]
    if not roots:
        chk.error(
            "accounted-root",
            ("workflow", "task"),
            "an accounted pack needs exactly one task without map (the root stage); every "
            "task here is mapped",
        )
    for i in roots[1:]:
        chk.error(
            "accounted-root",
            paths[i],
            f"task {tasks[i]['name']!r} has no map, but {tasks[roots[0]]['name']!r} is already "
            "the root: an accounted pack has exactly one root task; every other task maps "
            "over the root's output field",
        )
    root = tasks[roots[0]]["name"] if roots else None
    fields: dict[str, str] = {}
    for i, task in enumerate(tasks):
        _check_task(chk, task, paths[i], i, root, order, tasks, fields)
    if len(chk.diagnostics) == before:
        workflow["record"] = record_stages(tasks)


def _check_task(
    chk: Checker,
    task: dict[str, Any],
    path: KeyPath,
    index: int,
    root: str | None,
    order: Mapping[str, int],
    tasks: list[dict[str, Any]],
    fields: dict[str, str],
) -> None:
    name = task["name"]
    if not _STAGE_RE.match(name):
        chk.error(
            "accounted-name",
            (*path, "name"),
            f"task {name!r}: an accounted pack's task names are stage names "
            "(^[a-z][a-z0-9-]{0,31}$)",
        )
    for key, why in _REFUSED_KEYS.items():
        if key in task and task[key] != _UNUSED.get(key, object()):
            chk.error(
                "accounted-key",
                (*path, key),
                f"task {name!r}: {key!r} is refused in an accounted pack ({why})",
            )
    if "map" not in task:
        if task.get("needs"):
            chk.error(
                "accounted-root",
                (*path, "needs"),
                f"task {name!r} is the root stage: it needs nothing",
            )
        return
    src = _source(task)
    if src is None or src[0] not in order or order[src[0]] >= index:
        chk.error(
            "accounted-map",
            (*path, "map"),
            f"task {name!r}: an accounted task maps over an earlier task's output field "
            '(map = "<task>.<field>"), not a literal, a range or a param',
        )
        return
    producer, field = src
    if producer != root:
        chk.error(
            "accounted-fanout",
            (*path, "map"),
            f"task {name!r} maps over {producer!r}, which is mapped itself: in an accounted "
            f"pack every mapped task maps over the root task {root!r}",
        )
        return
    if field not in tasks[order[producer]].get("emits", {}):
        chk.error(
            "accounted-map",
            (*path, "map"),
            f"task {name!r}: {producer!r} declares no emits field {field!r} to map over",
        )
        return
    if fields.setdefault(producer, field) != field:
        chk.error(
            "accounted-field",
            (*path, "map"),
            f"task {name!r} maps over {producer}.{field}, but another task maps over "
            f"{producer}.{fields[producer]}: a stage has one output field",
        )
    if set(task.get("needs", ())) - {producer}:
        chk.error(
            "accounted-map",
            (*path, "needs"),
            f"task {name!r}: an accounted task needs only the task it maps over ({producer!r})",
        )
    if task.get("inputs"):
        chk.error(
            "accounted-inputs",
            (*path, "inputs"),
            f"task {name!r}: an accounted mapped task declares no inputs (its case is its item)",
        )


def record_stages(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The workflow record's ``stages`` of a checked accounted pack (export.md §3)."""
    mapped: dict[str, str] = {}
    for t in tasks:
        src = _source(t)
        if src is not None:
            mapped[src[0]] = src[1]
    stages = []
    for t in tasks:
        src = _source(t)
        name = t["name"]
        field = mapped.get(name)
        stages.append(
            {
                "name": name,
                "input": {
                    "fromStage": None if src is None else src[0],
                    "fields": None,
                    "admitMaxBytes": None,
                },
                "output": {
                    "pointer": "" if field is None else _pointer(field),
                    "cardinality": "one" if field is None else "many",
                },
            }
        )
    return stages


def check_plan_accounting(
    chk: Checker, workflow: dict[str, Any], tasks: list[dict[str, Any]]
) -> None:
    """A plan's ``limits`` and ``record`` (v3): together, and exactly what compiling
    gives (normal form)."""
    has_limits, has_record = "limits" in workflow, "record" in workflow
    if not has_limits and not has_record:
        return
    if has_limits != has_record:
        chk.error(
            "not-normal-form",
            ("workflow", "limits" if has_limits else "record"),
            "an accounted plan carries both workflow limits and workflow record",
        )
        return
    before = len(chk.diagnostics)
    limits = check_limits(chk, ("workflow", "limits"), workflow["limits"])
    if len(chk.diagnostics) > before:
        return
    if limits != workflow["limits"]:
        chk.error(
            "not-normal-form",
            ("workflow", "limits"),
            "workflow limits are not in normal form (every bound, defaults written out)",
        )
        return
    probe: dict[str, Any] = {"name": workflow.get("name", "")}
    paths: list[KeyPath] = [("tasks", i) for i in range(len(tasks))]
    check_accounted(chk, probe, tasks, paths, has_loop=False)
    if len(chk.diagnostics) == before and probe.get("record") != workflow["record"]:
        chk.error(
            "not-normal-form",
            ("workflow", "record"),
            "workflow record is not the one the plan's tasks give (docs/spec/export.md §3)",
        )

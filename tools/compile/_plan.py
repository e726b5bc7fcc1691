"""The plan IR: build it, serialize it canonically, and read plan files strictly."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson

from crucible.compile._checker import Checker, check_params, type_name
from crucible.compile._diagnostics import FileLocator, ValidationFailed
from crucible.compile._editions import (
    PLAN_TASK_KEYS,
    TYPES,
    check_edition,
    check_version,
    ir_version_for,
)
from crucible.compile._rules import check_graph, check_names
from crucible.compile._shape import check_task
from crucible.core import canon, digest
from crucible.core.errors import Location
from crucible.core.fsio import read_named
from crucible.core.plan import Plan
from crucible.core.structs import dataclass, field

__all__ = [
    "CompiledPlan",
    "build_plan",
    "canonical_bytes",
    "finish",
    "load_plan_bytes",
    "load_plan_path",
]

#: task members only IR v3 has: their values are arbitrary numbers, unlike v1/v2's
_V3_ONLY = PLAN_TASK_KEYS[3] - PLAN_TASK_KEYS[2]
_PLAN_KEYS = ("version", "edition", "workflow", "tasks")
#: plan members of IR v3 (edition 4), present only when the manifest had the table
_PLAN_KEYS_V3 = ("loop",)
_WORKFLOW_KEYS = ("name", "description", "params", "resolved_from")
#: workflow keys of IR v3 (edition 4), omitted when empty
_WORKFLOW_KEYS_V3 = ("outputs", "publish", "limits", "record")
_INPUT_KEYS = ("from", "producer", "field", "type")
_REQUIRED_TASK_KEYS = (
    "name",
    "kind",
    "needs",
    "join",
    "emits",
    "emits_files",
    "retries",
    "epilogue",
)


@dataclass(frozen=True)
class CompiledPlan:
    """A checked plan: its typed ``model`` (what a run reads: crucible.core.plan),
    the JSON-shaped ``plan`` it was built from, its canonical bytes and digest."""

    plan: dict[str, Any]
    model: Plan
    data: bytes
    digest: str
    warnings: list[str] = field(default_factory=list)

    @property
    def version(self) -> int:
        return self.model.version

    @property
    def edition(self) -> int:
        return self.model.edition


def build_plan(
    edition: int,
    workflow: dict[str, Any],
    tasks: list[dict[str, Any]],
    loop: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The plan object; the IR version comes from :func:`ir_version_for` only.
    ``loop`` (IR v3, the scored loop) is a member only when the manifest has one."""
    plan: dict[str, Any] = {
        "version": ir_version_for(edition),
        "edition": edition,
        "workflow": workflow,
        "tasks": tasks,
    }
    if loop is not None:
        plan["loop"] = loop
    return plan


def finish(plan: dict[str, Any], warnings: list[str] | None = None) -> CompiledPlan:
    """The compiled plan of ``plan``, which passed every check: its model is built
    here, once, without checking each member again (its bytes are the model's:
    tests/compile/test_golden.py)."""
    data = canonical_bytes(plan)
    model = Plan.from_json(plan, checked=True)
    return CompiledPlan(plan, model, data, digest.of_bytes(data), list(warnings or []))


def canonical_bytes(plan: dict[str, Any]) -> bytes:
    """``canon.dumps(plan)``, skipping its whole-value walk when the plan is known safe.

    A compiled plan is already inside the canonical domain (every value was checked),
    and orjson's sorted output equals RFC 8785 unless the value holds a float or an
    object key at or above U+E000 (canon.py). Outside the params' defaults, the only
    float a plan can hold is a task ``timeout`` and every key is ASCII (member names
    and identifiers), so only those need looking at; anything else takes the exact
    path. Tests compare the two on every pack and on fuzzed plans.
    """

    if any(type(t.get("timeout")) is float for t in plan["tasks"]) or not _plain_json(
        plan["workflow"]["params"]
    ):
        return canon.dumps(plan)
    if plan["version"] >= 3:
        # Edition 4's members hold the author's values (retry delays, deadlines,
        # literal fan-out items, matrix entries, outputs and publish paths), any
        # of which may be a float or a high key: the exact path, always.
        return canon.dumps(plan)
    return orjson.dumps(plan, option=orjson.OPT_SORT_KEYS)


def _plain_json(value: Any) -> bool:
    """No float and no key at or above U+E000 anywhere inside ``value``."""
    stack = [value]
    while stack:
        v = stack.pop()
        if type(v) is float:
            return False
        if type(v) is dict:
            if any(k and max(k) >= "\ue000" for k in v):
                return False
            stack.extend(v.values())
        elif type(v) is list:
            stack.extend(v)
    return True


def load_plan_path(path: Path) -> CompiledPlan:
    """Read a plan file (``-`` for stdin) and check it strictly."""
    name = str(path)
    if name == "-":
        return load_plan_bytes(sys.stdin.buffer.read(), "<stdin>")
    return load_plan_bytes(
        read_named(path, name, directory="is a directory, not a plan file"), name
    )


def load_plan_bytes(data: bytes, name: str) -> CompiledPlan:
    """Parse and check a plan: version gate first, then every key and rule."""
    try:
        plan = canon.loads(data)
    except canon.CanonError as exc:
        raise canon.CanonError(exc.message, location=exc.location.in_file(name)) from None
    chk = Checker(FileLocator(name))
    if not isinstance(plan, dict):
        chk.error("wrong-type", (), f"not a plan: a plan is a JSON object, not {type_name(plan)}")
        raise ValidationFailed(chk.diagnostics)
    # The version is the gate: an unknown version is refused before its keys are read.
    if "version" not in plan:
        chk.error("missing-key", (), "not a plan: it has no version")
        raise ValidationFailed(chk.diagnostics)
    version = check_version(plan["version"], where=Location(name, path="$.version"))
    if "edition" not in plan:
        chk.error("missing-key", (), "plan has no edition")
        raise ValidationFailed(chk.diagnostics)
    edition = check_edition(plan["edition"], where=Location(name, path="$.edition"))
    if ir_version_for(edition) != version:
        chk.error(
            "version-mismatch",
            ("version",),
            f"edition {edition} compiles to version {ir_version_for(edition)}, "
            f"but the plan says version {version}",
        )
    known = _PLAN_KEYS + (_PLAN_KEYS_V3 if version >= 3 else ())
    for key in plan:
        if key not in known:
            chk.error(
                "unknown-key",
                (key,),
                f"unknown key {key!r} in a version {version} plan (known: {', '.join(known)})",
            )
    for key in _PLAN_KEYS:
        if key not in plan:
            chk.error("missing-key", (), f"plan has no {key}")
    if chk.failed:
        raise ValidationFailed(chk.diagnostics)

    workflow = plan["workflow"]
    if not isinstance(workflow, dict):
        chk.error("wrong-type", ("workflow",), "workflow must be an object")
    else:
        _check_plan_workflow(chk, workflow, version)
    tasks = plan["tasks"]
    if not isinstance(tasks, list) or not tasks:
        chk.error("wrong-type", ("tasks",), "tasks must be a non-empty array")
    else:
        for i, task in enumerate(tasks):
            _check_plan_task(chk, ("tasks", i), task, edition, version)
    if chk.failed:
        raise ValidationFailed(chk.diagnostics)
    paths: list[tuple[str | int, ...]] = [("tasks", i) for i in range(len(tasks))]
    check_names(chk, tasks, paths)
    check_graph(
        chk, tasks, paths, fill_input_types=False, params=workflow["params"], edition=edition
    )
    if version >= 3:
        # lazy: compile._fanout is not loaded with this module; only load_plan_bytes() needs it
        from crucible.compile._fanout import check_fanout_graph

        check_fanout_graph(chk, workflow, tasks, paths)
        if "loop" in plan and not chk.failed:
            _check_plan_loop(chk, plan["loop"], tasks)
        if not chk.failed and ("limits" in workflow or "record" in workflow):
            # an accounted plan (docs/spec/export.md): only such plans pay for the check
            from crucible.compile._accounted import check_plan_accounting

            check_plan_accounting(chk, workflow, tasks)
    if chk.failed:
        raise ValidationFailed(chk.diagnostics)
    return finish(plan)


def _check_plan_loop(chk: Checker, loop: Any, tasks: list[dict[str, Any]]) -> None:
    """The ``loop`` member (v3) must be what compiling it gives (normal form: body
    sorted, defaults written out), then pass the same graph rules as a manifest's."""
    # lazy: compile._loop is not loaded with this module; only _check_plan_loop() needs it
    from crucible.compile._loop import check_loop_graph, check_loop_table

    before = len(chk.diagnostics)
    normalized = check_loop_table(chk, loop)
    if normalized is None or len(chk.diagnostics) > before:
        return
    if normalized != loop:
        different = sorted(
            k for k in set(normalized) | set(loop) if normalized.get(k) != loop.get(k)
        )
        chk.error(
            "not-normal-form",
            ("loop", different[0]),
            f"plan loop is not in normal form ({', '.join(different)}); body is sorted, "
            "defaults written out, absent optional keys omitted",
        )
        return
    check_loop_graph(chk, loop, tasks)


def _check_plan_workflow(chk: Checker, workflow: dict[str, Any], version: int) -> None:
    path = ("workflow",)
    known = _WORKFLOW_KEYS + (_WORKFLOW_KEYS_V3 if version >= 3 else ())
    for key in workflow:
        if key not in known:
            chk.error("unknown-key", (*path, key), f"unknown key {key!r} in workflow")
    _check_plan_results(chk, workflow, version)
    for key in ("name", "params"):
        if key not in workflow:
            chk.error("missing-key", path, f"workflow has no {key}")
    for key in ("name", "description", "resolved_from"):
        if key in workflow and not isinstance(workflow[key], str):
            chk.error("wrong-type", (*path, key), f"workflow {key} must be a string")
    if isinstance(workflow.get("name"), str) and not workflow["name"].strip():
        chk.error("bad-value", (*path, "name"), "workflow name must not be empty")
    if "params" in workflow:
        normalized = check_params(chk, (*path, "params"), workflow["params"])
        if not chk.failed and normalized != workflow["params"]:
            chk.error("bad-value", (*path, "params"), "params are not in normal form")


def _check_plan_results(chk: Checker, workflow: dict[str, Any], version: int) -> None:
    """``outputs`` and ``publish`` (v3) must be what compiling them gives (normal form)."""
    # lazy: only _check_plan_results() needs it (start-up)
    from crucible.compile._fanout import check_publish
    from crucible.compile._results import check_outputs

    for key, check in (("outputs", check_outputs), ("publish", check_publish)):
        if version < 3 or key not in workflow:
            continue
        before = len(chk.diagnostics)
        normalized = check(chk, ("workflow", key), workflow[key])
        if len(chk.diagnostics) == before and (not normalized or normalized != workflow[key]):
            chk.error(
                "not-normal-form",
                ("workflow", key),
                f"workflow {key} is not in normal form (empty tables are omitted)",
            )


def _check_plan_task(
    chk: Checker, path: tuple[str | int, ...], task: Any, edition: int, version: int
) -> None:
    if not isinstance(task, dict):
        chk.error("wrong-type", path, f"a task must be an object, not {type_name(task)}")
        return
    allowed = PLAN_TASK_KEYS[version]
    for key in task:
        if key not in allowed:
            chk.error(
                "unknown-key", (*path, key), f"unknown key {key!r} in a version {version} plan task"
            )
    before = len(chk.diagnostics)
    for key in _REQUIRED_TASK_KEYS:
        if key not in task:
            chk.error("missing-key", path, f"plan task has no {key}")
    if task.get("kind") != "agent" and "run" not in task:
        chk.error("missing-key", path, "plan task has no run")
    if len(chk.diagnostics) > before:
        return
    # Reuse the manifest checks on the same keys, then compare: a plan task must be
    # exactly what compiling its own fields would produce (normal form).
    raw = {k: v for k, v in task.items() if k in allowed and k != "inputs"}
    if version >= 3:
        # lazy: compile._fanout is not loaded with this module; only _check_plan_task() needs it
        from crucible.compile._fanout import task_to_manifest

        raw = task_to_manifest(raw)
    inputs = task.get("inputs")
    if inputs is not None:
        if not isinstance(inputs, dict):
            chk.error("wrong-type", (*path, "inputs"), "inputs must be an object")
            return
        raw["inputs"] = {}
        for name, spec in inputs.items():
            ipath = (*path, "inputs", name)
            if not isinstance(spec, dict):
                chk.error("wrong-type", ipath, f"input {name!r} must be an object")
                continue
            for key in spec:
                if key not in _INPUT_KEYS and not (key == "path" and version >= 3):
                    chk.error(
                        "unknown-key", (*ipath, key), f"unknown key {key!r} in input {name!r}"
                    )
            if any(k not in spec for k in _INPUT_KEYS):
                chk.error(
                    "missing-key", ipath, f"input {name!r} needs from, producer, field and type"
                )
                continue
            if spec["type"] not in TYPES:
                chk.error(
                    "bad-type-name",
                    (*ipath, "type"),
                    f"input {name!r} has an unknown type {spec['type']!r}",
                )
            raw["inputs"][name] = spec["from"]
    before = len(chk.diagnostics)
    normalized = check_task(chk, path, raw, edition, label="plan task")
    if len(chk.diagnostics) > before:
        return
    for name, spec in normalized.get("inputs", {}).items():
        # the graph rules check these against the producer (and, for a dotted
        # reference with a path, against the task names: rules._check_input)
        given = task["inputs"][name]
        for key in ("type", "producer", "field", "path"):
            if key in given:
                spec[key] = given[key]
            else:
                spec.pop(key, None)
    if normalized != task:
        different = sorted(
            k for k in set(normalized) | set(task) if normalized.get(k) != task.get(k)
        )
        chk.error(
            "not-normal-form",
            (*path, different[0]) if different else path,
            f"plan task is not in normal form ({', '.join(different)}); "
            "empty optional fields are omitted, defaults written out",
        )

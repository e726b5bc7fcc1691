"""A light, read-only view of a plan dict: what stage needs and checks.

Plans arrive as plain JSON-shaped dicts (docs/spec/plan-ir.md, docs/schemas/plan-v*.json).
Stage does not import the compiler (tools share plans as files, not code: DESIGN.md
"Layout", held by tests/test_layering.py); it checks the few things it relies on and refuses the rest with a
clear message (a plan/state mismatch, an unknown task, an unsafe name).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from crucible.core.contract import SUPPORTED_EDITIONS, SUPPORTED_VERSIONS, TYPES
from crucible.core.errors import InputRefused, Location, UnsupportedVersion
from crucible.core.refs import Ref, RefSyntax, parse_ref
from crucible.stage._names import task_name_problem

__all__ = [
    "PLAN",
    "SUPPORTED_VERSIONS",
    "TYPES",
    "PlanView",
    "TaskView",
    "in_plan",
    "plan_object",
    "view",
]

#: the display name of the plan in the library's errors: the library is handed
#: the plan's value, not its file, so the command edge names the file
#: (``CrucibleError.name_source(name, placeholder=PLAN)``)
PLAN = "plan"


def in_plan(path: str | None = None) -> Location:
    """A location in the plan: its JSON path, or ``task NAME`` where no path is kept."""
    return Location(PLAN, path=path)


@dataclass(frozen=True)
class TaskView:
    """One task of the plan, as stage reads it (``raw``: the plan's task object)."""

    name: str
    kind: str
    needs: tuple[str, ...]
    join: str
    emits: dict[str, str]
    emits_files: tuple[str, ...]
    epilogue: bool
    map: tuple[str, str] | None
    inputs: dict[str, dict[str, Any]]
    prompt: str | None
    raw: dict[str, Any] = field(repr=False)
    #: IR v3 fan-outs whose instances the dispatcher lists in STATE/instances/<task>.json
    #: (a literal, param or sequence map, a matrix, a map with ``key``, a map whose
    #: reference has a path or whose producer is mapped); ``map`` is then ("", "")
    #: unless a producer field is the source
    listed: bool = False
    #: IR v3: emits_files entries freed once the direct dependants settled,
    #: staged only into them (docs/spec/run.md, "Temporary files")
    temp_files: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlanView:
    """The plan's tasks by name, in declaration order. Stage's functions take a
    plan as its JSON object or as its view: handed the view (as a run's
    :class:`crucible.stage.StateDir` hands it), they use it as it is."""

    version: int
    edition: int
    tasks: dict[str, TaskView]
    order: tuple[str, ...]
    #: the plan's JSON object the view was built from
    plan: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: what stage derives from the plan once (the scored loop's view: _loop.loop_of)
    memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def task(self, name: str) -> TaskView:
        try:
            return self.tasks[name]
        except KeyError:
            raise InputRefused(f"task {name!r} is not in the plan", where=in_plan()) from None

    def ancestors(self, name: str) -> list[str]:
        """Every transitive dependency of ``name``, in plan declaration order."""
        seen: set[str] = set()
        stack = list(self.task(name).needs)
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            stack.extend(self.task(n).needs)
        # Sorted by position, not by scanning the whole plan: one scan per task
        # made staging a 1,000-task plan quadratic.
        return sorted(seen, key=self._position.__getitem__)

    @cached_property
    def _position(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.order)}


def _parse_ref(ref: object, where: str, needs: Any) -> Ref:
    """A reference's producer, field and path; the producer is one of ``needs``,
    which decide which dot ends it (crucible.core.refs)."""
    try:
        return parse_ref(ref, needs if isinstance(needs, list | tuple) else None)
    except RefSyntax as exc:
        why = f": {exc.message}" if isinstance(ref, str) and "[" in ref else ""
        raise InputRefused(
            f"expected 'producer.field', got {ref!r}{why}", where=in_plan(where)
        ) from None


def _split_ref(ref: object, where: str, needs: Any = None) -> tuple[str, str]:
    parsed = _parse_ref(ref, where, needs)
    return parsed.producer, parsed.field


def _task(raw: Any, i: int, checked: bool) -> TaskView:
    where = f"$.tasks[{i}]"  # a JSON path in the plan
    if not checked:
        _check_task(raw, where)
    listed = "matrix" in raw or "key" in raw or ("map" in raw and not isinstance(raw["map"], str))
    if "map" in raw and isinstance(raw["map"], str):
        ref = _parse_ref(raw["map"], f"{where}.map", raw.get("needs"))
        mapped: tuple[str, str] | None = (ref.producer, ref.field)
        listed = listed or bool(ref.path)  # the dispatcher resolves the path
    else:
        mapped = ("", "") if listed else None
    prompt = raw.get("prompt")
    return TaskView(
        name=raw["name"],
        kind=raw["kind"],
        needs=tuple(raw.get("needs", [])),
        join=raw.get("join", "all"),
        emits=dict(raw.get("emits", {})),
        emits_files=tuple(raw.get("emits_files", [])),
        epilogue=bool(raw.get("epilogue", False)),
        map=mapped,
        inputs=dict(raw.get("inputs", {})),
        prompt=prompt if isinstance(prompt, str) else None,
        raw=raw,
        listed=listed,
        temp_files=tuple(raw.get("temp_files", ())),
    )


def _check_task(raw: Any, where: str) -> None:
    """What stage relies on in one task; the refusals of a plan no compiler checked."""
    if not isinstance(raw, dict):
        raise InputRefused("a task must be an object", where=in_plan(where))
    problem = task_name_problem(raw.get("name"))
    if problem is not None:
        raise InputRefused(problem, where=in_plan(f"{where}.name"))
    kind = raw.get("kind")
    if kind not in ("command", "evaluate", "agent"):
        raise InputRefused(f"unknown kind {kind!r}", where=in_plan(f"{where}.kind"))
    needs = raw.get("needs", [])
    if not isinstance(needs, list) or not all(isinstance(n, str) for n in needs):
        raise InputRefused("needs must be a list of task names", where=in_plan(f"{where}.needs"))
    emits = raw.get("emits", {})
    if not isinstance(emits, dict) or not all(t in TYPES for t in emits.values()):
        raise InputRefused("emits must map fields to known types", where=in_plan(f"{where}.emits"))
    files = raw.get("emits_files", [])
    if not isinstance(files, list) or not all(isinstance(p, str) for p in files):
        raise InputRefused(
            "emits_files must be a list of paths", where=in_plan(f"{where}.emits_files")
        )
    if "map" in raw and isinstance(raw["map"], str):
        _split_ref(raw["map"], f"{where}.map", needs)
    inputs = raw.get("inputs", {})
    if not isinstance(inputs, dict):
        raise InputRefused("inputs must be an object", where=in_plan(f"{where}.inputs"))
    for input_name, spec in inputs.items():
        iw = f"{where}.inputs.{input_name}"
        if not isinstance(spec, dict):
            raise InputRefused("an input must be an object", where=in_plan(iw))
        ref = _parse_ref(spec.get("from"), f"{iw}.from", needs)
        if (
            spec.get("producer", ref.producer) != ref.producer
            or spec.get("field", ref.field) != ref.field
            or list(spec.get("path", ())) != list(ref.path)
        ):
            raise InputRefused("producer/field/path disagree with 'from'", where=in_plan(iw))
    join = raw.get("join", "all")
    if join not in ("all", "settled"):
        raise InputRefused(f"unknown join {join!r}", where=in_plan(f"{where}.join"))


def build_view(plan: Any, *, checked: bool = False) -> PlanView:
    """The plan's view, after checking what stage relies on. ``checked``: the
    plan passed the compiler's checks (a plan file in normal form, or a manifest
    compiled), which refuse everything :func:`_check_task` does, so each task's
    fields are not checked again (~2 ms of a 1,000-task dispatch's start-up;
    tests/run/test_startup_plan.py holds the compiler to that)."""
    if not isinstance(plan, dict):
        raise InputRefused("a plan must be a JSON object", where=in_plan())
    version = plan.get("version")
    if type(version) is not int or version not in SUPPORTED_VERSIONS:
        raise UnsupportedVersion(
            f"plan version {version!r} is not supported "
            f"(supported: {', '.join(map(str, SUPPORTED_VERSIONS))})",
            where=in_plan("$.version"),
        )
    edition = plan.get("edition", 1)
    if type(edition) is not int or edition not in SUPPORTED_EDITIONS:
        raise UnsupportedVersion(
            f"edition {edition!r} is not supported", where=in_plan("$.edition")
        )
    raw_tasks = plan.get("tasks")
    if not isinstance(raw_tasks, list):
        raise InputRefused("tasks must be a list", where=in_plan("$.tasks"))
    tasks: dict[str, TaskView] = {}
    for i, raw in enumerate(raw_tasks):
        t = _task(raw, i, checked)
        if t.name in tasks:
            raise InputRefused(f"task {t.name!r} is declared twice", where=in_plan(f"$.tasks[{i}]"))
        tasks[t.name] = t
    # a map over a mapped task (edition 4) is expanded by the dispatcher too
    for name, t in list(tasks.items()):
        source = tasks.get(t.map[0]) if t.map is not None and not t.listed else None
        if source is not None and source.map is not None:
            tasks[name] = dataclasses.replace(t, listed=True)
    for t in tasks.values():
        for n in t.needs:
            if n not in tasks:
                raise InputRefused(f"task {t.name!r} needs unknown task {n!r}", where=in_plan())
        if t.map is not None and t.map != ("", "") and t.map[0] not in tasks:
            raise InputRefused(
                f"task {t.name!r} maps over unknown task {t.map[0]!r}", where=in_plan()
            )
        if version == 1 and t.inputs:
            raise InputRefused(f"task {t.name!r} declares inputs in a v1 plan", where=in_plan())
    return PlanView(version=version, edition=edition, tasks=tasks, order=tuple(tasks), plan=plan)


def plan_object(plan: Any) -> Any:
    """The plan's JSON object, whether ``plan`` is that object or its view."""
    return plan.plan if isinstance(plan, PlanView) else plan


# One-entry identity cache, for a caller that hands stage the plan's JSON object
# (crucible-stage, a test): the same object for each of its calls, and a
# 10,000-task plan should not be re-checked on every call. The strong reference
# keeps id() from being reused while cached. A run never fills it: its StateDir
# (crucible.stage._statedir) builds the view once and hands it to every call.
_cache: tuple[Any, PlanView] | None = None


def view(plan: Any) -> PlanView:
    """``plan``'s view: ``plan`` itself when it is one, else built (or cached)."""
    global _cache
    if isinstance(plan, PlanView):
        return plan
    if _cache is not None and _cache[0] is plan:
        return _cache[1]
    v = build_view(plan)
    _cache = (plan, v)
    return v

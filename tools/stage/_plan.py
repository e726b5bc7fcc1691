"""A light, read-only view of a plan dict: what stage needs and checks.

Plans arrive as plain JSON-shaped dicts (docs/spec/plan-ir.md, docs/schemas/plan-v*.json).
Stage does not import the compiler (tools share plans as files, not code: DESIGN.md
"Layout", held by tests/test_layering.py); it checks the few things it relies on and refuses the rest with a
clear message (a plan/state mismatch, an unknown task, an unsafe name).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from crucible.core.contract import SUPPORTED_VERSIONS
from crucible.core.errors import InputRefused, Location, UnsupportedVersion
from crucible.stage._names import task_name_problem

__all__ = [
    "PLAN",
    "SUPPORTED_VERSIONS",
    "TYPES",
    "PlanView",
    "TaskView",
    "in_plan",
    "prepare_plan",
    "view",
]

#: the display name of the plan in the library's errors: the library is handed
#: the plan's value, not its file, so the command edge names the file
#: (``CrucibleError.name_source(name, placeholder=PLAN)``)
PLAN = "plan"


def in_plan(path: str | None = None) -> Location:
    """A location in the plan: its JSON path, or ``task NAME`` where no path is kept."""
    return Location(PLAN, path=path)


TYPES = frozenset({"string", "integer", "number", "boolean", "object", "array", "any"})


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
    #: (a literal, param or sequence map, a matrix, a map with ``key``); ``map`` is then
    #: ("", "") unless a producer field is the source
    listed: bool = False
    #: IR v3: emits_files entries freed once the direct dependants settled,
    #: staged only into them (docs/spec/run.md, "Temporary files")
    temp_files: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlanView:
    """The plan's tasks by name, in declaration order."""

    version: int
    edition: int
    tasks: dict[str, TaskView]
    order: tuple[str, ...]

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


def _split_ref(ref: object, where: str) -> tuple[str, str]:
    if not isinstance(ref, str) or "." not in ref:
        raise InputRefused(f"expected 'producer.field', got {ref!r}", where=in_plan(where))
    producer, _, fld = ref.rpartition(".")
    if not producer or not fld:
        raise InputRefused(f"expected 'producer.field', got {ref!r}", where=in_plan(where))
    return producer, fld


def _task(raw: Any, i: int, checked: bool) -> TaskView:
    where = f"$.tasks[{i}]"  # a JSON path in the plan
    if not checked:
        _check_task(raw, where)
    listed = "matrix" in raw or "key" in raw or ("map" in raw and not isinstance(raw["map"], str))
    if "map" in raw and isinstance(raw["map"], str):
        mapped: tuple[str, str] | None = _split_ref(raw["map"], f"{where}.map")
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
        _split_ref(raw["map"], f"{where}.map")
    inputs = raw.get("inputs", {})
    if not isinstance(inputs, dict):
        raise InputRefused("inputs must be an object", where=in_plan(f"{where}.inputs"))
    for input_name, spec in inputs.items():
        iw = f"{where}.inputs.{input_name}"
        if not isinstance(spec, dict):
            raise InputRefused("an input must be an object", where=in_plan(iw))
        producer, fld = _split_ref(spec.get("from"), f"{iw}.from")
        if spec.get("producer", producer) != producer or spec.get("field", fld) != fld:
            raise InputRefused("producer/field disagree with 'from'", where=in_plan(iw))
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
            f"plan version {version!r} is not supported (supported: 1, 2, 3)",
            where=in_plan("$.version"),
        )
    edition = plan.get("edition", 1)
    if type(edition) is not int or edition not in (1, 2, 3, 4):
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
    return PlanView(version=version, edition=edition, tasks=tasks, order=tuple(tasks))


# One-entry identity cache: dispatch hands the same plan dict for every task of
# a run, and a 10,000-task plan should not be re-checked 10,000 times. The
# strong reference keeps id() from being reused while cached.
_cache: tuple[Any, PlanView] | None = None


def view(plan: Any) -> PlanView:
    global _cache
    if _cache is not None and _cache[0] is plan:
        return _cache[1]
    v = build_view(plan)
    _cache = (plan, v)
    return v


def prepare_plan(plan: Any, *, checked: bool = False) -> None:
    """Check ``plan`` and cache its view now. A dispatcher calls this before it
    forks its workers, so they inherit the checked view instead of each building
    its own (~15 ms per worker for 1,000 tasks). ``checked``: as for
    :func:`build_view` (a view already cached is kept)."""
    global _cache
    if checked and (_cache is None or _cache[0] is not plan):
        _cache = (plan, build_view(plan, checked=True))
    v = view(plan)
    if v.order:
        v.ancestors(v.order[0])  # builds the cached position map

"""Stage's view of a plan: the typed model (crucible.core.plan) and what stage checks.

Plans arrive as plain JSON-shaped dicts (docs/spec/plan-ir.md, docs/schemas/plan-v*.json).
:func:`build_view` reads one once into the core model (:class:`crucible.core.plan.Plan`,
which refuses unknown members, checks each member's shape, parses references and
applies every default) and checks across tasks what stage relies on (an unknown
task, an unsafe or duplicate name, inputs in a v1 plan). Stage does not import the
compiler (tools share plans as files, not code: DESIGN.md "Layout", held by
tests/test_layering.py).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from crucible.core.contract import SUPPORTED_VERSIONS, TYPES
from crucible.core.errors import InputRefused
from crucible.core.plan import PLAN, Plan, Task, in_plan
from crucible.core.structs import dataclass, field
from crucible.stage._names import task_name_problem

__all__ = [
    "PLAN",
    "SUPPORTED_VERSIONS",
    "TYPES",
    "PlanView",
    "TaskView",
    "build_view",
    "in_plan",
]


@dataclass(frozen=True)
class TaskView:
    """One task of the plan, as stage reads it: the core model's task (``model``:
    its inputs, env, params, ...) and the forms stage's code reads most; ``raw``
    is the plan's task object, which only the cache key reads
    (crucible.run.cache._store.fixed_components hashes it)."""

    name: str
    kind: str
    needs: tuple[str, ...]
    join: str
    emits: dict[str, str]
    emits_files: tuple[str, ...]
    epilogue: bool
    map: tuple[str, str] | None
    prompt: str | None
    raw: dict[str, Any] = field(repr=False)
    #: IR v3 fan-outs whose instances the dispatcher lists in STATE/instances/<task>.json
    #: (a literal, param or sequence map, a matrix, a map with ``key`` or a path, a
    #: map over a mapped task: crucible.core.plan.Plan.listed); ``map`` is then
    #: ("", "") unless a producer field is the source
    listed: bool = False
    #: IR v3: emits_files entries freed once the direct dependants settled,
    #: staged only into them (docs/spec/run.md, "Temporary files")
    temp_files: tuple[str, ...] = ()
    #: the task in the plan's typed model (crucible.core.plan)
    model: Task = field(default=None, repr=False, compare=False)  # type: ignore[assignment]


@dataclass(frozen=True)
class PlanView:
    """The plan's tasks by name, in declaration order. Every stage function
    takes the plan as its view, built once (:func:`build_view`) and handed
    on by the run's :class:`crucible.stage.StateDir`."""

    version: int
    edition: int
    tasks: dict[str, TaskView]
    order: tuple[str, ...]
    #: the plan's JSON object the view was built from
    plan: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: what stage derives from the plan once (the scored loop's view: _loop.loop_of)
    memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: the plan's typed model (crucible.core.plan)
    model: Plan = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

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

    def file_ancestors(self, name: str) -> tuple[str, ...]:
        """The ancestors of ``name`` that declare ``emits_files``, in plan
        declaration order: the only ones whose units are staged into it (3.4).
        Worked out once per task (a view never changes): staging, its checks
        and the cache key ask it for every unit, and a walk over every
        ancestor each time made a deep chain quadratic."""
        memo = self.memo.setdefault("file_ancestors", {})
        found: tuple[str, ...] | None = memo.get(name)
        if found is None:
            found = tuple(a for a in self.ancestors(name) if self.tasks[a].emits_files)
            memo[name] = found
        return found

    @cached_property
    def _position(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.order)}


def _view_of(task: Task, raw: dict[str, Any], listed: bool) -> TaskView:
    ref = task.map_ref
    if ref is not None:
        mapped: tuple[str, str] | None = (ref.producer, ref.field)
    else:
        mapped = ("", "") if listed else None
    return TaskView(
        name=task.name,
        kind=task.kind,
        needs=task.needs,
        join=task.join,
        emits=dict(task.emits),
        emits_files=task.emits_files,
        epilogue=task.epilogue,
        map=mapped,
        prompt=task.prompt,
        raw=raw,
        listed=listed,
        temp_files=task.temp_files,
        model=task,
    )


def build_view(plan: Any, *, checked: bool = False, model: Plan | None = None) -> PlanView:
    """The plan's view, after checking what stage relies on. ``checked``: the
    plan passed the compiler's checks (a plan file in normal form, or a manifest
    compiled), which refuse everything the model and the checks below do, so
    neither runs again (~2 ms of a 1,000-task dispatch's start-up;
    tests/run/test_startup_plan.py holds the compiler to that). ``model``: the
    plan's model, already built (a dispatcher's admission builds it once)."""
    if model is None:
        model = Plan.from_json(plan, checked=checked)
    tasks: dict[str, TaskView] = {}
    for i, (task, raw) in enumerate(zip(model.tasks, plan["tasks"], strict=True)):
        if not checked:
            problem = task_name_problem(task.name)
            if problem is not None:
                raise InputRefused(problem, where=in_plan(f"$.tasks[{i}].name"))
        if task.name in tasks:
            raise InputRefused(
                f"task {task.name!r} is declared twice", where=in_plan(f"$.tasks[{i}]")
            )
        tasks[task.name] = _view_of(task, raw, False)
    if not checked:
        _check_across(model)
    for name, t in tasks.items():  # a map over a mapped task (edition 4): listed too
        if model.listed(name):
            tasks[name] = _view_of(t.model, t.raw, True)
    return PlanView(
        version=model.version,
        edition=model.edition,
        tasks=tasks,
        order=tuple(tasks),
        plan=plan,
        model=model,
    )


def _check_across(plan: Plan) -> None:
    """What a compiler would have refused across tasks, for a plan none checked."""
    for t in plan.tasks:
        for n in t.needs:
            if n not in plan.by_name:
                raise InputRefused(f"task {t.name!r} needs unknown task {n!r}", where=in_plan())
        ref = t.map_ref
        if ref is not None and ref.producer not in plan.by_name:
            raise InputRefused(
                f"task {t.name!r} maps over unknown task {ref.producer!r}", where=in_plan()
            )
        if plan.version == 1 and t.inputs:
            raise InputRefused(f"task {t.name!r} declares inputs in a v1 plan", where=in_plan())

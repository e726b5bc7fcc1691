"""The task graph a run walks: dependencies, consumers, epilogue ordering.

Edges come from each task's ``needs``; an epilogue task also waits for every
non-epilogue task (it runs after everything else has settled, whatever the
outcome). The graph is checked once (cycles) and ordered once (Kahn's algorithm,
declaration order among independent tasks); the run loop then uses plain
counters, which stay cheap at 10,000 tasks. Plain Python, not networkx: its
import and graph build cost a dispatcher ~0.3 s of start-up on every run.
"""

from __future__ import annotations

from collections.abc import Mapping

from crucible.core.errors import InputRefused
from crucible.core.plan import Plan, Task
from crucible.core.structs import dataclass

__all__ = ["TaskGraph", "build_graph"]


@dataclass(frozen=True)
class TaskGraph:
    #: task name -> its task (the plan's typed model, crucible.core.plan)
    tasks: Mapping[str, Task]
    #: task name -> every task it waits for (needs, plus all non-epilogue tasks for an epilogue)
    waits_for: dict[str, tuple[str, ...]]
    #: task name -> tasks that wait for it
    consumers: dict[str, tuple[str, ...]]
    #: a topological order (declaration order among independent tasks)
    order: tuple[str, ...]


def _topological_order(
    tasks: Mapping[str, Task], waits_for: dict[str, tuple[str, ...]]
) -> tuple[str, ...]:
    """Kahn's algorithm; among ready tasks the earliest declared goes first."""
    # lazy: not loaded with this module; only _topological_order() needs it
    import heapq

    position = {name: i for i, name in enumerate(tasks)}
    names = list(tasks)
    consumers: dict[str, list[str]] = {name: [] for name in tasks}
    left: dict[str, int] = {}
    for name, waited in waits_for.items():
        unique = set(waited)
        left[name] = len(unique)
        for dep in unique:
            consumers[dep].append(name)
    ready = [position[name] for name in names if left[name] == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        name = names[heapq.heappop(ready)]
        order.append(name)
        for consumer in consumers[name]:
            left[consumer] -= 1
            if left[consumer] == 0:
                heapq.heappush(ready, position[consumer])
    if len(order) < len(names):
        path = " -> ".join(_a_cycle({n for n in names if left[n] > 0}, waits_for))
        raise InputRefused(f"the task graph has a cycle: {path}", where="$.tasks")
    return tuple(order)


def _a_cycle(stuck: set[str], waits_for: dict[str, tuple[str, ...]]) -> list[str]:
    """One cycle among ``stuck`` (tasks Kahn's algorithm could not order), as
    ``dep -> ... -> dep`` along needs edges. Every stuck task waits for another
    stuck task, so walking back from any of them must revisit one."""
    node = min(stuck)
    seen: dict[str, int] = {}
    walk: list[str] = []
    while node not in seen:
        seen[node] = len(walk)
        walk.append(node)
        node = next(d for d in waits_for[node] if d in stuck)
    cycle = walk[seen[node] :]
    cycle.reverse()  # walked consumer -> dependency; show dependency -> consumer
    return [*cycle, cycle[0]]


def build_graph(plan: Plan) -> TaskGraph:
    """The graph of ``plan``, checked (unknown needs, cycles) and ordered; built
    once per run, at admission (crucible.run.session._runner)."""
    tasks = plan.by_name
    regular = [name for name, task in tasks.items() if not task.epilogue]
    waits_for: dict[str, tuple[str, ...]] = {}
    for name, task in tasks.items():
        deps: list[str] = list(task.needs)
        if task.epilogue:
            deps.extend(r for r in regular if r not in deps)
        for dep in deps:
            if dep not in tasks:
                raise InputRefused(
                    f"task {name!r} needs unknown task {dep!r}", where=f"$.tasks.{name}.needs"
                )
        waits_for[name] = tuple(deps)
    order = _topological_order(tasks, waits_for)
    consumers: dict[str, list[str]] = {name: [] for name in tasks}
    for name in order:
        for dep in waits_for[name]:
            consumers[dep].append(name)
    return TaskGraph(
        tasks=tasks,
        waits_for=waits_for,
        consumers={k: tuple(v) for k, v in consumers.items()},
        order=order,
    )

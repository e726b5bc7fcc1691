"""The task graph a run walks: dependencies, consumers, epilogue ordering.

Edges come from each task's ``needs``; an epilogue task also waits for every
non-epilogue task (it runs after everything else has settled, whatever the
outcome). networkx checks the graph once (cycles, a topological order); the
run loop then uses plain counters, which stay cheap at 10,000 tasks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from crucible.core.errors import InputRefused

__all__ = ["TaskGraph", "build_graph"]


@dataclass(frozen=True)
class TaskGraph:
    #: task name -> its task object from the plan
    tasks: dict[str, dict[str, Any]]
    #: task name -> every task it waits for (needs, plus all non-epilogue tasks for an epilogue)
    waits_for: dict[str, tuple[str, ...]]
    #: task name -> tasks that wait for it
    consumers: dict[str, tuple[str, ...]]
    #: a topological order (declaration order among independent tasks)
    order: tuple[str, ...]


def build_graph(plan: dict[str, Any]) -> TaskGraph:
    import networkx as nx

    tasks: dict[str, dict[str, Any]] = {}
    for task in plan["tasks"]:
        tasks[task["name"]] = task
    regular = [name for name, task in tasks.items() if not task.get("epilogue", False)]
    waits_for: dict[str, tuple[str, ...]] = {}
    for name, task in tasks.items():
        deps: list[str] = list(task.get("needs", []))
        if task.get("epilogue", False):
            deps.extend(r for r in regular if r not in deps)
        for dep in deps:
            if dep not in tasks:
                raise InputRefused(
                    f"task {name!r} needs unknown task {dep!r}", where=f"$.tasks.{name}.needs"
                )
        waits_for[name] = tuple(deps)
    graph = nx.DiGraph()
    graph.add_nodes_from(tasks)
    for name, waited in waits_for.items():
        graph.add_edges_from((dep, name) for dep in waited)
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        cycle = None
    if cycle:
        path = " -> ".join([edge[0] for edge in cycle] + [cycle[0][0]])
        raise InputRefused(f"the task graph has a cycle: {path}", where="$.tasks")
    position = {name: i for i, name in enumerate(tasks)}
    order = tuple(nx.lexicographical_topological_sort(graph, key=lambda n: position[n]))
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

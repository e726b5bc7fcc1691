"""Graph rules over a structurally sound workflow (stable codes in docs/spec/plan-ir.md).

Runs on plan-shaped task dicts, whether they came from a manifest, a Starlark
source or a plan file, so ``crucible-validate`` judges all three alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from crucible.compile._checker import Checker, input_form
from crucible.compile._conditions import check_control_rules
from crucible.compile._diagnostics import KeyPath
from crucible.compile._editions import EDITION_CONTROL, RESERVED_INPUTS
from crucible.compile._names import task_name_problems
from crucible.core.refs import Ref, parse_ref

__all__ = ["check_graph", "check_names", "check_ref_path", "find_cycle"]

_COLLECTION_TYPES = ("array", "object", "any")


def check_names(chk: Checker, tasks: Sequence[dict[str, Any]], paths: Sequence[KeyPath]) -> None:
    """Task name rules and duplicates; safe to run even when other fields are broken."""
    seen: set[str] = set()
    for task, path in zip(tasks, paths, strict=True):
        name = task["name"]
        if name is None:  # missing or not a string: already reported
            continue
        for code, message in task_name_problems(name):
            chk.error(code, (*path, "name"), message)
        if name in seen:
            chk.error("duplicate-task", (*path, "name"), f"task name {name!r} is used twice")
        seen.add(name)


def check_graph(
    chk: Checker,
    tasks: Sequence[dict[str, Any]],
    paths: Sequence[KeyPath],
    *,
    fill_input_types: bool,
    params: Mapping[str, Any] | None = None,
    edition: int = 1,
) -> None:
    """Check every graph rule; with ``fill_input_types`` set each input's type from
    its producer's declaration, otherwise (a plan file) check that it matches.
    ``params`` (the workflow's) lets conditions be checked against them; from
    ``edition`` 4 epilogues may need epilogues and fan out (a small DAG)."""
    by_name = {t["name"]: t for t in reversed(tasks)}  # the first of duplicates wins
    epilogues = {t["name"] for t in tasks if t["epilogue"]}
    epilogue_dag = edition >= EDITION_CONTROL
    for task, path in zip(tasks, paths, strict=True):
        name = task["name"]
        for i, need in enumerate(task["needs"]):
            if need not in by_name:
                chk.error(
                    "unknown-need",
                    (*path, "needs", i),
                    f"task {name!r} needs {need!r}, which is not a task of this workflow",
                )
            elif need in epilogues and not (epilogue_dag and task["epilogue"]):
                chk.error(
                    "needs-epilogue",
                    (*path, "needs", i),
                    f"task {name!r} needs {need!r}, an epilogue task "
                    "(epilogues run after every other task; nothing may need one)",
                )
        if isinstance(task.get("map"), str):  # the other sources: fanout.check_fanout_graph
            _check_map(chk, task, path, by_name, epilogue_dag=epilogue_dag, edition=edition)
        for input_name, spec in task.get("inputs", {}).items():
            _check_input(
                chk, task, path, input_name, spec, by_name, fill_input_types, edition=edition
            )

    cycle = find_cycle(tasks)
    if cycle:
        first = by_name[cycle[0]]
        path = paths[tasks.index(first)]
        chk.error("cycle", (*path, "needs"), "dependency cycle: " + " -> ".join(cycle))
    check_control_rules(chk, tasks, paths, params)


def _producer_field(
    chk: Checker,
    task: Mapping[str, Any],
    where: KeyPath,
    ref: str,
    what: str,
    by_name: Mapping[str, dict[str, Any]],
    code_prefix: str,
    *,
    edition: int = 1,
) -> Ref | None:
    """Resolve ``producer.field[path]`` against the direct dependencies of ``task``
    (from ``edition`` 4 the task names decide the producer and a path may follow:
    crucible.core.refs)."""
    resolved = parse_ref(ref, by_name if edition >= EDITION_CONTROL else None)
    producer, field = resolved.producer, resolved.field
    name = task["name"]
    if producer not in task["needs"]:
        known = "a task of this workflow" if producer in by_name else "not a task of this workflow"
        chk.error(
            f"{code_prefix}-not-dependency",
            where,
            f"{what} of task {name!r} reads {ref!r}, but {producer!r} is not a direct "
            f"dependency ({known}); add it to needs",
        )
        return None
    declared = by_name.get(producer, {}).get("emits", {})
    if field not in declared:
        chk.error(
            f"{code_prefix}-unknown-field",
            where,
            f"{what} of task {name!r} reads {ref!r}, but {producer!r} does not declare "
            f"the field {field!r} in emits",
        )
        return None
    if resolved.path and not check_ref_path(
        chk, where, f"{what} of task {name!r}", resolved, by_name[producer]
    ):
        return None
    return resolved


def check_ref_path(
    chk: Checker, where: KeyPath, what: str, ref: Ref, producer: Mapping[str, Any]
) -> bool:
    """A reference's element/member path against what its producer declares: no
    path into a mapped task's values (``ref-mapped-path``), and the first step
    must suit the field's declared type (``ref-wrong-type``; below it nothing is
    declared, so the run finds a miss)."""
    if "map" in producer or "matrix" in producer:
        chk.error(
            "ref-mapped-path",
            where,
            f"{what} reads {ref.text!r}, a path into the values of {ref.producer!r}, which "
            f"fans out: name the field ({ref.producer}.{ref.field}) and index the fold in "
            "an expression, or map over it",
        )
        return False
    type_ = producer["emits"][ref.field]
    step = ref.path[0]
    need = "array" if isinstance(step, int) else "object"
    if type_ not in (need, "any"):
        kind = f"an element [{step}]" if isinstance(step, int) else f"a member .{step}"
        chk.error(
            "ref-wrong-type",
            where,
            f"{what} reads {ref.text!r}: {kind} of {ref.producer}.{ref.field}, which is "
            f"declared {type_} (an {need} or any field has one)",
        )
        return False
    return True


def _check_map(
    chk: Checker,
    task: dict[str, Any],
    path: KeyPath,
    by_name: dict[str, dict[str, Any]],
    *,
    epilogue_dag: bool = False,
    edition: int = 1,
) -> None:
    where = (*path, "map")
    if task["epilogue"] and not epilogue_dag:
        chk.error("epilogue-map", where, f"epilogue task {task['name']!r} cannot fan out (map)")
        return
    ref = _producer_field(chk, task, where, task["map"], "map", by_name, "map", edition=edition)
    if ref is None:
        return
    source = by_name[ref.producer]
    mapped = "map" in source or "matrix" in source
    if mapped and edition >= EDITION_CONTROL:
        # a fan-out over a fan-out (edition 4): one instance per element of each
        # instance's value, or per instance when it is not an array (run.md)
        return
    type_ = "any" if ref.path else source["emits"][ref.field]
    if type_ not in _COLLECTION_TYPES:
        chk.error(
            "map-not-collection",
            where,
            f"map of task {task['name']!r} reads {task['map']!r}, declared {type_}; "
            "a fan-out needs an array, object or any field",
        )
    elif mapped:
        # the run could not stage it before edition 4 (stage.map_items): a fan-out
        # over a fan-out, which edition 4 defines
        chk.error(
            "map-mapped-source",
            where,
            f"map of task {task['name']!r} reads {task['map']!r}, but {ref.producer!r} is "
            "itself mapped (a fan-out over a fan-out needs edition 4): map over a field of "
            "a task that is not mapped, e.g. one that gathers the instances' values",
        )


def _check_input(
    chk: Checker,
    task: dict[str, Any],
    path: KeyPath,
    input_name: str,
    spec: dict[str, Any],
    by_name: dict[str, dict[str, Any]],
    fill_input_types: bool,
    *,
    edition: int = 1,
) -> None:
    where = (*path, "inputs", input_name)
    producer = spec["producer"]
    if producer in RESERVED_INPUTS and producer not in by_name:
        if producer == "params" and task["kind"] == "agent":
            chk.error(
                "agent-params",
                where,
                f"input {input_name!r} of agent task {task['name']!r} reads params: "
                "agents never receive params",
            )
        else:
            chk.error(
                "input-reserved-source",
                where,
                f"input {input_name!r} of task {task['name']!r} reads the reserved input "
                f"{producer!r}: reserved inputs arrive undeclared, under their own name; "
                "remove this input",
            )
        return
    ref = _producer_field(
        chk, task, where, spec["from"], f"input {input_name!r}", by_name, "input", edition=edition
    )
    if ref is None:
        return
    # below a path nothing is declared: the element's type is any
    declared_type = "any" if ref.path else by_name[ref.producer]["emits"][ref.field]
    resolved = input_form(ref, declared_type)
    if fill_input_types:
        spec.update(resolved)
        return
    named = ("producer", "field", "path")
    if any(spec.get(k) != resolved.get(k) for k in named):
        chk.error(
            "not-normal-form",
            where,
            f"input {input_name!r} of task {task['name']!r}: producer, field and path must be "
            f"what {spec['from']!r} names ({ref.producer!r}, {ref.field!r}, "
            f"{list(ref.path)})",
        )
    elif spec["type"] != declared_type:
        chk.error(
            "input-type-mismatch",
            (*where, "type"),
            f"input {input_name!r} of task {task['name']!r} says type {spec['type']!r}, "
            f"but {spec['from']!r} is declared {declared_type}",
        )


def find_cycle(tasks: Sequence[dict[str, Any]]) -> list[str]:
    """A dependency cycle as ``[a, b, …, a]`` (declaration order decides which), or []."""
    names = {t["name"] for t in tasks}
    needs = {t["name"]: [n for n in t["needs"] if n in names] for t in tasks}
    # Kahn's algorithm: linear, and no cycle is the common case.
    indegree = dict.fromkeys(needs, 0)
    users: dict[str, list[str]] = {n: [] for n in needs}
    for name, deps in needs.items():
        for dep in deps:
            indegree[name] += 1
            users[dep].append(name)
    ready = [n for n, d in indegree.items() if d == 0]
    seen = 0
    while ready:
        node = ready.pop()
        seen += 1
        for user in users[node]:
            indegree[user] -= 1
            if indegree[user] == 0:
                ready.append(user)
    if seen == len(needs):
        return []
    # Only now pay for networkx, to name the cycle.
    import networkx as nx

    graph = nx.DiGraph()
    for name, deps in needs.items():
        if indegree[name] > 0:
            graph.add_node(name)
            for dep in deps:
                if indegree[dep] > 0:
                    graph.add_edge(name, dep)
    start = next(n for n in needs if indegree[n] > 0)
    edges = nx.find_cycle(graph, source=start)
    return [edges[0][0], *(v for _, v in edges)]

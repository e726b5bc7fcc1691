"""Expanding IR v3 fan-outs: literal, param and sequence maps, ``key``, matrices.

A *listed* fan-out is one whose instances the dispatcher computes and writes to
``STATE/instances/<task>.json`` (stage reads each instance's ``item`` from it):
a map over a literal, a param or a sequence, any map with ``key``, and every
matrix. A plain ``map = "producer.field"`` is not listed: stage reads its items
from the producer's record, as in IR v1/v2. Sources known before the run (no
producer field anywhere) are expanded once, when the dispatcher starts, and
``plan_admitted`` lists their instance keys; the others when the task is ready.

Matrix rules follow GitHub Actions (docs/spec/run.md, "Matrix"): the cartesian
product of the axes in declaration order (the first axis varies slowest); an
``exclude`` entry drops every combination that matches all the keys it names;
then each ``include`` entry adds its keys to every combination that matches it
on all the original axes it names (an added key may be overwritten by a later
entry, an axis value never), and becomes a combination of its own when it
matches none. At most :data:`MAX_INSTANCES` combinations.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from crucible.compile._fanout import MAX_INSTANCES, KeyProblem, describe_source, keyed_items
from crucible.core import atomic, canon
from crucible.core.errors import InputRefused

__all__ = [
    "INSTANCES_FORMAT",
    "FanoutFailed",
    "Fanouts",
    "check_fanout_params",
    "combination_key",
    "combinations",
    "is_listed",
    "is_static",
    "preview",
]

INSTANCES_FORMAT = "crucible.instances/1"
#: characters of an item kept in ``task_started.item`` (report and timeline show it)
PREVIEW_MAX = 80


class FanoutFailed(InputRefused):
    """The fan-out cannot be expanded: the mapped task fails before any instance
    runs, with this message as its note."""

    code = "fanout-failed"


def is_listed(task: Mapping[str, Any]) -> bool:
    """Instances come from the instances file (the same rule as stage's TaskView)."""
    return "matrix" in task or "key" in task or ("map" in task and not isinstance(task["map"], str))


def _sources(task: Mapping[str, Any]) -> list[Any]:
    if "matrix" in task:
        return [a["source"] for a in task["matrix"]["axes"]]
    return [task["map"]] if "map" in task else []


def is_static(task: Mapping[str, Any]) -> bool:
    """A listed fan-out whose items are known before the run (no producer field)."""
    return is_listed(task) and not any(isinstance(s, str) for s in _sources(task))


# -- sources --------------------------------------------------------------------


def _utf16_order(keys: Iterable[str]) -> list[str]:
    return sorted(keys, key=lambda k: k.encode("utf-16-be", "surrogatepass"))


def _source_value(source: Any, params: Mapping[str, Any], state: Path, what: str) -> Any:
    if isinstance(source, str):
        # lazy: stage is not loaded with this module; only _source_value() needs it
        from crucible import stage

        producer, _, field = source.rpartition(".")
        record = stage.load_result(state, producer)
        if record is None or record.get("status") != "passed":
            status = "not settled" if record is None else record.get("status")
            raise FanoutFailed(f"{what} {source}: {producer!r} is {status}, not passed")
        output = record.get("output")
        if not isinstance(output, dict) or field not in output:
            raise FanoutFailed(f"{what} {source}: {producer!r} carries no field {field!r}")
        return output[field]
    if "param" in source:
        return params.get(source["param"])
    if "sequence" in source:
        s = source["sequence"]
        return list(range(s["start"], s["start"] + s["count"] * s["step"], s["step"]))
    return source["items"]


def _map_pairs(
    task: Mapping[str, Any], params: Mapping[str, Any], state: Path
) -> list[tuple[str, Any]]:
    source = task["map"]
    value = _source_value(source, params, state, "map")
    if isinstance(value, list):
        pairs = [(str(i), v) for i, v in enumerate(value)]
    elif isinstance(value, dict):
        pairs = [(k, value[k]) for k in _utf16_order(value)]
    else:
        raise FanoutFailed(f"map {_describe(source)} is not an array or an object")
    if len(pairs) > MAX_INSTANCES:
        raise FanoutFailed(
            f"map {_describe(source)} has {len(pairs):,} items, more than {MAX_INSTANCES:,}"
        )
    if "key" in task:
        try:
            return keyed_items(pairs, task["key"])
        except KeyProblem as exc:
            raise FanoutFailed(f"key {task['key']!r}: {exc}") from None
    return pairs


def _describe(source: Any) -> str:

    return describe_source(source)


# -- matrix ---------------------------------------------------------------------


def combination_key(combination: Mapping[str, Any]) -> str:
    """``name=value`` for every member, in canonical member order, joined by ``,``:
    a string value as is, any other value as canonical JSON
    (``animal=cat,color=pink,fruit=apple``). Escaped as every key is when it
    becomes a path component."""
    parts = []
    for name in _utf16_order(combination):
        value = combination[name]
        text = value if isinstance(value, str) else canon.dumps(value).decode("utf-8")
        parts.append(f"{name}={text}")
    return ",".join(parts)


def combinations(
    axes: Sequence[tuple[str, Sequence[Any]]],
    exclude: Sequence[Mapping[str, Any]] = (),
    include: Sequence[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """The matrix's combinations (module doc), in order, matched in linear time
    (crucible.compile._matrix_rules). Raises :class:`FanoutFailed` above
    :data:`MAX_INSTANCES`."""
    # lazy: compile._matrix_rules is not loaded with this module; only combinations() needs it
    from crucible.compile._matrix_rules import TooManyCombinations, matrix_combinations

    try:
        return matrix_combinations(axes, exclude, include, limit=MAX_INSTANCES)
    except TooManyCombinations as exc:
        raise FanoutFailed(
            f"the matrix has {exc.count:,} combinations, more than the bound {MAX_INSTANCES:,}"
        ) from None


def _matrix_pairs(
    task: Mapping[str, Any], params: Mapping[str, Any], state: Path
) -> list[tuple[str, Any]]:
    matrix = task["matrix"]
    axes: list[tuple[str, Sequence[Any]]] = []
    for axis in matrix["axes"]:
        what = f"matrix axis {axis['name']!r}"
        value = _source_value(axis["source"], params, state, what)
        if not isinstance(value, list):
            raise FanoutFailed(f"{what} ({_describe(axis['source'])}) is not an array")
        axes.append((axis["name"], value))
    combos = combinations(axes, matrix.get("exclude", ()), matrix.get("include", ()))
    pairs: list[tuple[str, Any]] = []
    seen: set[str] = set()
    for combo in combos:
        key = combination_key(combo)
        if key in seen:
            raise FanoutFailed(f"the matrix has the combination {key!r} twice")
        seen.add(key)
        pairs.append((key, combo))
    return pairs


def expand(
    task: Mapping[str, Any], params: Mapping[str, Any], state: Path
) -> list[tuple[str, Any]]:
    """(key, item) of every instance of a listed fan-out, in instance order."""
    if "matrix" in task:
        return _matrix_pairs(task, params, state)
    return _map_pairs(task, params, state)


def preview(item: Any) -> str:
    """A short text of an item for events, reports and timelines."""
    text = canon.dumps(item).decode("utf-8")
    return text if len(text) <= PREVIEW_MAX else text[: PREVIEW_MAX - 1] + "…"


def write_instances(state: Path, task: str, pairs: Sequence[tuple[str, Any]]) -> None:
    # lazy: stage is not loaded with this module; only write_instances() needs it
    from crucible.stage import instances_path

    path = instances_path(state, task)
    os.makedirs(path.parent, exist_ok=True)
    doc = {
        "format": INSTANCES_FORMAT,
        "task": task,
        "instances": [{"key": k, "item": v} for k, v in pairs],
    }
    atomic.write_bytes(path, canon.dumps(doc))


# -- the dispatcher's view ---------------------------------------------------------


class Fanouts:
    """The listed fan-outs of one run: static ones expanded at construction
    (before ``plan_admitted``), the others when :meth:`keys` is first asked."""

    def __init__(self, plan: Mapping[str, Any], params: Mapping[str, Any], state: Path) -> None:
        self.tasks = {t["name"]: t for t in plan["tasks"] if is_listed(t)}
        self.params = params
        self.state = state
        self._keys: dict[str, list[str]] = {}
        self._failed: dict[str, str] = {}
        #: (task, key) -> preview of the item, for task_started
        self.previews: dict[tuple[str, str], str] = {}
        for name, task in self.tasks.items():
            if is_static(task):
                self._expand(name)

    def _expand(self, name: str) -> None:
        try:
            pairs = expand(self.tasks[name], self.params, self.state)
        except FanoutFailed as exc:
            self._failed[name] = exc.message
            return
        write_instances(self.state, name, pairs)
        self._keys[name] = [k for k, _ in pairs]
        self.remember_previews(name, pairs)

    def remember_previews(self, name: str, pairs: Iterable[tuple[str, Any]]) -> None:
        """Keep each instance's item preview for its ``task_started`` (a plain
        producer map's items too, which stage reads from the producer's record)."""
        for k, item in pairs:
            try:
                self.previews[(name, k)] = preview(item)
            except canon.CanonError:  # a preview is never worth failing a task over
                continue

    def listed(self, name: str) -> bool:
        return name in self.tasks

    def keys(self, name: str) -> list[str]:
        """The instance keys of ``name``; raises :class:`FanoutFailed` with the note."""
        if name not in self._keys and name not in self._failed:
            self._expand(name)
        if name in self._failed:
            raise FanoutFailed(self._failed[name])
        return self._keys[name]

    def items(self, name: str) -> dict[str, Any]:
        """Instance key -> item of a listed fan-out (expanded again: only a task
        whose condition reads ``item`` asks, once per session)."""
        return dict(expand(self.tasks[name], self.params, self.state))

    def annotate_admitted(self, tasks: list[dict[str, Any]]) -> None:
        """``plan_admitted``'s task entries: the instance keys of each static
        fan-out, or the note of one that cannot expand."""
        for entry in tasks:
            name = entry["name"]
            if name in self._keys:
                entry["instances"] = self._keys[name]
            elif name in self._failed:
                entry["fanout_error"] = self._failed[name]
            task = self.tasks.get(name)
            if task is not None and "matrix" in task:
                entry["matrix"] = [a["name"] for a in task["matrix"]["axes"]]


def check_fanout_params(plan: Mapping[str, Any], params: Mapping[str, Any]) -> None:
    """Admission: a param a map or matrix axis ranges over must hold an array (or,
    for a map, an object). Compile checked defaults; this checks what the run got."""
    for task in plan["tasks"]:
        for source, axis in _param_sources(task):
            name = source["param"]
            value = params.get(name)
            ok = isinstance(value, list) or (isinstance(value, dict) and not axis)
            if not ok:
                what = "a matrix axis" if axis else "map"
                need = "an array" if axis else "an array or an object"
                raise InputRefused(
                    f"task {task['name']!r} fans out over params.{name} ({what}), "
                    f"which must be {need}",
                    where=f"params.{name}",
                )


def _param_sources(task: Mapping[str, Any]) -> list[tuple[dict[str, Any], bool]]:
    out = []
    source = task.get("map")
    if isinstance(source, dict) and "param" in source:
        out.append((source, False))
    for axis in task.get("matrix", {}).get("axes", []):
        if isinstance(axis["source"], dict) and "param" in axis["source"]:
            out.append((axis["source"], True))
    return out

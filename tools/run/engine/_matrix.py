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
from collections.abc import Container, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from crucible.compile import (
    MAX_INSTANCES,
    KeyProblem,
    SequenceProblem,
    check_sequence_param_values,
    describe_source,
    keyed_items,
    sequence_values,
)
from crucible.core import atomic, canon
from crucible.core.errors import InputRefused
from crucible.core.plan import ParamSource, Plan, Ref, SequenceSource, Source, Task
from crucible.core.refs import RefMissing, parse_ref
from crucible.run.engine._folds import (
    Fold,
    FoldProblem,
    FoldSkipped,
    fold_pairs,
    read_fold,
    unique_keys,
)

__all__ = [
    "INSTANCES_FORMAT",
    "FanoutFailed",
    "FanoutSkipped",
    "Fanouts",
    "check_fanout_params",
    "combination_key",
    "combinations",
    "is_listed",
    "is_static",
    "mapped_tasks",
    "preview",
]

INSTANCES_FORMAT = "crucible.instances/1"
#: characters of an item kept in ``task_started.item`` (report and timeline show it)
PREVIEW_MAX = 80


class FanoutFailed(InputRefused):
    """The fan-out cannot be expanded: the mapped task fails before any instance
    runs, with this message as its note."""

    code = "fanout-failed"


class FanoutSkipped(FanoutFailed):
    """``join = "all"`` and an instance of the mapped task a map or axis reads did
    not pass: the fan-out is skipped (with its skip propagation), as a task is
    whose need did not pass."""

    code = "fanout-skipped"


def is_listed(task: Task, mapped: Container[str] = ()) -> bool:
    """Instances come from the instances file (the model's rule, as stage's
    TaskView reads it): every source but a plain ``producer.field`` of an
    unmapped producer (``mapped``: the plan's mapped tasks)."""
    ref = task.map_ref
    return task.listed or (ref is not None and ref.producer in mapped)


def mapped_tasks(plan: Plan) -> frozenset[str]:
    return frozenset(t.name for t in plan.tasks if t.fans_out)


def _sources(task: Task) -> list[Source]:
    if task.matrix is not None:
        return [a.source for a in task.matrix.axes]
    return [task.map] if task.map is not None else []


def _raw(source: Source) -> Any:
    """A source in its plan spelling (what the compiler's helpers and the notes read)."""
    return source.text if isinstance(source, Ref) else source.to_json()


def is_static(task: Task) -> bool:
    """A listed fan-out whose items are known before the run (no producer field)."""
    return is_listed(task) and not any(isinstance(s, Ref) for s in _sources(task))


# -- sources --------------------------------------------------------------------


def _utf16_order(keys: Iterable[str]) -> list[str]:
    return sorted(keys, key=lambda k: k.encode("utf-16-be", "surrogatepass"))


def _source_value(
    source: Any, params: Mapping[str, Any], state: Path, what: str, task: Task
) -> Any:
    if isinstance(source, str):
        return _producer_value(source, state, what, task)
    if "param" in source:
        return params.get(source["param"])
    if "sequence" in source:
        try:
            return sequence_values(source["sequence"], params, limit=MAX_INSTANCES)
        except SequenceProblem as exc:
            raise FanoutFailed(f"{what} {_describe(source)}: {exc}") from None
    return source["items"]


def _producer_value(source: str, state: Path, what: str, task: Task) -> Any:
    """An unmapped producer's field (at the reference's path, edition 4), or a
    mapped producer's fold (crucible.run.engine._folds)."""
    # lazy: stage is not loaded with this module; only _producer_value() needs it
    from crucible import stage

    ref = parse_ref(source, task.needs)
    producer, field = ref.producer, ref.field
    record = stage.load_result(state, producer)
    if record is not None and "keys" in record:  # a mapped producer's aggregate
        try:
            return read_fold(
                stage.load_all(state, producer),
                record["keys"],
                producer,
                field,
                settled=task.join == "settled",
                what=f"{what} {source}",
            )
        except FoldSkipped as exc:
            raise FanoutSkipped(exc.message) from None
        except FoldProblem as exc:
            raise FanoutFailed(exc.message) from None
    if record is None or record.get("status") != "passed":
        status = "not settled" if record is None else record.get("status")
        raise FanoutFailed(f"{what} {source}: {producer!r} is {status}, not passed")
    output = record.get("output")
    if not isinstance(output, dict) or field not in output:
        raise FanoutFailed(f"{what} {source}: {producer!r} carries no field {field!r}")
    try:
        return ref.at(output[field])
    except RefMissing as exc:
        raise FanoutFailed(f"{what}: {exc.message}") from None


def _map_pairs(task: Task, params: Mapping[str, Any], state: Path) -> list[tuple[str, Any]]:
    assert task.map is not None  # a listed task without a matrix maps
    source = _raw(task.map)
    value = _source_value(source, params, state, "map", task)
    if isinstance(value, Fold):
        pairs = _pairs_of(value, f"map {source}")
    elif isinstance(value, list):
        pairs = [(str(i), v) for i, v in enumerate(value)]
    elif isinstance(value, dict):
        pairs = [(k, value[k]) for k in _utf16_order(value)]
    else:
        raise FanoutFailed(f"map {_describe(source)} is not an array or an object")
    if len(pairs) > MAX_INSTANCES:
        raise FanoutFailed(
            f"map {_describe(source)} has {len(pairs):,} items, more than {MAX_INSTANCES:,}"
        )
    if task.key is not None:
        try:
            pairs = keyed_items(pairs, task.key)
        except KeyProblem as exc:
            raise FanoutFailed(f"key {task.key!r}: {exc}") from None
    if isinstance(value, Fold) and task.key is None:
        try:
            unique_keys(pairs, f"map {source}")
        except FoldProblem as exc:
            raise FanoutFailed(exc.message) from None
    return pairs


def _pairs_of(fold: Fold, what: str) -> list[tuple[str, Any]]:
    try:
        return fold_pairs(fold, what)
    except FoldProblem as exc:
        raise FanoutFailed(exc.message) from None


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
    from crucible.compile import TooManyCombinations, matrix_combinations

    try:
        return matrix_combinations(axes, exclude, include, limit=MAX_INSTANCES)
    except TooManyCombinations as exc:
        raise FanoutFailed(
            f"the matrix has {exc.count:,} combinations, more than the bound {MAX_INSTANCES:,}"
        ) from None


def _matrix_pairs(task: Task, params: Mapping[str, Any], state: Path) -> list[tuple[str, Any]]:
    matrix = task.matrix
    assert matrix is not None
    axes: list[tuple[str, Sequence[Any]]] = []
    for axis in matrix.axes:
        what = f"matrix axis {axis.name!r}"
        source = _raw(axis.source)
        value = _source_value(source, params, state, what, task)
        if isinstance(value, Fold):  # every instance's elements (or value), in item order
            value = [v for _, v in _pairs_of(value, f"{what} {source}")]
        if not isinstance(value, list):
            raise FanoutFailed(f"{what} ({_describe(source)}) is not an array")
        axes.append((axis.name, value))
    combos = combinations(axes, matrix.exclude, matrix.include)
    pairs: list[tuple[str, Any]] = []
    seen: set[str] = set()
    for combo in combos:
        key = combination_key(combo)
        if key in seen:
            raise FanoutFailed(f"the matrix has the combination {key!r} twice")
        seen.add(key)
        pairs.append((key, combo))
    return pairs


def expand(task: Task, params: Mapping[str, Any], state: Path) -> list[tuple[str, Any]]:
    """(key, item) of every instance of a listed fan-out, in instance order."""
    if task.matrix is not None:
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

    def __init__(self, plan: Plan, params: Mapping[str, Any], state: Path) -> None:
        self.tasks = {t.name: t for t in plan.tasks if plan.listed(t.name)}
        self.params = params
        self.state = state
        self._keys: dict[str, list[str]] = {}
        self._failed: dict[str, str] = {}
        #: the refusal itself (FanoutSkipped settles the task skipped, not failed)
        self._refused: dict[str, FanoutFailed] = {}
        #: task -> the preview of each instance's item, in instance order, for
        #: its first task_started (then dropped); a list, not a dict by key:
        #: ~60 bytes an instance instead of ~200 (issue 33, a million of them)
        self.previews: dict[str, list[str | None]] = {}
        for name, task in self.tasks.items():
            if is_static(task):
                self._expand(name)

    def _expand(self, name: str) -> None:
        try:
            pairs = expand(self.tasks[name], self.params, self.state)
        except FanoutFailed as exc:
            self._failed[name] = exc.message
            self._refused[name] = exc
            return
        write_instances(self.state, name, pairs)
        self._keys[name] = [k for k, _ in pairs]
        self.remember_previews(name, pairs)

    def remember_previews(self, name: str, pairs: Iterable[tuple[str, Any]]) -> None:
        """Keep each instance's item preview for its ``task_started`` (a plain
        producer map's items too, which stage reads from the producer's record),
        by its index in the instance order."""
        found: list[str | None] = []
        for _, item in pairs:
            try:
                found.append(preview(item))
            except canon.CanonError:  # a preview is never worth failing a task over
                found.append(None)
        self.previews[name] = found

    def take_preview(self, name: str, index: int) -> str | None:
        """The preview of instance ``index`` of ``name``, once (then dropped)."""
        found = self.previews.get(name)
        if found is None or not 0 <= index < len(found):
            return None
        text, found[index] = found[index], None
        return text

    def listed(self, name: str) -> bool:
        return name in self.tasks

    def keys(self, name: str) -> list[str]:
        """The instance keys of ``name``; raises :class:`FanoutFailed` with the note."""
        if name not in self._keys and name not in self._failed:
            self._expand(name)
        if name in self._failed:
            raise self._refused.get(name) or FanoutFailed(self._failed[name])
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
            if task is not None and task.matrix is not None:
                entry["matrix"] = [a.name for a in task.matrix.axes]


def check_fanout_params(plan: Plan, params: Mapping[str, Any]) -> None:
    """Admission: a param a map or matrix axis ranges over must hold an array (or,
    for a map, an object). Compile checked defaults; this checks what the run got."""
    for task in plan.tasks:
        for seq in _sequence_sources(task):
            try:
                check_sequence_param_values(seq, params)
            except SequenceProblem as exc:
                raise InputRefused(
                    f"task {task.name!r} fans out over a sequence: {exc}",
                    where=f"params.{exc.param}" if exc.param else None,
                ) from None
        for source, axis in _param_sources(task):
            name = source.param
            value = params.get(name)
            ok = isinstance(value, list) or (isinstance(value, dict) and not axis)
            if not ok:
                what = "a matrix axis" if axis else "map"
                need = "an array" if axis else "an array or an object"
                raise InputRefused(
                    f"task {task.name!r} fans out over params.{name} ({what}), "
                    f"which must be {need}",
                    where=f"params.{name}",
                )


def _param_sources(task: Task) -> list[tuple[ParamSource, bool]]:
    out = []
    if isinstance(task.map, ParamSource):
        out.append((task.map, False))
    for axis in task.matrix.axes if task.matrix is not None else ():
        if isinstance(axis.source, ParamSource):
            out.append((axis.source, True))
    return out


def _sequence_sources(task: Task) -> list[dict[str, Any]]:
    """The plan-form sequences a task's map or matrix axes range over."""
    return [s.to_json()["sequence"] for s in _sources(task) if isinstance(s, SequenceSource)]

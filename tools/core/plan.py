"""The plan IR as typed, frozen values: one reader of a plan's JSON for every tool.

:meth:`Plan.from_json` reads the JSON-shaped plan (docs/spec/plan-ir.md,
docs/schemas/plan-v*.json) once, refuses a member no IR version of that plan
knows (:class:`PlanShapeError`, exit 1, located by its JSON path) and applies
every default of an absent member here, in one place; :meth:`Plan.to_json`
writes the plan back in normal form, so a plan in normal form (every compiled
plan, every golden plan) round-trips byte for byte through canonical JSON.
Readers use attributes (``task.timeout``, ``task.join``), never
``task.get("join", "all")``. References (``"producer.field"`` with element and
member steps) are parsed by one parser, crucible.core.refs (:func:`parse`).

A new plan member is: a field on its class, a line in ``from_json`` and one in
``to_json``; a task member's name and edition are core.contract's
``TASK_KEYS_SINCE`` (tests/core/test_plan_model.py holds the fields to it).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Container, Iterator, Mapping
from typing import Any, Literal, TypeAlias, TypeVar

from crucible.core.contract import (
    IR_VERSION_OF_EDITION,
    JOINS,
    KINDS,
    SUPPORTED_EDITIONS,
    SUPPORTED_VERSIONS,
    TASK_KEYS_SINCE,
    TYPES,
)
from crucible.core.errors import InputRefused, Location, UnsupportedVersion
from crucible.core.refs import Ref, RefSyntax, parse_ref
from crucible.core.structs import dataclass, field

__all__ = [
    "PLAN",
    "PLAN_MEMBERS",
    "TASK_MEMBERS",
    "WORKFLOW_MEMBERS",
    "Axis",
    "Bound",
    "Expression",
    "Input",
    "ItemsSource",
    "Loop",
    "Matrix",
    "Output",
    "Param",
    "ParamSource",
    "Plan",
    "PlanShapeError",
    "Publish",
    "Ref",
    "Resources",
    "Retry",
    "SequenceSource",
    "Source",
    "Task",
    "Workflow",
    "in_plan",
    "parse",
    "source_json",
    "split_ref",
]

#: the display name of the plan in errors raised where only its value is known;
#: the command edge names the file (``CrucibleError.name_source(name, placeholder=PLAN)``)
PLAN = "plan"

#: a JSON value the author wrote (a literal fan-out item, a param default, a
#: matrix entry): kept as parsed, never interpreted by the model
JsonValue: TypeAlias = Any


def in_plan(path: str | None = None) -> Location:
    """A location in the plan: its JSON path, or the plan itself."""
    return Location(PLAN, path=path)


class PlanShapeError(InputRefused):
    """A plan member that is unknown, missing or of the wrong shape (exit 1)."""

    code = "plan-shape"


# -- member tables --------------------------------------------------------------------

#: top-level members by the IR version that introduced them
PLAN_MEMBERS: dict[str, int] = {"version": 1, "edition": 1, "workflow": 1, "tasks": 1, "loop": 3}
#: workflow members by the IR version that introduced them
WORKFLOW_MEMBERS: dict[str, int] = {
    "name": 1,
    "description": 1,
    "params": 1,
    "resolved_from": 1,
    "outputs": 3,
    "publish": 3,
    # an accounted pack's bounds and workflow record (docs/spec/export.md)
    "limits": 3,
    "record": 3,
}
#: task members by the IR version that introduced them: the version the edition
#: that brought each key compiles to (the one table: core.contract.TASK_KEYS_SINCE)
TASK_MEMBERS: dict[str, int] = {
    key: IR_VERSION_OF_EDITION[edition] for key, edition in TASK_KEYS_SINCE.items()
}
_PARAM_MEMBERS = frozenset({"type", "default", "description"})
_INPUT_MEMBERS = frozenset({"from", "producer", "field", "path", "type"})
_RETRY_MEMBERS = frozenset(
    {"limit", "delay", "factor", "max_delay", "on_timeout", "on_exit", "when"}
)
_RESOURCE_MEMBERS = ("cpus", "memory", "gpu")
_MATRIX_MEMBERS = frozenset({"axes", "exclude", "include"})
_LOOP_MEMBERS = frozenset(
    {
        "body",
        "score",
        "metric",
        "direction",
        "max_revisions",
        "min_delta",
        "history_bytes",
        "target",
        "patience",
        "time_budget",
    }
)


def _known(members: Mapping[str, int], version: int) -> frozenset[str]:
    return frozenset(k for k, since in members.items() if since <= version)


_TASK_KNOWN = {v: _known(TASK_MEMBERS, v) for v in SUPPORTED_VERSIONS}
_WORKFLOW_KNOWN = {v: _known(WORKFLOW_MEMBERS, v) for v in SUPPORTED_VERSIONS}
_PLAN_KNOWN = {v: _known(PLAN_MEMBERS, v) for v in SUPPORTED_VERSIONS}


# -- small readers ----------------------------------------------------------------------


def _fail(path: str, message: str) -> PlanShapeError:
    return PlanShapeError(message, where=in_plan(path))


def _obj(value: object, path: str, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(path, f"{what} must be an object")
    return value


def _no_unknown(raw: Mapping[str, Any], known: frozenset[str], path: str, what: str) -> None:
    unknown = raw.keys() - known
    if unknown:
        key = min(unknown)
        raise _fail(f"{path}.{key}", f"unknown member {key!r} in {what}")


def _str(value: object, path: str, what: str) -> str:
    if not isinstance(value, str):
        raise _fail(path, f"{what} must be a string")
    return value


def _opt_str(raw: Mapping[str, Any], key: str, path: str) -> str | None:
    value = raw.get(key)
    return None if value is None and key not in raw else _str(value, f"{path}.{key}", key)


def _int(value: object, path: str, what: str) -> int:
    if type(value) is not int:
        raise _fail(path, f"{what} must be an integer")
    return value


def _number(value: object, path: str, what: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(path, f"{what} must be a number")
    return value


def _bool(value: object, path: str, what: str) -> bool:
    if type(value) is not bool:
        raise _fail(path, f"{what} must be a boolean")
    return value


def _strs(value: object, path: str, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(path, f"{what} must be a list of strings")
    return tuple(value)


def _ints(value: object, path: str, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(type(v) is int for v in value):
        raise _fail(path, f"{what} must be a list of integers")
    return tuple(value)


# -- references and sources ------------------------------------------------------------


def split_ref(text: str, tasks: Container[str] | None = None) -> tuple[str, str] | None:
    """``"producer.field"`` → ``(producer, field)`` (crucible.core.refs: ``tasks``
    decide which dot ends the producer); None when ``text`` is no reference."""
    try:
        ref = parse_ref(text, tasks)
    except RefSyntax:
        return None
    return ref.producer, ref.field


def parse(text: object, where: str | None = None, tasks: Container[str] | None = None) -> Ref:
    """The reference ``text`` names (crucible.core.refs, the one parser: producer,
    field and element/member path; ``tasks`` decide which dot ends the producer);
    :class:`PlanShapeError` at ``where`` when it is none."""
    try:
        return parse_ref(text, tasks)
    except RefSyntax as exc:  # what is wrong inside a path; the form says the rest
        why = f": {exc.message}" if isinstance(text, str) and "[" in text else ""
        raise PlanShapeError(
            f"expected 'producer.field', got {text!r}{why}", where=in_plan(where)
        ) from None


@dataclass(frozen=True, slots=True)
class ItemsSource:
    """A literal fan-out source: the items (an array, or an object keyed by name)."""

    items: JsonValue

    def to_json(self) -> dict[str, Any]:
        return {"items": self.items}


@dataclass(frozen=True, slots=True)
class ParamSource:
    """A fan-out over the value of a param."""

    param: str

    def to_json(self) -> dict[str, Any]:
        return {"param": self.param}


#: a sequence bound: a number, or the value of a param (``{"param": NAME}``)
Bound: TypeAlias = int | ParamSource


@dataclass(frozen=True, slots=True)
class SequenceSource:
    """Integers from ``start`` by ``step``: ``count`` of them, or up to ``end``
    (the plan keeps the one the manifest wrote when a bound reads a param;
    compile normalizes an all-number sequence to ``count``). ``format``: the
    printf-style text each value becomes (None: the integers themselves)."""

    start: Bound
    step: int
    count: Bound | None = None
    end: Bound | None = None
    format: str | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"start": _bound_json(self.start), "step": self.step}
        if self.count is not None:
            body["count"] = _bound_json(self.count)
        if self.end is not None:
            body["end"] = _bound_json(self.end)
        if self.format is not None:
            body["format"] = self.format
        return {"sequence": body}

    def values(self, params: Mapping[str, Any] | None = None) -> list[int] | list[str]:
        """The items, with the run's ``params`` for the bounds that read one (an
        ``end`` the step never reaches: none)."""

        def bound(b: Bound) -> int:
            return int((params or {})[b.param]) if isinstance(b, ParamSource) else b

        start = bound(self.start)
        if self.count is not None:
            count = bound(self.count)
        else:
            assert self.end is not None
            count = max(0, (bound(self.end) - start) // self.step + 1)
        numbers = [start + i * self.step for i in range(count)]
        if self.format is None:
            return numbers
        return [self.format % n for n in numbers]


def _bound_json(bound: Bound) -> object:
    return bound if isinstance(bound, int) else bound.to_json()


def _bound(value: object, path: str, what: str) -> Bound:
    if isinstance(value, dict):
        _no_unknown(value, frozenset({"param"}), path, what)
        return ParamSource(_str(value.get("param"), f"{path}.param", "param"))
    return _int(value, path, what)


_SEQUENCE_MEMBERS = frozenset({"count", "start", "step", "end", "format"})

#: what a fan-out (a task's ``map`` or a matrix axis) reads
Source: TypeAlias = Ref | ItemsSource | ParamSource | SequenceSource


def _source(value: object, path: str, version: int, needs: Container[str] = ()) -> Source:
    if isinstance(value, str):
        return parse(value, path, needs)
    if version < 3 or not isinstance(value, dict) or len(value) != 1:
        raise _fail(path, "a fan-out source must be 'producer.field' or {items|param|sequence}")
    ((tag, body),) = value.items()
    if tag == "items":
        if not isinstance(body, list | dict):
            raise _fail(f"{path}.items", "items must be an array or an object")
        return ItemsSource(body)
    if tag == "param":
        return ParamSource(_str(body, f"{path}.param", "param"))
    if tag == "sequence":
        sp = f"{path}.sequence"
        seq = _obj(body, sp, "sequence")
        _no_unknown(seq, _SEQUENCE_MEMBERS, sp, "sequence")
        if ("count" in seq) == ("end" in seq):
            raise _fail(sp, "a sequence has count or end (one of them)")
        return SequenceSource(
            start=_bound(seq.get("start"), f"{sp}.start", "start"),
            step=_int(seq.get("step"), f"{sp}.step", "step"),
            count=_bound(seq["count"], f"{sp}.count", "count") if "count" in seq else None,
            end=_bound(seq["end"], f"{sp}.end", "end") if "end" in seq else None,
            format=_opt_str(seq, "format", sp),
        )
    raise _fail(f"{path}.{tag}", f"unknown fan-out source {tag!r}")


def source_json(source: Source) -> object:
    """A fan-out source in its plan spelling."""
    return source.text if isinstance(source, Ref) else source.to_json()


# -- task members -----------------------------------------------------------------------


@dataclass(frozen=True)
class Input:
    """A declared input (IR v2+): the producer's field and its declared type."""

    ref: Ref
    type: str

    @property
    def producer(self) -> str:
        return self.ref.producer

    @property
    def field(self) -> str:
        return self.ref.field

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "from": self.ref.text,
            "producer": self.ref.producer,
            "field": self.ref.field,
            "type": self.type,
        }
        if self.ref.path:  # element/member steps (edition 4)
            out["path"] = list(self.ref.path)
        return out


def _input(value: object, path: str, needs: Container[str]) -> Input:
    raw = _obj(value, path, "an input")
    _no_unknown(raw, _INPUT_MEMBERS, path, "an input")
    ref = parse(raw.get("from"), f"{path}.from", needs)
    if (
        raw.get("producer", ref.producer) != ref.producer
        or raw.get("field", ref.field) != ref.field
        or list(raw.get("path", ())) != list(ref.path)
    ):
        raise _fail(path, "producer/field/path disagree with 'from'")
    type_ = raw.get("type", "any")
    if type_ not in TYPES:
        raise _fail(f"{path}.type", f"unknown type {type_!r}")
    return Input(ref, type_)


@dataclass(frozen=True, slots=True)
class Retry:
    """The retry policy (IR v3): every member written out in the plan."""

    limit: int
    delay: int | float
    factor: int | float
    max_delay: int | float
    on_timeout: bool
    #: retry only these exit codes (None: any failure)
    on_exit: tuple[int, ...] | None = None
    #: retry only when this condition over ``last`` holds, as written (None: always)
    when: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "limit": self.limit,
            "delay": self.delay,
            "factor": self.factor,
            "max_delay": self.max_delay,
            "on_timeout": self.on_timeout,
        }
        if self.on_exit is not None:
            out["on_exit"] = list(self.on_exit)
        if self.when is not None:
            out["when"] = self.when
        return out


def _retry(value: object, path: str) -> Retry:
    raw = _obj(value, path, "retry")
    _no_unknown(raw, _RETRY_MEMBERS, path, "retry")
    return Retry(
        limit=_int(raw.get("limit", 0), f"{path}.limit", "limit"),
        delay=_number(raw.get("delay", 0), f"{path}.delay", "delay"),
        factor=_number(raw.get("factor", 1), f"{path}.factor", "factor"),
        max_delay=_number(raw.get("max_delay", 0), f"{path}.max_delay", "max_delay"),
        on_timeout=_bool(raw.get("on_timeout", False), f"{path}.on_timeout", "on_timeout"),
        on_exit=_ints(raw["on_exit"], f"{path}.on_exit", "on_exit") if "on_exit" in raw else None,
        when=_opt_str(raw, "when", path),
    )


@dataclass(frozen=True, slots=True)
class Resources:
    """What one unit needs on its worker (IR v3); an amount of None is not asked for."""

    cpus: int | None = None
    memory: int | None = None
    gpu: int | None = None

    def to_json(self) -> dict[str, int]:
        return {k: v for k in _RESOURCE_MEMBERS if (v := getattr(self, k)) is not None}

    def amounts(self) -> dict[str, int]:
        """The amounts asked for, by name (an empty dict: none)."""
        return self.to_json()


def _resources(value: object, path: str) -> Resources:
    raw = _obj(value, path, "resources")
    _no_unknown(raw, frozenset(_RESOURCE_MEMBERS), path, "resources")
    return Resources(**{k: _int(v, f"{path}.{k}", k) for k, v in raw.items()})


@dataclass(frozen=True, slots=True)
class Axis:
    """One axis of a matrix: its name and the source of its values."""

    name: str
    source: Source


@dataclass(frozen=True, slots=True)
class Matrix:
    """A matrix fan-out (IR v3): axes in declaration order, exclude and include entries."""

    axes: tuple[Axis, ...]
    exclude: tuple[dict[str, JsonValue], ...] = ()
    include: tuple[dict[str, JsonValue], ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "axes": [{"name": a.name, "source": source_json(a.source)} for a in self.axes]
        }
        if self.exclude:
            out["exclude"] = list(self.exclude)
        if self.include:
            out["include"] = list(self.include)
        return out


def _entries(raw: Mapping[str, Any], key: str, path: str) -> tuple[dict[str, Any], ...]:
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
        raise _fail(f"{path}.{key}", f"{key} must be a list of objects")
    return tuple(value)


def _matrix(value: object, path: str, version: int, needs: Container[str] = ()) -> Matrix:
    raw = _obj(value, path, "matrix")
    _no_unknown(raw, _MATRIX_MEMBERS, path, "matrix")
    axes_raw = raw.get("axes")
    # an include-only matrix (no axes) runs exactly its include entries
    if not isinstance(axes_raw, list) or not (axes_raw or raw.get("include")):
        raise _fail(f"{path}.axes", "axes must be a list, non-empty unless include is")
    axes = []
    for i, a in enumerate(axes_raw):
        apath = f"{path}.axes[{i}]"
        axis = _obj(a, apath, "an axis")
        _no_unknown(axis, frozenset({"name", "source"}), apath, "an axis")
        axes.append(
            Axis(
                _str(axis.get("name"), f"{apath}.name", "name"),
                _source(axis.get("source"), f"{apath}.source", version, needs),
            )
        )
    return Matrix(tuple(axes), _entries(raw, "exclude", path), _entries(raw, "include", path))


# -- the task ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """One task of the plan. Members the plan may omit hold their default here
    (a class attribute: :func:`_task_checked` sets only the members a task has)."""

    name: str
    kind: Literal["command", "evaluate", "agent"]
    needs: tuple[str, ...] = ()
    join: Literal["all", "settled"] = "all"
    emits: Mapping[str, str] = field(default_factory=dict)
    emits_files: tuple[str, ...] = ()
    retries: int = 0
    epilogue: bool = False
    #: an argv (tuple) or a shell string; None for agents
    run: str | tuple[str, ...] | None = None
    map: Source | None = None
    #: seconds per attempt (None: no limit)
    timeout: int | float | None = None
    prompt: str | None = None
    description: str | None = None
    #: host variables passed through (edition 2+)
    env: tuple[str, ...] = ()
    #: declared inputs by name (IR v2+)
    inputs: Mapping[str, Input] = field(default_factory=dict)
    when: str | None = None
    on_failure: Literal["fail", "continue"] = "fail"
    allow_exit: tuple[int, ...] = ()
    retry: Retry | None = None
    #: seconds over all attempts (None: no deadline)
    deadline: int | float | None = None
    matrix: Matrix | None = None
    key: str | None = None
    parallelism: int | None = None
    #: as written (None: absent); :attr:`caches` is what it means
    cache: bool | None = None
    #: the params the task may read (None: every param)
    params: tuple[str, ...] | None = None
    #: None when the manifest had no ``resources`` (an empty one is kept)
    resources: Resources | None = None
    reads: tuple[str, ...] = ()
    sandbox: bool = False
    network: bool = False
    #: as written (None: absent, meaning "pass"); :attr:`skips_when_empty` is what it means
    on_empty: Literal["pass", "skip"] | None = None
    #: captured files freed once their direct dependants settled (run.md, "Temporary files")
    temp_files: tuple[str, ...] = ()

    # -- what the members mean -----------------------------------------------------

    @property
    def caches(self) -> bool:
        """The task cache may hold its results (docs/spec/cache.md): not ``cache = false``."""
        return self.cache is not False

    @property
    def map_ref(self) -> Ref | None:
        """The producer field a ``map`` reads, when it reads one."""
        return self.map if isinstance(self.map, Ref) else None

    @property
    def fans_out(self) -> bool:
        """One unit per instance: a ``map`` or a ``matrix``."""
        return self.map is not None or self.matrix is not None

    @property
    def listed(self) -> bool:
        """The dispatcher lists its instances in ``STATE/instances/<task>.json``: a
        matrix, a keyed map, a map whose source is not a producer field, or one
        with a path into it. A map over a mapped producer is listed too: the
        plan knows that (:meth:`Plan.listed`), not the task."""
        return (
            self.matrix is not None
            or self.key is not None
            or (self.map is not None and (not isinstance(self.map, Ref) or bool(self.map.path)))
        )

    @property
    def fanout_params(self) -> frozenset[str]:
        """The params its ``map`` or matrix axes read (a param source, a sequence
        bound): each instance receives its own element as ``item``, not these
        (docs/spec/cache.md, "Params")."""
        sources: list[Source] = [] if self.map is None else [self.map]
        if self.matrix is not None:
            sources.extend(a.source for a in self.matrix.axes)
        names: set[str] = set()
        for s in sources:
            if isinstance(s, ParamSource):
                names.add(s.param)
            elif isinstance(s, SequenceSource):
                bounds = (s.count, s.start, s.end)
                names.update(b.param for b in bounds if isinstance(b, ParamSource))
        return frozenset(names)

    @property
    def skips_when_empty(self) -> bool:
        """A fan-out with no instances settles ``skipped`` (``on_empty = "skip"``)."""
        return self.on_empty == "skip"

    @property
    def tolerated(self) -> bool:
        """A failure is tolerated (``on_failure = "continue"``)."""
        return self.on_failure == "continue"

    # -- JSON ------------------------------------------------------------------------

    @classmethod
    def from_json(cls, raw: object, path: str, version: int, *, checked: bool = False) -> Task:
        """The task the plan object ``raw`` (at JSON path ``path``) describes."""
        if checked:
            return _task_checked(raw, version, {})  # type: ignore[arg-type]
        return _task(raw, path, version)

    def to_json(self) -> dict[str, Any]:
        """The plan's task object, in normal form."""
        out: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "needs": list(self.needs),
            "join": self.join,
            "emits": dict(self.emits),
            "emits_files": list(self.emits_files),
            "retries": self.retries,
            "epilogue": self.epilogue,
        }
        if self.run is not None:
            out["run"] = self.run if isinstance(self.run, str) else list(self.run)
        if self.map is not None:
            out["map"] = source_json(self.map)
        optional = (
            ("timeout", self.timeout),
            ("prompt", self.prompt),
            ("description", self.description),
            ("when", self.when),
            ("deadline", self.deadline),
            ("key", self.key),
            ("parallelism", self.parallelism),
            ("cache", self.cache),
            ("on_empty", self.on_empty),
        )
        out.update((k, v) for k, v in optional if v is not None)
        if self.env:
            out["env"] = list(self.env)
        if self.inputs:
            out["inputs"] = {n: i.to_json() for n, i in self.inputs.items()}
        if self.on_failure != "fail":
            out["on_failure"] = self.on_failure
        if self.allow_exit:
            out["allow_exit"] = list(self.allow_exit)
        if self.retry is not None:
            out["retry"] = self.retry.to_json()
        if self.matrix is not None:
            out["matrix"] = self.matrix.to_json()
        if self.params is not None:
            out["params"] = list(self.params)
        if self.resources is not None:
            out["resources"] = self.resources.to_json()
        if self.reads:
            out["reads"] = list(self.reads)
        if self.sandbox:
            out["sandbox"] = True
        if self.network:
            out["network"] = True
        if self.temp_files:
            out["temp_files"] = list(self.temp_files)
        return out


#: the task members a checked plan holds as JSON arrays and the model as tuples
_TUPLE_MEMBERS = frozenset(
    {"needs", "emits_files", "env", "allow_exit", "params", "reads", "temp_files"}
)

_Built = TypeVar("_Built")


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while the tasks are built: they are acyclic
    values, so a collection frees none of them, yet the ~100,000 objects of a
    10,000-task plan set off a full one that walks the whole heap, the compiled
    plan included (~60 ms, as long as reading the plan's JSON at all;
    benchmarks/bench_plan_model.py). Collection resumes as it was, on any exit."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _built(cls: type[_Built], members: dict[str, Any]) -> _Built:
    """An instance of the frozen dataclass ``cls`` whose fields are ``members``
    (a field not in it reads its class default), made without running
    ``__init__``: a frozen ``__init__`` pays one ``object.__setattr__`` per field,
    35 of them per task, which was most of a checked 10,000-task plan's read
    (benchmarks/bench_plan_model.py). Only for members already of their type."""
    obj = object.__new__(cls)
    object.__setattr__(obj, "__dict__", members)
    return obj


def _task_checked(
    raw: dict[str, Any], version: int, shared: dict[tuple[str, str, str], Input]
) -> Task:
    """A task of a plan the compiler checked: every member already has its shape
    (compile's plan reader refuses the rest) and a member at its default is
    omitted (normal form), so the task holds the members present, each as its
    typed value, and its class defaults for the rest (the start-up of a
    10,000-task dispatch reads every task). ``shared``: the plan's inputs read so
    far, by reference, producer and type (the text alone does not say which dot
    ends the producer: each reader's needs do): a value several tasks read is
    one object."""
    members = {k: tuple(v) if k in _TUPLE_MEMBERS else v for k, v in raw.items()}
    run = members.get("run")
    if run is not None and not isinstance(run, str):
        members["run"] = tuple(run)
    inputs = raw.get("inputs")
    if inputs is None:
        members["inputs"] = {}
    else:
        members["inputs"] = {
            n: shared.get((i["from"], i["producer"], i["type"])) or _input_checked(i, shared)
            for n, i in inputs.items()
        }
    if "map" in raw:
        members["map"] = _source(raw["map"], "", version, members["needs"])
    if "retry" in raw:
        members["retry"] = _retry(raw["retry"], "")
    if "matrix" in raw:
        members["matrix"] = _matrix(raw["matrix"], "", version, members["needs"])
    if "resources" in raw:
        members["resources"] = Resources(**raw["resources"])
    return _built(Task, members)


def _input_checked(raw: dict[str, Any], shared: dict[tuple[str, str, str], Input]) -> Input:
    """A checked plan's input (its producer, field and path are written out),
    kept in ``shared`` (:func:`_task_checked`)."""
    path = raw.get("path")
    ref: dict[str, Any] = {"producer": raw["producer"], "field": raw["field"]}
    if path is not None:
        ref["path"] = tuple(path)
    made = shared[raw["from"], raw["producer"], raw["type"]] = _built(
        Input, {"ref": _built(Ref, ref), "type": raw["type"]}
    )
    return made


#: the members a task in normal form always has (compile writes them out)
_WRITTEN_OUT = ("name", "kind", "needs", "join", "emits", "emits_files", "retries", "epilogue")
#: the members :func:`_plainly_sound` knows, per IR version: a task with any
#: other is read by the located reader (:func:`_task`)
_PLAIN = {
    v: _TASK_KNOWN[v]
    & {*_WRITTEN_OUT, "run", "timeout", "prompt", "description", "env", "inputs", "map"}
    for v in SUPPORTED_VERSIONS
}
#: an input in normal form, without a path
_PLAIN_INPUT = frozenset({"from", "producer", "field", "type"})


def _is_strs(value: object) -> bool:
    return type(value) is list and all(type(v) is str for v in value)


def _plainly_sound(raw: object, version: int, refs: dict[str, Ref | None]) -> bool:
    """Whether :func:`_task` accepts ``raw``, a task in normal form with only
    the common members (``_PLAIN``; a ``map`` over a producer's field): then
    :func:`_task_checked` builds the same task without making a JSON path for
    each member it reads (a 10,000-task plan read strictly, as ``crucible-stage``
    does, costs about half as much). False decides nothing: the located reader
    reads the task and says what is wrong. ``refs``: references parsed so far
    (:func:`_plain_ref`). tests/core/test_plan_model.py holds the two readers
    to the same tasks."""
    if type(raw) is not dict or not raw.keys() <= _PLAIN[version]:
        return False
    if not all(k in raw for k in _WRITTEN_OUT):
        return False
    emits = raw["emits"]
    if (
        type(raw["name"]) is not str
        or raw["kind"] not in KINDS
        or raw["join"] not in JOINS
        or type(emits) is not dict
        or not all(t in TYPES for t in emits.values())
        or type(raw["retries"]) is not int
        or type(raw["epilogue"]) is not bool
        or not _is_strs(raw["needs"])
        or not _is_strs(raw["emits_files"])
        or ("env" in raw and not _is_strs(raw["env"]))
        or ("timeout" in raw and type(raw["timeout"]) not in (int, float))
        or ("prompt" in raw and type(raw["prompt"]) is not str)
        or ("description" in raw and type(raw["description"]) is not str)
        or ("map" in raw and _plain_ref(raw["map"], raw["needs"], refs) is None)
    ):
        return False
    run = raw.get("run")
    if run is not None and type(run) is not str and not _is_strs(run):
        return False
    if "inputs" not in raw:
        return True
    inputs = raw["inputs"]
    if type(inputs) is not dict:
        return False
    for spec in inputs.values():
        if type(spec) is not dict or spec.keys() != _PLAIN_INPUT or spec["type"] not in TYPES:
            return False
        ref = _plain_ref(spec["from"], raw["needs"], refs)
        if (
            ref is None
            or ref.path
            or ref.producer != spec["producer"]
            or ref.field != spec["field"]
        ):
            return False
    return True


def _plain_ref(text: object, needs: list[str], refs: dict[str, Ref | None]) -> Ref | None:
    """The reference ``text`` names (None: none), read with ``needs`` as the
    task names. A text with one dot and no ``[`` names the same reference
    whatever the task names are, so it is parsed once per plan (in ``refs``)."""
    if type(text) is not str:
        return None
    if text.count(".") == 1 and "[" not in text:
        if text not in refs:
            refs[text] = _ref_or_none(text)
        return refs[text]
    try:
        return parse_ref(text, needs)
    except RefSyntax:
        return None


def _ref_or_none(text: str) -> Ref | None:
    """The reference ``text`` names, None when it names none."""
    try:
        return parse_ref(text)
    except RefSyntax:
        return None


def _opt_number(raw: Mapping[str, Any], key: str, path: str) -> int | float | None:
    return _number(raw[key], f"{path}.{key}", key) if key in raw else None


def _task(value: object, path: str, version: int) -> Task:
    raw = _obj(value, path, "a task")
    _no_unknown(raw, _TASK_KNOWN[version], path, f"a version {version} plan task")
    name = raw.get("name")
    if not isinstance(name, str):
        raise _fail(f"{path}.name", "a task must have a name (a string)")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise _fail(f"{path}.kind", f"unknown kind {kind!r}")
    join = raw.get("join", "all")
    if join not in JOINS:
        raise _fail(f"{path}.join", f"unknown join {join!r}")
    emits = _obj(raw.get("emits", {}), f"{path}.emits", "emits")
    if not all(t in TYPES for t in emits.values()):
        raise _fail(f"{path}.emits", "emits must map fields to known types")
    run = raw.get("run")
    if run is not None and not isinstance(run, str):
        run = _strs(run, f"{path}.run", "run")
    inputs_raw = _obj(raw.get("inputs", {}), f"{path}.inputs", "inputs")
    on_failure = raw.get("on_failure", "fail")
    if on_failure not in ("fail", "continue"):
        raise _fail(f"{path}.on_failure", f"unknown on_failure {on_failure!r}")
    on_empty = raw.get("on_empty")
    if on_empty not in (None, "pass", "skip"):
        raise _fail(f"{path}.on_empty", f"unknown on_empty {on_empty!r}")
    needs = _strs(raw.get("needs", []), f"{path}.needs", "needs")
    return Task(
        name=name,
        kind=kind,
        needs=needs,
        join=join,
        emits=emits,
        emits_files=_strs(raw.get("emits_files", []), f"{path}.emits_files", "emits_files"),
        retries=_int(raw.get("retries", 0), f"{path}.retries", "retries"),
        epilogue=_bool(raw.get("epilogue", False), f"{path}.epilogue", "epilogue"),
        run=run,
        map=_source(raw["map"], f"{path}.map", version, needs) if "map" in raw else None,
        timeout=_opt_number(raw, "timeout", path),
        prompt=_opt_str(raw, "prompt", path),
        description=_opt_str(raw, "description", path),
        env=_strs(raw.get("env", []), f"{path}.env", "env"),
        inputs={n: _input(i, f"{path}.inputs.{n}", needs) for n, i in inputs_raw.items()},
        when=_opt_str(raw, "when", path),
        on_failure=on_failure,
        allow_exit=_ints(raw.get("allow_exit", []), f"{path}.allow_exit", "allow_exit"),
        retry=_retry(raw["retry"], f"{path}.retry") if "retry" in raw else None,
        deadline=_opt_number(raw, "deadline", path),
        matrix=_matrix(raw["matrix"], f"{path}.matrix", version, needs)
        if "matrix" in raw
        else None,
        key=_opt_str(raw, "key", path),
        parallelism=_int(raw["parallelism"], f"{path}.parallelism", "parallelism")
        if "parallelism" in raw
        else None,
        cache=_bool(raw["cache"], f"{path}.cache", "cache") if "cache" in raw else None,
        params=_strs(raw["params"], f"{path}.params", "params") if "params" in raw else None,
        resources=_resources(raw["resources"], f"{path}.resources") if "resources" in raw else None,
        reads=_strs(raw.get("reads", []), f"{path}.reads", "reads"),
        sandbox=_bool(raw.get("sandbox", False), f"{path}.sandbox", "sandbox"),
        network=_bool(raw.get("network", False), f"{path}.network", "network"),
        on_empty=on_empty,
        temp_files=_strs(raw.get("temp_files", []), f"{path}.temp_files", "temp_files"),
    )


# -- the workflow -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Param:
    """A declared param: its type, its default (when it has one), its description."""

    type: str
    default: JsonValue = None
    has_default: bool = False
    description: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        if self.has_default:
            out["default"] = self.default
        if self.description is not None:
            out["description"] = self.description
        return out


def _param(value: object, path: str) -> Param:
    raw = _obj(value, path, "a param")
    _no_unknown(raw, _PARAM_MEMBERS, path, "a param")
    type_ = raw.get("type")
    if type_ not in TYPES:
        raise _fail(f"{path}.type", f"unknown param type {type_!r}")
    return Param(
        type=type_,
        default=raw.get("default"),
        has_default="default" in raw,
        description=_opt_str(raw, "description", path),
    )


@dataclass(frozen=True, slots=True)
class Publish:
    """One ``[workflow.publish]`` destination: its ``task:glob`` sources."""

    sources: tuple[str, ...]
    settled: bool

    def split(self) -> tuple[tuple[str, str], ...]:
        """Each source as ``(task, glob)``."""
        return tuple((s.partition(":")[0], s.partition(":")[2]) for s in self.sources)

    def to_json(self) -> dict[str, Any]:
        return {"from": list(self.sources), "settled": self.settled}


def _publish(value: object, path: str) -> Publish:
    raw = _obj(value, path, "a publish destination")
    _no_unknown(raw, frozenset({"from", "settled"}), path, "a publish destination")
    sources = _strs(raw.get("from"), f"{path}.from", "from")
    if not all(":" in s for s in sources):
        raise _fail(f"{path}.from", "a publish source must be 'task:glob'")
    return Publish(sources, _bool(raw.get("settled", False), f"{path}.settled", "settled"))


@dataclass(frozen=True, slots=True)
class Expression:
    """A computed run result (``[workflow.outputs]``, edition 4): an expression
    over ``tasks.T.F`` and ``params``, as written (docs/spec/manifest.md)."""

    expression: str

    def to_json(self) -> dict[str, Any]:
        return {"expression": self.expression}


#: a run result: a reference (with its steps) or an expression
Output: TypeAlias = Ref | Expression


def _output(value: object, path: str, tasks: Container[str]) -> Output:
    if isinstance(value, dict):
        _no_unknown(value, frozenset({"expression"}), path, "an output")
        return Expression(_str(value.get("expression"), f"{path}.expression", "expression"))
    return parse(value, path, tasks)


@dataclass(frozen=True, slots=True)
class Workflow:
    """The plan's workflow: its name, params, and (IR v3) run results and published files."""

    name: str
    params: Mapping[str, Param] = field(default_factory=dict)
    description: str | None = None
    resolved_from: str | None = None
    outputs: Mapping[str, Output] = field(default_factory=dict)
    publish: Mapping[str, Publish] = field(default_factory=dict)
    #: an accounted pack's ``[workflow.limits]``, every bound written out (None: unaccounted)
    limits: Mapping[str, int] | None = None
    #: the workflow record's stages the pack maps to (docs/spec/export.md §3), as JSON
    record: tuple[Mapping[str, Any], ...] | None = None

    @property
    def accounted(self) -> bool:
        return self.limits is not None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "params": {n: p.to_json() for n, p in self.params.items()},
        }
        if self.description is not None:
            out["description"] = self.description
        if self.resolved_from is not None:
            out["resolved_from"] = self.resolved_from
        if self.outputs:
            out["outputs"] = {
                n: r.text if isinstance(r, Ref) else r.to_json() for n, r in self.outputs.items()
            }
        if self.publish:
            out["publish"] = {d: p.to_json() for d, p in self.publish.items()}
        if self.limits is not None:
            out["limits"] = dict(self.limits)
        if self.record is not None:
            out["record"] = [dict(s) for s in self.record]
        return out

    def defaults(self) -> dict[str, JsonValue]:
        """Every param's default, by name (params without one are left out)."""
        return {n: p.default for n, p in self.params.items() if p.has_default}


def _workflow(value: object, version: int, tasks: Container[str]) -> Workflow:
    raw = _obj(value, "$.workflow", "workflow")
    _no_unknown(raw, _WORKFLOW_KNOWN[version], "$.workflow", f"a version {version} workflow")
    params = _obj(raw.get("params", {}), "$.workflow.params", "params")
    outputs = _obj(raw.get("outputs", {}), "$.workflow.outputs", "outputs")
    publish = _obj(raw.get("publish", {}), "$.workflow.publish", "publish")
    return Workflow(
        name=_str(raw.get("name"), "$.workflow.name", "the workflow name"),
        params={n: _param(p, f"$.workflow.params.{n}") for n, p in params.items()},
        description=_opt_str(raw, "description", "$.workflow"),
        resolved_from=_opt_str(raw, "resolved_from", "$.workflow"),
        outputs={n: _output(r, f"$.workflow.outputs.{n}", tasks) for n, r in outputs.items()},
        publish={d: _publish(p, f"$.workflow.publish.{d}") for d, p in publish.items()},
        limits=_limits(raw),
        record=_record(raw),
    )


def _limits(raw: Mapping[str, Any]) -> Mapping[str, int] | None:
    if "limits" not in raw:
        return None
    limits = _obj(raw["limits"], "$.workflow.limits", "limits")
    for name, value in limits.items():
        if type(value) is not int or value < 1:
            raise _fail(f"$.workflow.limits.{name}", "a limit must be a positive integer")
    return dict(limits)


def _record(raw: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...] | None:
    """The record's stages, kept as JSON (compile checks their form and normal form)."""
    if "record" not in raw:
        return None
    stages = raw["record"]
    if not isinstance(stages, list):
        raise _fail("$.workflow.record", "the workflow record must be an array of stages")
    return tuple(_obj(s, f"$.workflow.record[{i}]", "a record stage") for i, s in enumerate(stages))


# -- the loop ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Loop:
    """The scored loop (IR v3, docs/spec/loop.md), defaults written out."""

    body: tuple[str, ...]
    score: str
    metric: str
    direction: Literal["max", "min"] = "max"
    max_revisions: int = 1
    min_delta: int | float = 0
    history_bytes: int = 65536
    target: int | float | None = None
    patience: int | None = None
    time_budget: int | float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "body": list(self.body),
            "score": self.score,
            "metric": self.metric,
            "direction": self.direction,
            "max_revisions": self.max_revisions,
            "min_delta": self.min_delta,
            "history_bytes": self.history_bytes,
        }
        for k in ("target", "patience", "time_budget"):
            if (v := getattr(self, k)) is not None:
                out[k] = v
        return out


def _loop(value: object) -> Loop:
    path = "$.loop"
    raw = _obj(value, path, "loop")
    _no_unknown(raw, _LOOP_MEMBERS, path, "loop")
    body = _strs(raw.get("body"), f"{path}.body", "loop.body")
    if not body:
        raise _fail(f"{path}.body", "loop.body must be a non-empty list of task names")
    direction = raw.get("direction", "max")
    if direction not in ("max", "min"):
        raise _fail(f"{path}.direction", f"unknown direction {direction!r}")
    patience = raw.get("patience")
    return Loop(
        body=body,
        score=_str(raw.get("score"), f"{path}.score", "loop.score"),
        metric=_str(raw.get("metric"), f"{path}.metric", "loop.metric"),
        direction=direction,
        max_revisions=_int(raw.get("max_revisions", 1), f"{path}.max_revisions", "max_revisions"),
        min_delta=_number(raw.get("min_delta", 0), f"{path}.min_delta", "min_delta"),
        history_bytes=_int(
            raw.get("history_bytes", 65536), f"{path}.history_bytes", "history_bytes"
        ),
        target=_opt_number(raw, "target", path),
        patience=None if patience is None else _int(patience, f"{path}.patience", "patience"),
        time_budget=_opt_number(raw, "time_budget", path),
    )


# -- the plan ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """A whole plan: its version and edition, workflow, tasks in declaration order
    and (IR v3) loop. Built once per run; every tool reads it, none mutates it."""

    version: int
    edition: int
    workflow: Workflow
    tasks: tuple[Task, ...]
    loop: Loop | None = None
    #: the tasks by name (built with the plan)
    by_name: Mapping[str, Task] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {t.name: t for t in self.tasks})

    def task(self, name: str) -> Task:
        """The task named ``name``; :class:`InputRefused` when there is none."""
        try:
            return self.by_name[name]
        except KeyError:
            raise InputRefused(f"task {name!r} is not in the plan", where=in_plan()) from None

    @property
    def order(self) -> tuple[str, ...]:
        """Task names in declaration order."""
        return tuple(t.name for t in self.tasks)

    def listed(self, name: str) -> bool:
        """Does the dispatcher list the instances of task ``name`` (:attr:`Task.listed`,
        or a map over a mapped producer's field, edition 4)?"""
        task = self.task(name)
        if task.listed:
            return True
        ref = task.map_ref
        producer = None if ref is None else self.by_name.get(ref.producer)
        return producer is not None and producer.fans_out

    @classmethod
    def from_json(cls, obj: object, *, checked: bool = False) -> Plan:
        """The plan the JSON value ``obj`` holds. Unknown members, and members of
        the wrong shape, are :class:`PlanShapeError`; an unsupported version or
        edition is :class:`UnsupportedVersion`. ``checked``: ``obj`` passed the
        compiler's plan checks, so shapes are not checked again. Cross-task rules
        (unknown needs, cycles) are the compiler's and stage's, not the model's."""
        raw = _obj(obj, "$", "a plan")
        version = raw.get("version")
        if type(version) is not int or version not in SUPPORTED_VERSIONS:
            raise UnsupportedVersion(
                f"plan version {version!r} is not supported "
                f"(supported: {', '.join(map(str, SUPPORTED_VERSIONS))})",
                where=in_plan("$.version"),
            )
        edition = raw.get("edition", 1)
        if type(edition) is not int or edition not in SUPPORTED_EDITIONS:
            raise UnsupportedVersion(
                f"edition {edition!r} is not supported "
                f"(supported: {', '.join(map(str, SUPPORTED_EDITIONS))})",
                where=in_plan("$.edition"),
            )
        if not checked:
            _no_unknown(raw, _PLAN_KNOWN[version], "$", f"a version {version} plan")
        tasks_raw = raw.get("tasks")
        if not isinstance(tasks_raw, list):
            raise _fail("$.tasks", "tasks must be a list")
        shared: dict[tuple[str, str, str], Input] = {}
        with _collector_paused():
            if checked:
                tasks = tuple(_task_checked(t, version, shared) for t in tasks_raw)
            else:
                refs: dict[str, Ref | None] = {}
                tasks = tuple(
                    _task_checked(t, version, shared)
                    if _plainly_sound(t, version, refs)
                    else _task(t, f"$.tasks[{i}]", version)
                    for i, t in enumerate(tasks_raw)
                )
        return cls(
            version=version,
            edition=edition,
            workflow=_workflow(
                raw.get("workflow", {"name": ""}), version, frozenset(t.name for t in tasks)
            ),
            tasks=tasks,
            loop=_loop(raw["loop"]) if "loop" in raw else None,
        )

    def to_json(self) -> dict[str, Any]:
        """The plan's JSON value in normal form (``canon.dumps`` of it is the plan's bytes)."""
        out: dict[str, Any] = {
            "version": self.version,
            "edition": self.edition,
            "workflow": self.workflow.to_json(),
            "tasks": [t.to_json() for t in self.tasks],
        }
        if self.loop is not None:
            out["loop"] = self.loop.to_json()
        return out

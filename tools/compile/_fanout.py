"""Edition-4 fan-out vocabulary and run results: checks and plan forms.

What a ``map`` ranges over (a producer field, a literal, a param, a sequence),
``matrix`` (axes, ``exclude``, ``include``), ``key``, ``parallelism``, and the
workflow's ``[workflow.publish]`` table (``[workflow.outputs]``: compile._results). Each check
records diagnostics on a :class:`~crucible.compile._checker.Checker` and returns the
plan form (docs/spec/manifest.md "Fan-out", docs/spec/plan-ir.md). Plan forms are
tagged objects so a plan never needs guessing; :func:`task_to_manifest` turns a plan
task's forms back into manifest spelling, so the strict plan reader can re-check a
plan task by compiling it again (normal form).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from crucible.compile import _checker as checker
from crucible.compile._checker import Checker
from crucible.compile._diagnostics import KeyPath
from crucible.compile._names import ident_problem
from crucible.compile._sequences import (
    SEQUENCE_KEYS,
    check_sequence,
    check_sequence_params,
    describe_sequence,
    sequence_size,
    sequence_to_manifest,
    sequence_values,
)
from crucible.core import canon
from crucible.core.refs import parse_ref

__all__ = [
    "MATRIX_RESERVED",
    "MAX_INSTANCES",
    "PUBLISH_MANIFEST",
    "KeyProblem",
    "check_fanout_graph",
    "check_fanout_task",
    "check_map_source",
    "check_publish",
    "describe_source",
    "fanout_producers",
    "is_fanout",
    "keyed_items",
    "task_to_manifest",
]

#: most instances one mapped task may have (a matrix's combinations, a sequence's
#: numbers). Our choice: GitHub and Tekton stop at 256; the dispatcher runs 10,000
#: instances within its memory budget, and 100,000 still fits (docs/spec/run.md).
MAX_INSTANCES = 100_000
#: matrix keys that are not axes (GitHub's spelling)
MATRIX_RESERVED = ("exclude", "include")
#: the manifest each published directory carries (``@``: never a captured file's
#: top-level name in practice, and the project's reserved leading character)
PUBLISH_MANIFEST = "@publish.json"


# -- sources ------------------------------------------------------------------


def check_map_source(
    chk: Checker, path: KeyPath, value: Any, what: str, *, axis: bool
) -> Any | None:
    """A map source (or a matrix axis, ``axis=True``) → its plan form:
    ``"producer.field"``, ``{"param": name}``, ``{"items": [...] | {...}}`` or
    ``{"sequence": {"start", "count", "step"}}``."""
    if isinstance(value, str):
        if value.startswith("params."):
            name = value[len("params.") :]
            if (problem := ident_problem("param", name)) is not None:
                chk.error("bad-ref", path, f"{what} {value!r}: {problem}")
                return None
            return {"param": name}
        return checker.check_ref(chk, path, value, what, paths=True)
    if isinstance(value, list | tuple):
        return _literal(chk, path, list(value), what)
    if isinstance(value, dict):
        keys = set(value)
        if "items" in keys:
            if keys != {"items"}:
                extra = sorted(keys - {"items"})[0]
                chk.error(
                    "unknown-key",
                    (*path, extra),
                    f"{what}: a table with items takes no other key (found {extra!r})",
                )
                return None
            items = value["items"]
            if isinstance(items, dict) and not axis:
                return _literal(chk, (*path, "items"), items, what)
            if isinstance(items, list | tuple):
                return _literal(chk, (*path, "items"), list(items), what)
            need = "an array" if axis else "an array or a table"
            chk.error(
                "matrix-axis-not-array" if axis else "wrong-type",
                (*path, "items"),
                f"{what}: items must be {need}, not {checker.type_name(items)}",
            )
            return None
        if keys and keys <= set(SEQUENCE_KEYS):
            return check_sequence(chk, path, value, what, limit=MAX_INSTANCES)
        if keys & {"count", "start", "end"}:  # a sequence with a key it does not take
            extra = sorted(keys - set(SEQUENCE_KEYS))[0]
            chk.error(
                "unknown-key",
                (*path, extra),
                f"{what}: a sequence takes {', '.join(SEQUENCE_KEYS)} (found {extra!r})",
            )
            return None
        chk.error(
            "bad-value",
            path,
            f"{what}: a table must be a sequence ({{count}} or {{start, end, step}}, "
            "with an optional format) "
            f"or {{items = ...}}, not keys {', '.join(sorted(map(str, keys))) or 'none'}",
        )
        return None
    chk.error(
        "matrix-axis-not-array" if axis else "wrong-type",
        path,
        f'{what} must be "producer.field", "params.NAME", an array or a table, '
        f"not {checker.type_name(value)}",
    )
    return None


def _literal(chk: Checker, path: KeyPath, items: Any, what: str) -> Any | None:
    if not checker.is_json_value(items):
        chk.error("bad-value", path, f"{what}: items must be JSON values (no dates or times)")
        return None
    if checker.json_depth(items) > checker.MAX_DEFAULT_DEPTH:
        chk.error(
            "bad-value",
            path,
            f"{what}: items are nested deeper than {checker.MAX_DEFAULT_DEPTH} levels",
        )
        return None
    n = len(items)
    if n > MAX_INSTANCES:
        chk.error("fanout-too-large", path, f"{what} lists {n} items, more than {MAX_INSTANCES:,}")
        return None
    return {"items": checker.to_json(items)}


def _to_manifest_source(source: Any) -> Any:
    """A plan source → its manifest spelling (the inverse of :func:`check_map_source`)."""
    if isinstance(source, dict) and len(source) == 1:
        if "param" in source and isinstance(source["param"], str):
            return f"params.{source['param']}"
        if "sequence" in source and isinstance(source["sequence"], dict):
            return sequence_to_manifest(source["sequence"])
        if "items" in source and isinstance(source["items"], list):
            return source["items"]
    return source  # a producer ref, {"items": {...}}, or something malformed: checked as is


def describe_source(source: Any) -> str:
    """A short human text for a source (graphs, notes)."""
    if isinstance(source, str):
        return source
    if "param" in source:
        return f"params.{source['param']}"
    if "sequence" in source:
        return describe_sequence(source["sequence"])
    items = source["items"]
    return f"{len(items)} item{'s' if len(items) != 1 else ''}"


# -- matrix, key, parallelism ---------------------------------------------------


def _check_matrix(chk: Checker, path: KeyPath, value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        chk.wrong_type(
            path,
            value,
            "matrix must be a table of axis = source (with optional exclude and include)",
        )
        return None
    axes: list[dict[str, Any]] = []
    ok = True
    for name, src in value.items():
        if name in MATRIX_RESERVED:
            continue
        if (problem := ident_problem("matrix axis", name)) is not None:
            chk.error("bad-name", (*path, name), problem)
            ok = False
            continue
        source = check_map_source(chk, (*path, name), src, f"matrix axis {name!r}", axis=True)
        if source is None:
            ok = False
            continue
        if isinstance(source, dict) and isinstance(source.get("items"), dict):
            chk.error(
                "matrix-axis-not-array", (*path, name), f"matrix axis {name!r} must be an array"
            )
            ok = False
            continue
        axes.append({"name": name, "source": source})
    if not axes and ok and not value.get("include"):
        # an include-only matrix (GitHub's ``matrix: {include: [...]}``) runs its entries
        chk.error(
            "matrix-no-axes",
            path,
            "matrix has no axes and no include entries (exclude and include are not axes)",
        )
        return None
    names = [a["name"] for a in axes]
    out: dict[str, Any] = {"axes": axes}
    for entry_key in MATRIX_RESERVED:
        if entry_key in value:
            entries = _matrix_entries(chk, (*path, entry_key), value[entry_key], entry_key, names)
            if entries is None:
                ok = False
            elif entries:
                out[entry_key] = entries
    if not ok:
        return None
    if not axes and not _include_only_distinct(chk, (*path, "include"), out["include"]):
        return None
    sizes = [_static_size(a["source"]) for a in axes]
    product = 1
    for size in sizes:
        product *= size if size is not None else 1
    if product > MAX_INSTANCES:
        chk.error(
            "fanout-too-large",
            path,
            f"matrix has {product:,} combinations, more than {MAX_INSTANCES:,}",
        )
        return None
    if None not in sizes and product + len(out.get("include", ())) > MAX_INSTANCES:
        # a static matrix whose includes may pass the bound: counted as the run
        # would (unmatched includes are combinations of their own)
        from crucible.compile._matrix_rules import TooManyCombinations, matrix_size

        axes_values = [(a["name"], _static_values(a["source"])) for a in axes]
        try:
            matrix_size(
                axes_values, out.get("exclude", ()), out.get("include", ()), limit=MAX_INSTANCES
            )
        except TooManyCombinations as exc:
            chk.error(
                "fanout-too-large",
                path,
                f"matrix has {exc.count:,} combinations with its include entries, "
                f"more than {MAX_INSTANCES:,}",
            )
            return None
    return out


def _include_only_distinct(chk: Checker, path: KeyPath, include: Sequence[Any]) -> bool:
    """An include-only matrix runs each entry as one combination, keyed by it: an
    entry repeated (as JSON compares: member order aside) would be one key twice."""
    seen: dict[bytes, int] = {}
    for i, entry in enumerate(include):
        text = canon.dumps(entry)
        if text in seen:
            chk.error(
                "duplicate-entry",
                (*path, i),
                f"matrix include[{i}] repeats include[{seen[text]}]; an include-only "
                "matrix runs each entry once, keyed by it",
            )
            return False
        seen[text] = i
    return True


def _static_values(source: Any) -> list[Any]:
    """The values of a source known before the run (a literal or a sequence)."""
    if "items" in source:
        return list(source["items"])
    return list(sequence_values(source["sequence"], {}, limit=MAX_INSTANCES))


def _static_size(source: Any) -> int | None:
    if isinstance(source, dict) and "items" in source:
        return len(source["items"])
    if isinstance(source, dict) and "sequence" in source:
        return sequence_size(source["sequence"])  # None when a bound reads a param
    return None


def _matrix_entries(
    chk: Checker, path: KeyPath, value: Any, what: str, axes: Sequence[str]
) -> list[dict[str, Any]] | None:
    if not isinstance(value, list | tuple):
        chk.wrong_type(path, value, f"matrix {what} must be an array of tables")
        return None
    out: list[dict[str, Any]] = []
    ok = True
    for i, entry in enumerate(value):
        epath = (*path, i)
        if not isinstance(entry, dict) or not entry:
            chk.error("wrong-type", epath, f"matrix {what}[{i}] must be a non-empty table")
            ok = False
            continue
        for k, v in entry.items():
            if what == "exclude" and k not in axes:
                chk.error(
                    "matrix-unknown-axis",
                    (*epath, k),
                    f"matrix exclude[{i}] names {k!r}, which is not an axis "
                    f"(axes: {', '.join(axes) or 'none'})",
                )
                ok = False
            elif (problem := ident_problem("matrix key", k)) is not None:
                chk.error("bad-name", (*epath, k), problem)
                ok = False
            elif not checker.is_json_value(v):
                chk.error("bad-value", (*epath, k), f"matrix {what}[{i}].{k} is not a JSON value")
                ok = False
            elif checker.json_depth(v) > checker.MAX_DEFAULT_DEPTH - 1:
                chk.error(
                    "bad-value",
                    (*epath, k),
                    f"matrix {what}[{i}].{k} is nested deeper than "
                    f"{checker.MAX_DEFAULT_DEPTH - 1} levels",
                )
                ok = False
        out.append(checker.to_json(dict(entry)))
    return out if ok else None


def is_fanout(task: Mapping[str, Any]) -> bool:
    return "map" in task or "matrix" in task


def check_fanout_task(
    chk: Checker, path: KeyPath, raw: Mapping[str, Any], task: dict[str, Any], edition: int
) -> None:
    """The edition-4 task keys ``map`` (new sources), ``matrix``, ``key``, ``parallelism``."""
    who = f"task {task['name']!r}" if task.get("name") else "the task"
    if "map" in raw:
        source = check_map_source(chk, (*path, "map"), raw["map"], "map", axis=False)
        if source is not None:
            task["map"] = source
    if "matrix" in raw:
        if "map" in raw:
            chk.error(
                "map-and-matrix",
                (*path, "matrix"),
                f"{who} has both map and matrix; a task fans out over one of them",
            )
        else:
            matrix = _check_matrix(chk, (*path, "matrix"), raw["matrix"])
            if matrix is not None:
                task["matrix"] = matrix
    if "key" in raw:
        key = raw["key"]
        if "map" not in raw:
            chk.error(
                "key-needs-map",
                (*path, "key"),
                f"{who} has key but no map (a matrix instance is keyed by its combination)",
            )
        elif not isinstance(key, str) or not key:
            chk.wrong_type((*path, "key"), key, "key must be the name of a field of each item")
        else:
            task["key"] = key
            source = task.get("map")
            if isinstance(source, dict) and "items" in source:
                _check_literal_keys(chk, (*path, "map"), source["items"], key, who)
    if "parallelism" in raw:
        value = raw["parallelism"]
        if not is_fanout(raw):
            chk.error(
                "parallelism-needs-fanout",
                (*path, "parallelism"),
                f"{who} has parallelism but no map or matrix",
            )
        elif type(value) is not int:
            chk.wrong_type((*path, "parallelism"), value, "parallelism must be an integer")
        elif not 1 <= value <= MAX_INSTANCES:
            chk.error(
                "bad-value",
                (*path, "parallelism"),
                f"parallelism must be between 1 and {MAX_INSTANCES}, not {value}",
            )
        else:
            task["parallelism"] = value


def _check_literal_keys(chk: Checker, path: KeyPath, items: Any, key: str, who: str) -> None:
    """``key`` over a literal: every problem the run would meet, found now."""
    pairs = list(items.items()) if isinstance(items, dict) else list(enumerate(items))
    try:
        keyed_items([(str(k), v) for k, v in pairs], key)
    except KeyProblem as exc:
        chk.error("key-invalid", path, f"{who}: {exc}")


class KeyProblem(ValueError):
    """Why a fan-out's items cannot be keyed (the mapped task fails before any
    instance runs); ``code`` names the rule."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def keyed_items(items: Sequence[tuple[str, Any]], key: str) -> list[tuple[str, Any]]:
    """(key, item) pairs keyed by each item's ``key`` field (a string, or an integer
    written in decimal). Raises :class:`KeyProblem` for an item that is not an
    object, lacks the field, has another type there, or repeats a key (the message
    names the first duplicate)."""
    out: list[tuple[str, Any]] = []
    seen: dict[str, str] = {}
    for position, item in items:
        if not isinstance(item, dict):
            raise KeyProblem(
                "key-not-object", f"item {position} is not an object, so it has no field {key!r}"
            )
        if key not in item:
            raise KeyProblem("key-missing", f"item {position} has no field {key!r}")
        value = item[key]
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise KeyProblem(
                "key-not-scalar",
                f"item {position}: field {key!r} is not a string or an integer",
            )
        text = value if isinstance(value, str) else str(value)
        if text in seen:
            raise KeyProblem(
                "key-duplicate",
                f"duplicate instance key {text!r} (field {key!r} of items {seen[text]} and {position})",
            )
        seen[text] = position
        out.append((text, item))
    return out


def task_to_manifest(raw: dict[str, Any]) -> dict[str, Any]:
    """A plan task's fan-out forms back in manifest spelling (see module doc)."""
    out = dict(raw)
    if "map" in out:
        out["map"] = _to_manifest_source(out["map"])
    matrix = out.get("matrix")
    if isinstance(matrix, dict) and isinstance(matrix.get("axes"), list):
        table: dict[str, Any] = {}
        for axis in matrix["axes"]:
            if isinstance(axis, dict) and isinstance(axis.get("name"), str):
                table[axis["name"]] = _to_manifest_source(axis.get("source"))
        for k in MATRIX_RESERVED:
            if k in matrix:
                table[k] = matrix[k]
        out["matrix"] = table
    return out


def fanout_producers(task: Mapping[str, Any]) -> dict[str, str]:
    """Producer task → the label of its fan-out edge (``map field``, ``axis name``).
    A source's producer is one of the task's needs, so they decide which dot ends
    it (crucible.core.refs: the same producer as the whole plan's names give)."""
    out: dict[str, str] = {}
    needs = task.get("needs", ())
    source = task.get("map")
    if isinstance(source, str):
        ref = parse_ref(source, needs)
        out[ref.producer] = "map " + source[len(ref.producer) + 1 :]
    for axis in task.get("matrix", {}).get("axes", []):
        if isinstance(axis["source"], str):
            producer = parse_ref(axis["source"], needs).producer
            out[producer] = (
                out[producer] + ", " if producer in out else ""
            ) + f"axis {axis['name']}"
    return out


# -- graph rules ----------------------------------------------------------------

_MAP_TYPES = ("array", "object", "any")
_AXIS_TYPES = ("array", "any")


def check_fanout_graph(
    chk: Checker,
    workflow: Mapping[str, Any],
    tasks: Sequence[dict[str, Any]],
    paths: Sequence[KeyPath],
) -> None:
    """Rules across tasks for the fan-out sources, outputs and publish entries."""
    params = workflow.get("params", {})
    by_name = {t["name"]: t for t in reversed(tasks)}
    for task, path in zip(tasks, paths, strict=True):
        # (edition 4 lets epilogues fan out too: rules.py refuses that below edition 4)
        source = task.get("map")
        if isinstance(source, dict) and "param" in source:
            _check_param_source(chk, (*path, "map"), task, source["param"], params, axis=False)
        if isinstance(source, dict) and "sequence" in source:
            what = f"map of task {task['name']!r}:"
            check_sequence_params(chk, (*path, "map"), source["sequence"], params, what)
        matrix = task.get("matrix")
        if matrix is None:
            continue
        for axis in matrix["axes"]:
            apath = (*path, "matrix", axis["name"])
            src = axis["source"]
            if isinstance(src, str):
                _check_axis_ref(chk, task, apath, axis["name"], src, by_name)
            elif "param" in src:
                _check_param_source(chk, apath, task, src["param"], params, axis=True)
            elif "sequence" in src:
                what = f"matrix axis {axis['name']!r} of task {task['name']!r}:"
                check_sequence_params(chk, apath, src["sequence"], params, what)
    from crucible.compile._results import check_outputs_graph  # the results' own rules

    check_outputs_graph(chk, workflow, by_name)
    _check_publish_graph(chk, workflow, by_name)
    # lazy: compile._task_params is not loaded with this module; only check_fanout_graph() needs it
    from crucible.compile._task_params import check_task_params

    check_task_params(chk, params, tasks, paths)


def _check_axis_ref(
    chk: Checker,
    task: Mapping[str, Any],
    path: KeyPath,
    axis: str,
    src: str,
    by_name: Mapping[str, dict[str, Any]],
) -> None:
    """A matrix axis reading a producer: its field (or the element/member a path
    names) must be an array, unless the producer fans out: then the axis ranges
    over every instance's elements (or values), in item order (run.md)."""
    from crucible.compile._rules import _producer_field  # _rules reaches _fanout's callers

    what = f"matrix axis {axis!r}"
    ref = _producer_field(chk, task, path, src, what, by_name, "map", edition=4)
    if ref is None or is_fanout(by_name[ref.producer]) or ref.path:
        return
    type_ = by_name[ref.producer]["emits"][ref.field]
    if type_ not in _AXIS_TYPES:
        chk.error(
            "matrix-axis-not-array",
            path,
            f"matrix axis {axis!r} of task {task['name']!r} reads "
            f"{src!r}, declared {type_}; an axis needs an array or any field",
        )


def _check_param_source(
    chk: Checker,
    path: KeyPath,
    task: Mapping[str, Any],
    name: str,
    params: Mapping[str, Any],
    *,
    axis: bool,
) -> None:
    what = f"matrix axis of task {task['name']!r}" if axis else f"map of task {task['name']!r}"
    if name not in params:
        known = ", ".join(sorted(params)) or "none"
        chk.error(
            "fanout-unknown-param",
            path,
            f"{what} reads params.{name}, which is not a declared param (declared: {known})",
        )
        return
    spec = params[name]
    allowed = _AXIS_TYPES if axis else _MAP_TYPES
    need = "an array" if axis else "an array or an object"
    code = "matrix-axis-not-array" if axis else "map-not-collection"
    if spec["type"] not in allowed:
        chk.error(
            code, path, f"{what} reads params.{name}, declared {spec['type']}; it needs {need}"
        )
        return
    if "default" in spec:
        default = spec["default"]
        ok = isinstance(default, list) or (isinstance(default, dict) and not axis)
        if not ok:
            chk.error(code, path, f"{what} reads params.{name}, whose default is not {need}")


# -- [workflow.publish] -----------------------------------------------------------


def check_publish(chk: Checker, path: KeyPath, value: Any) -> dict[str, Any]:
    """``[workflow.publish]``: destination dir → ``"task:glob"`` (or an array of
    them, or ``{from = ..., settled = bool}``). Plan form:
    ``{dest: {"from": ["task:glob", ...], "settled": bool}}``."""
    if not isinstance(value, dict):
        chk.wrong_type(path, value, 'publish must be a table of "dir/" = "task:glob"')
        return {}
    out: dict[str, Any] = {}
    for dest, spec in value.items():
        dpath = (*path, dest)
        norm = _check_dest(chk, dpath, dest)
        settled: Any = False
        sources: Any = spec
        if isinstance(spec, dict):
            chk.known_keys(dpath, spec, ("from", "settled"), f"publish entry {dest!r}")
            if "from" not in spec:
                chk.error("missing-key", dpath, f"publish entry {dest!r} has no from")
                continue
            sources = spec["from"]
            settled = spec.get("settled", False)
            if not isinstance(settled, bool):
                chk.wrong_type((*dpath, "settled"), settled, "settled must be a boolean")
                continue
        if isinstance(sources, str):
            sources = [sources]
        if not isinstance(sources, list | tuple) or not sources:
            chk.error(
                "wrong-type",
                dpath,
                f'publish entry {dest!r} must be "task:glob", a non-empty array of them '
                "or a table with from",
            )
            continue
        good = []
        for i, src in enumerate(sources):
            spath = (*dpath, i) if not isinstance(spec, str) else dpath
            if _check_publish_source(chk, spath, src):
                good.append(src)
        if norm is not None and len(good) == len(sources):
            if norm in out:
                chk.error("publish-overlap", dpath, f"publish destination {norm!r} is named twice")
                continue
            out[norm] = {"from": list(good), "settled": settled}
    names = sorted(out)
    for a, b in itertools.pairwise(names):
        if b.startswith(a + "/"):
            chk.error(
                "publish-overlap",
                (*path, b),
                f"publish destination {b!r} is inside {a!r}; destinations must not nest",
            )
    return out


def _bad_relative(text: str) -> bool:
    parts = text.split("/")
    return (
        not text
        or text.startswith("/")
        or "\\" in text
        or "\x00" in text
        or any(p in ("..",) for p in parts)
    )


def _check_dest(chk: Checker, path: KeyPath, dest: str) -> str | None:
    norm = dest.rstrip("/")
    parts = norm.split("/")
    if (
        _bad_relative(norm)
        or any(p in ("", ".") for p in parts)
        or parts[0] == PUBLISH_MANIFEST
        or any(p.startswith(".crucible-") for p in parts)
    ):
        chk.error(
            "bad-path",
            path,
            f"publish destination {dest!r} must be a relative directory inside the publish "
            "dir (no leading /, no . or .. components, no backslash)",
        )
        return None
    return str(PurePosixPath(norm))


def _check_publish_source(chk: Checker, path: KeyPath, src: Any) -> bool:
    if not isinstance(src, str):
        chk.wrong_type(path, src, 'a publish source must be "task:glob"')
        return False
    task, colon, glob = src.partition(":")
    if not colon or not task or not glob:
        chk.error("bad-ref", path, f'publish source {src!r} is not of the form "task:glob"')
        return False
    if _bad_relative(glob):
        chk.error(
            "bad-path",
            path,
            f"publish source {src!r}: the glob must be relative to the task's captured "
            "files (no leading /, no .., no backslash)",
        )
        return False
    return True


def _check_publish_graph(
    chk: Checker, workflow: Mapping[str, Any], by_name: Mapping[str, dict[str, Any]]
) -> None:
    for dest, spec in workflow.get("publish", {}).items():
        for i, src in enumerate(spec["from"]):
            where = ("workflow", "publish", dest, i)
            task = src.partition(":")[0]
            if task not in by_name:
                chk.error(
                    "publish-unknown-task",
                    where,
                    f"publish source {src!r} names {task!r}, which is not a task of this workflow",
                )
            elif not by_name[task]["emits_files"]:
                chk.error(
                    "publish-no-files",
                    where,
                    f"publish source {src!r}: task {task!r} captures no files (emits_files)",
                )
            elif by_name[task].get("temp_files"):
                from crucible.compile._temps import check_temp_published  # lazy: rare

                check_temp_published(chk, where, src, by_name[task])

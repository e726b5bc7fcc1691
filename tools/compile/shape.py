"""Structural checks of a pack's workflow: keys, types, values.

One function per table (workflow, params, task) checks a raw mapping — a TOML
table or the kwargs of a Starlark constructor — records every problem as a
:class:`Diagnostic`, and returns the normalized, plan-shaped value built from
the parts that are sound. Unknown keys are refused everywhere (docs/spec/manifest.md
says why).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from crucible.compile.conditions import check_control_keys
from crucible.compile.diagnostics import Diagnostic, Locator, Path
from crucible.compile.editions import (
    EDITION_CONTROL,
    RESERVED_INPUTS,
    TYPES,
    known_task_keys,
    task_key_since,
    workflow_key_since,
)
from crucible.compile.names import env_problem, ident_problem
from crucible.core.canon import MAX_SAFE_INTEGER
from crucible.core.globs import pattern_problem

__all__ = [
    "JOINS",
    "KINDS",
    "MAX_DEFAULT_DEPTH",
    "Checker",
    "check_params",
    "check_task",
    "split_ref",
    "type_name",
    "value_matches",
]

KINDS: tuple[str, ...] = ("command", "evaluate", "agent")
JOINS: tuple[str, ...] = ("all", "settled")
WORKFLOW_KEYS: tuple[str, ...] = tuple(
    k for k in ("name", "description", "params", "source", "task") if workflow_key_since(k) == 1
)
#: ``[workflow]`` keys of edition 4 (editions.py says when each key arrived)
WORKFLOW_KEYS_SINCE_4: tuple[str, ...] = tuple(
    k for k in ("outputs", "publish") if workflow_key_since(k) == EDITION_CONTROL
)
PARAM_KEYS: tuple[str, ...] = ("type", "default", "description")


class Checker:
    """Collects diagnostics, locating each through a :class:`Locator`."""

    def __init__(self, locator: Locator) -> None:
        self.locator = locator
        self.diagnostics: list[Diagnostic] = []

    def error(self, code: str, path: Path, message: str) -> None:
        self.diagnostics.append(Diagnostic(code, message, self.locator.locate(path)))

    @property
    def failed(self) -> bool:
        return any(d.severity == "error" for d in self.diagnostics)


def type_name(value: object) -> str:
    """The TOML/JSON name of a value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "table"
    return type(value).__name__


def is_json_value(value: object) -> bool:
    """True for values in the canonical JSON domain (no datetimes, NaN, huge ints)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if v is None or isinstance(v, bool | str):
            continue
        if isinstance(v, int):
            if abs(v) > MAX_SAFE_INTEGER:
                return False
        elif isinstance(v, float):
            if not math.isfinite(v):
                return False
        elif isinstance(v, list | tuple):
            stack.extend(v)
        elif isinstance(v, dict):
            if not all(isinstance(k, str) for k in v):
                return False
            stack.extend(v.values())
        else:
            return False
    return True


#: deepest nesting of arrays/objects a param default may have (our choice): the plan
#: wraps a default in four more levels and the canonical serializer's fast path
#: (orjson) stops at 255, so a deeper default could not be written out.
MAX_DEFAULT_DEPTH = 128


def _json_depth(value: object) -> int:
    """Nesting depth of arrays/objects in ``value`` (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, list | tuple):
            items: Any = v
        elif isinstance(v, dict):
            items = v.values()
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        stack.extend((item, depth) for item in items)
    return deepest


def value_matches(type_: str, value: object) -> bool:
    """Does ``value`` (already a JSON value) have the declared ``type_``?"""
    if type_ == "any":
        return True
    if type_ == "string":
        return isinstance(value, str)
    if type_ == "boolean":
        return isinstance(value, bool)
    if type_ == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if type_ == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if type_ == "array":
        return isinstance(value, list | tuple)
    if type_ == "object":
        return isinstance(value, dict)
    return False


def split_ref(ref: str) -> tuple[str, str] | None:
    """``"producer.field"`` → (producer, field), split at the last dot (field names
    hold no dot; task names may)."""
    producer, dot, field = ref.rpartition(".")
    if not dot or not producer or ident_problem("field", field) is not None:
        return None
    return producer, field


def _check_str(chk: Checker, path: Path, value: object, what: str, *, nonempty: bool) -> bool:
    if not isinstance(value, str):
        chk.error("wrong-type", path, f"{what} must be a string, not {type_name(value)}")
        return False
    if nonempty and not value.strip():
        chk.error("bad-value", path, f"{what} must not be empty")
        return False
    return True


def _check_str_list(chk: Checker, path: Path, value: object, what: str) -> list[str] | None:
    if not isinstance(value, list | tuple):
        chk.error("wrong-type", path, f"{what} must be an array of strings, not {type_name(value)}")
        return None
    out: list[str] = []
    ok = True
    for i, item in enumerate(value):
        if not isinstance(item, str):
            chk.error(
                "wrong-type", (*path, i), f"{what}[{i}] must be a string, not {type_name(item)}"
            )
            ok = False
        elif item in out:
            chk.error("duplicate-entry", (*path, i), f"{what} lists {item!r} twice")
            ok = False
        else:
            out.append(item)
    return out if ok else None


def _check_type(chk: Checker, path: Path, value: object, what: str) -> str | None:
    if not isinstance(value, str) or value not in TYPES:
        chk.error(
            "bad-type-name",
            path,
            f"{what} must be one of {', '.join(TYPES)}, not {value!r}",
        )
        return None
    return value


def _check_ref(chk: Checker, path: Path, value: object, what: str) -> str | None:
    if not _check_str(chk, path, value, what, nonempty=True):
        return None
    assert isinstance(value, str)
    if split_ref(value) is None:
        chk.error(
            "bad-ref",
            path,
            f'{what} {value!r} is not of the form "producer.field" '
            "(field: a letter or _, then letters, digits, _ or -)",
        )
        return None
    return value


def _check_keys(
    chk: Checker, path: Path, table: Mapping[str, Any], allowed: tuple[str, ...], label: str
) -> None:
    for key in table:
        if key not in allowed:
            noun = "keyword argument" if label.endswith("()") else "key"
            chk.error(
                "unknown-key",
                (*path, key),
                f"unknown {noun} {key!r} in {label} (known: {', '.join(allowed)})",
            )


def check_params(chk: Checker, path: Path, raw: object) -> dict[str, Any]:
    """``[workflow.params.NAME]`` tables → ``{name: {type, default?, description?}}``."""
    if not isinstance(raw, dict):
        chk.error("wrong-type", path, f"params must be a table, not {type_name(raw)}")
        return {}
    params: dict[str, Any] = {}
    for name, spec in raw.items():
        ppath = (*path, name)
        if (problem := ident_problem("param", name)) is not None:
            chk.error("bad-name", ppath, problem)
            continue
        if not isinstance(spec, dict):
            chk.error(
                "wrong-type",
                ppath,
                f"param {name!r} must be a table with a type, not {type_name(spec)}",
            )
            continue
        _check_keys(chk, ppath, spec, PARAM_KEYS, f"param {name!r}")
        if "type" not in spec:
            chk.error("missing-key", ppath, f"param {name!r} has no type")
            continue
        type_ = _check_type(chk, (*ppath, "type"), spec["type"], f"type of param {name!r}")
        if type_ is None:
            continue
        out: dict[str, Any] = {"type": type_}
        if "default" in spec:
            default = spec["default"]
            if _json_depth(default) > MAX_DEFAULT_DEPTH:
                chk.error(
                    "bad-default",
                    (*ppath, "default"),
                    f"default of param {name!r} is nested deeper than {MAX_DEFAULT_DEPTH} levels",
                )
            elif not is_json_value(default) or not value_matches(type_, default):
                chk.error(
                    "bad-default",
                    (*ppath, "default"),
                    f"default of param {name!r} is not a JSON {type_} (got {type_name(default)})",
                )
            else:
                out["default"] = _to_json(default)
        if "description" in spec and _check_str(
            chk, (*ppath, "description"), spec["description"], "description", nonempty=False
        ):
            out["description"] = spec["description"]
        params[name] = out
    return params


def _to_json(value: Any) -> Any:
    """Tuples (from Starlark) become lists; everything else is already JSON."""
    if isinstance(value, list | tuple):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    return value


def _check_relative_glob(chk: Checker, path: Path, pattern: str) -> bool:
    parts = pattern.replace("\\", "/").split("/")
    if not pattern or pattern.startswith("/") or ".." in parts or "\x00" in pattern:
        chk.error(
            "bad-path",
            path,
            f"emits_files entry {pattern!r} must be a relative path or glob "
            "inside the workspace (no leading /, no ..)",
        )
        return False
    # what capture would refuse after the task ran (issue 12 item 15)
    if (problem := pattern_problem(pattern)) is not None:
        chk.error("bad-path", path, f"emits_files entry {pattern!r} {problem}")
        return False
    return True


def check_task(
    chk: Checker,
    path: Path,
    raw: Mapping[str, Any],
    edition: int,
    *,
    label: str = "[[workflow.task]]",
) -> dict[str, Any]:
    """A task table (or ``task()`` kwargs) → a plan-shaped task dict.

    ``inputs`` entries carry ``"type": None`` until the graph rules fill it in.
    """
    known = known_task_keys(edition)
    for key in raw:
        if key not in known:
            since = task_key_since(key)
            hint = (
                f"; {key!r} needs edition {since} (this pack is edition {edition})"
                if since is not None
                else ""
            )
            noun = "keyword argument" if label.endswith("()") else "key"
            chk.error("unknown-key", (*path, key), f"unknown {noun} {key!r} in {label}{hint}")

    task: dict[str, Any] = {
        "name": None,
        "kind": "command",
        "needs": [],
        "join": "all",
        "emits": {},
        "emits_files": [],
        "retries": 0,
        "epilogue": False,
    }
    if "name" not in raw:
        chk.error("missing-key", path, f"{label} has no name")
    elif isinstance(raw["name"], str):
        task["name"] = raw["name"]
    else:
        chk.error(
            "wrong-type", (*path, "name"), f"name must be a string, not {type_name(raw['name'])}"
        )
    who = f"task {task['name']!r}" if task["name"] else label

    kind = raw.get("kind", "command")
    if kind not in KINDS:
        chk.error(
            "bad-value", (*path, "kind"), f"kind must be one of {', '.join(KINDS)}, not {kind!r}"
        )
        kind = "command"
    task["kind"] = kind

    if kind == "agent":
        if "run" in raw:
            chk.error("agent-run", (*path, "run"), f"{who} is an agent: it takes a prompt, not run")
        if "prompt" not in raw:
            chk.error("missing-key", path, f"{who} is an agent and has no prompt")
        elif _check_str(chk, (*path, "prompt"), raw["prompt"], "prompt", nonempty=True):
            task["prompt"] = raw["prompt"]
    else:
        if "prompt" in raw:
            chk.error(
                "prompt-not-agent",
                (*path, "prompt"),
                f"{who} is a {kind} task: prompt is for agents",
            )
        if "run" not in raw:
            chk.error("missing-key", path, f"{who} has no run (an argv array or a shell string)")
        else:
            run = raw["run"]
            if isinstance(run, str):
                if _check_str(chk, (*path, "run"), run, "run", nonempty=True):
                    task["run"] = run
            elif isinstance(run, list | tuple):
                if not run:
                    chk.error("bad-value", (*path, "run"), "run must not be an empty array")
                elif all(isinstance(a, str) for a in run):
                    if run[0]:
                        task["run"] = list(run)
                    else:  # exec of "" fails on every attempt
                        chk.error("bad-value", (*path, "run", 0), "run's program must not be empty")
                else:
                    chk.error("wrong-type", (*path, "run"), "every element of run must be a string")
            else:
                chk.error(
                    "wrong-type",
                    (*path, "run"),
                    f"run must be an argv array or a shell string, not {type_name(run)}",
                )
            if "run" in task and "\x00" in "".join(task["run"]):
                # no command line can carry NUL: exec would fail on every attempt
                del task["run"]
                chk.error("bad-value", (*path, "run"), "run must not contain a NUL character")

    if "needs" in raw:
        needs = _check_str_list(chk, (*path, "needs"), raw["needs"], "needs")
        if needs is not None:
            task["needs"] = needs
    if "join" in raw:
        if raw["join"] in JOINS:
            task["join"] = raw["join"]
        else:
            chk.error(
                "bad-value",
                (*path, "join"),
                f"join must be one of {', '.join(JOINS)}, not {raw['join']!r}",
            )
    if "emits" in raw:
        emits = raw["emits"]
        if not isinstance(emits, dict):
            chk.error(
                "wrong-type",
                (*path, "emits"),
                f"emits must be a table of field = type, not {type_name(emits)}",
            )
        else:
            for field, type_ in emits.items():
                fpath = (*path, "emits", field)
                if (problem := ident_problem("field", field)) is not None:
                    chk.error("bad-name", fpath, problem)
                    continue
                checked = _check_type(chk, fpath, type_, f"type of emits field {field!r}")
                if checked is not None:
                    task["emits"][field] = checked
    if "emits_files" in raw:
        files = _check_str_list(chk, (*path, "emits_files"), raw["emits_files"], "emits_files")
        if files is not None:
            task["emits_files"] = [
                f
                for i, f in enumerate(files)
                if _check_relative_glob(chk, (*path, "emits_files", i), f)
            ]
    if edition >= EDITION_CONTROL:
        # map's new sources, matrix, key, parallelism: crucible.compile.fanout
        from crucible.compile.fanout import check_fanout_task

        check_fanout_task(chk, path, raw, task, edition)
        if "cache" in raw:  # docs/spec/cache.md: false = never looked up or recorded
            if type(raw["cache"]) is not bool:
                chk.error(
                    "wrong-type",
                    (*path, "cache"),
                    f"cache must be a boolean, not {type_name(raw['cache'])}",
                )
            else:
                task["cache"] = raw["cache"]
        if "resources" in raw:
            from crucible.compile.resources import check_resources

            check_resources(chk, (*path, "resources"), raw["resources"], task)
    elif "map" in raw:
        ref = _check_ref(chk, (*path, "map"), raw["map"], "map")
        if ref is not None:
            task["map"] = ref
    if "retries" in raw:
        retries = raw["retries"]
        if type(retries) is not int:
            chk.error(
                "wrong-type",
                (*path, "retries"),
                f"retries must be an integer, not {type_name(retries)}",
            )
        elif not 0 <= retries <= 1000:
            chk.error(
                "bad-value",
                (*path, "retries"),
                f"retries must be between 0 and 1000, not {retries}",
            )
        else:
            task["retries"] = retries
    if "timeout" in raw:
        timeout = raw["timeout"]
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            chk.error(
                "wrong-type",
                (*path, "timeout"),
                f"timeout must be a number of seconds, not {type_name(timeout)}",
            )
        elif not (math.isfinite(timeout) and 0 < timeout <= MAX_SAFE_INTEGER):
            chk.error(
                "bad-value",
                (*path, "timeout"),
                f"timeout must be a positive number of seconds, not {timeout}",
            )
        else:
            task["timeout"] = timeout
    if "description" in raw and _check_str(
        chk, (*path, "description"), raw["description"], "description", nonempty=False
    ):
        task["description"] = raw["description"]
    if "epilogue" in raw:
        if isinstance(raw["epilogue"], bool):
            task["epilogue"] = raw["epilogue"]
        else:
            chk.error(
                "wrong-type",
                (*path, "epilogue"),
                f"epilogue must be a boolean, not {type_name(raw['epilogue'])}",
            )
    if "env" in raw and "env" in known:
        env = _check_str_list(chk, (*path, "env"), raw["env"], "env")
        if env is not None:
            good = []
            for i, name in enumerate(env):
                if (problem := env_problem(name)) is not None:
                    chk.error("bad-name", (*path, "env", i), problem)
                else:
                    good.append(name)
            if good:
                task["env"] = good
    if "inputs" in raw and "inputs" in known:
        inputs = raw["inputs"]
        if not isinstance(inputs, dict):
            chk.error(
                "wrong-type",
                (*path, "inputs"),
                f'inputs must be a table of name = "producer.field", not {type_name(inputs)}',
            )
        else:
            declared: dict[str, Any] = {}
            for name, source in inputs.items():
                ipath = (*path, "inputs", name)
                if (problem := ident_problem("input", name)) is not None:
                    chk.error("bad-name", ipath, problem)
                    continue
                if name in RESERVED_INPUTS:
                    chk.error(
                        "input-reserved-name",
                        ipath,
                        f"input name {name!r} is reserved: {name} arrives undeclared "
                        "where it applies; choose another name",
                    )
                    continue
                ref = _check_ref(chk, ipath, source, f"input {name!r}")
                if ref is None:
                    continue
                split = split_ref(ref)
                assert split is not None
                declared[name] = {
                    "from": ref,
                    "producer": split[0],
                    "field": split[1],
                    "type": None,
                }
            if declared:
                task["inputs"] = declared
    check_control_keys(chk, path, raw, task, known)
    return task


def _check_workflow_keys(
    chk: Checker,
    path: Path,
    raw: Mapping[str, Any],
    allowed: tuple[str, ...],
    label: str,
    edition: int,
) -> None:
    """Unknown ``[workflow]`` keys; a key of a later edition names that edition."""
    known = (*allowed, *(k for k in WORKFLOW_KEYS_SINCE_4 if edition >= EDITION_CONTROL))
    for key in raw:
        if key in known:
            continue
        since = workflow_key_since(key)
        hint = (
            f"; {key!r} needs edition {since} (this pack is edition {edition})"
            if since is not None and since > edition
            else ""
        )
        noun = "keyword argument" if label.endswith("()") else "key"
        chk.error(
            "unknown-key",
            (*path, key),
            f"unknown {noun} {key!r} in {label} (known: {', '.join(known)}){hint}",
        )


def check_workflow(
    chk: Checker,
    path: Path,
    raw: Mapping[str, Any],
    edition: int,
    *,
    tasks_key: str = "task",
    task_label: str = "[[workflow.task]]",
    allowed: tuple[str, ...] = WORKFLOW_KEYS,
    label: str = "[workflow]",
) -> tuple[dict[str, Any], list[dict[str, Any]], list[Path]]:
    """A workflow table (without ``source``) → (plan workflow, plan tasks, their paths)."""
    _check_workflow_keys(chk, path, raw, allowed, label, edition)
    workflow: dict[str, Any] = {"name": "", "params": {}}
    if "name" not in raw:
        chk.error("missing-key", path, f"{label} has no name")
    elif _check_str(chk, (*path, "name"), raw["name"], "workflow name", nonempty=True):
        workflow["name"] = raw["name"]
    if "description" in raw and _check_str(
        chk, (*path, "description"), raw["description"], "description", nonempty=False
    ):
        workflow["description"] = raw["description"]
    if "params" in raw:
        workflow["params"] = check_params(chk, (*path, "params"), raw["params"])
    if edition >= EDITION_CONTROL:
        # [workflow.outputs], [workflow.publish] (omitted from the plan when empty)
        from crucible.compile.fanout import check_outputs, check_publish

        if "outputs" in raw and (outputs := check_outputs(chk, (*path, "outputs"), raw["outputs"])):
            workflow["outputs"] = outputs
        if "publish" in raw and (publish := check_publish(chk, (*path, "publish"), raw["publish"])):
            workflow["publish"] = publish
    tasks: list[dict[str, Any]] = []
    paths: list[Path] = []
    raw_tasks = raw.get(tasks_key, [])
    if not isinstance(raw_tasks, list | tuple):
        chk.error("wrong-type", (*path, tasks_key), f"{task_label} must be an array of tables")
        raw_tasks = []
    if not raw_tasks:
        chk.error("no-tasks", path, "the workflow has no tasks")
    for i, raw_task in enumerate(raw_tasks):
        tpath = (*path, tasks_key, i)
        if not isinstance(raw_task, dict):
            chk.error(
                "wrong-type",
                tpath,
                f"{task_label} entry {i} must be a table, not {type_name(raw_task)}",
            )
            continue
        tasks.append(check_task(chk, tpath, raw_task, edition, label=task_label))
        paths.append(tpath)
    return workflow, tasks, paths

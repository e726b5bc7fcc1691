"""Structural checks of a pack's workflow: keys, types, values.

One function per table (workflow, params, task) checks a raw mapping — a TOML
table or the kwargs of a Starlark constructor — records every problem as a
:class:`Diagnostic`, and returns the normalized, plan-shaped value built from
the parts that are sound. Unknown keys are refused everywhere (docs/spec/manifest.md
says why).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from crucible.compile._checker import (
    MAX_DEFAULT_DEPTH,
    Checker,
    check_params,
    check_ref,
    check_str,
    check_str_list,
    check_type,
    input_form,
    split_ref,
    type_name,
    value_matches,
)
from crucible.compile._conditions import check_control_keys
from crucible.compile._diagnostics import KeyPath
from crucible.compile._durations import duration_problem
from crucible.compile._editions import (
    EDITION_CONTROL,
    RESERVED_INPUTS,
    known_task_keys,
    task_key_since,
    workflow_key_since,
)
from crucible.compile._names import env_problem
from crucible.core.contract import JOINS, KINDS
from crucible.core.globs import pattern_problem
from crucible.core.refs import parse_ref
from crucible.core.structs import dataclass

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

WORKFLOW_KEYS: tuple[str, ...] = tuple(
    k for k in ("name", "description", "params", "source", "task") if workflow_key_since(k) == 1
)
#: ``[workflow]`` keys of edition 4 (editions.py says when each key arrived)
WORKFLOW_KEYS_SINCE_4: tuple[str, ...] = tuple(
    k
    for k in ("outputs", "publish", "reads", "sandbox", "network", "limits")
    if workflow_key_since(k) == EDITION_CONTROL
)


def _check_relative_glob(chk: Checker, path: KeyPath, pattern: str) -> bool:
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


@dataclass
class _TaskCheck:
    """One task table under check: what every step of :data:`_TASK_STEPS` reads and
    the plan-shaped ``task`` it fills in."""

    chk: Checker
    path: KeyPath
    raw: Mapping[str, Any]
    task: dict[str, Any]
    edition: int
    known: frozenset[str]
    label: str

    def at(self, *parts: str | int) -> KeyPath:
        return (*self.path, *parts)

    @property
    def who(self) -> str:
        name = self.task["name"]
        return f"task {name!r}" if name else self.label


#: a step of the task check: it reads a key's value (or, for a whole-table step,
#: the table itself) and records diagnostics and normal forms on the _TaskCheck
_Step = Callable[[_TaskCheck, Any], None]


def _check_unknown_task_keys(t: _TaskCheck) -> None:
    for key in t.raw:
        if key not in t.known:
            since = task_key_since(key)
            hint = (
                f"; {key!r} needs edition {since} (this pack is edition {t.edition})"
                if since is not None
                else ""
            )
            noun = "keyword argument" if t.label.endswith("()") else "key"
            t.chk.error("unknown-key", t.at(key), f"unknown {noun} {key!r} in {t.label}{hint}")


def _task_name(t: _TaskCheck, raw: Mapping[str, Any]) -> None:
    if "name" not in raw:
        t.chk.error("missing-key", t.path, f"{t.label} has no name")
    elif isinstance(raw["name"], str):
        t.task["name"] = raw["name"]
    else:
        t.chk.wrong_type(t.at("name"), raw["name"], "name must be a string")


def _task_kind(t: _TaskCheck, raw: Mapping[str, Any]) -> None:
    kind = raw.get("kind", "command")
    if kind not in KINDS:
        t.chk.error(
            "bad-value", t.at("kind"), f"kind must be one of {', '.join(KINDS)}, not {kind!r}"
        )
        kind = "command"
    t.task["kind"] = kind


def _task_body(t: _TaskCheck, raw: Mapping[str, Any]) -> None:
    """An agent takes a prompt, every other kind a run."""
    kind = t.task["kind"]
    if kind == "agent":
        if "run" in raw:
            t.chk.error(
                "agent-run", t.at("run"), f"{t.who} is an agent: it takes a prompt, not run"
            )
        if "prompt" not in raw:
            t.chk.error("missing-key", t.path, f"{t.who} is an agent and has no prompt")
        elif check_str(t.chk, t.at("prompt"), raw["prompt"], "prompt", nonempty=True):
            t.task["prompt"] = raw["prompt"]
        return
    if "prompt" in raw:
        t.chk.error(
            "prompt-not-agent", t.at("prompt"), f"{t.who} is a {kind} task: prompt is for agents"
        )
    if "run" not in raw:
        t.chk.error("missing-key", t.path, f"{t.who} has no run (an argv array or a shell string)")
    else:
        _task_run(t, raw["run"])


def _task_run(t: _TaskCheck, run: object) -> None:
    if isinstance(run, str):
        if check_str(t.chk, t.at("run"), run, "run", nonempty=True):
            t.task["run"] = run
    elif isinstance(run, list | tuple):
        if not run:
            t.chk.error("bad-value", t.at("run"), "run must not be an empty array")
        elif all(isinstance(a, str) for a in run):
            if run[0]:
                t.task["run"] = list(run)
            else:  # exec of "" fails on every attempt
                t.chk.error("bad-value", t.at("run", 0), "run's program must not be empty")
        else:
            t.chk.error("wrong-type", t.at("run"), "every element of run must be a string")
    else:
        t.chk.wrong_type(t.at("run"), run, "run must be an argv array or a shell string")
    if "run" in t.task and "\x00" in "".join(t.task["run"]):
        # no command line can carry NUL: exec would fail on every attempt
        del t.task["run"]
        t.chk.error("bad-value", t.at("run"), "run must not contain a NUL character")


def _task_needs(t: _TaskCheck, value: object) -> None:
    needs = check_str_list(t.chk, t.at("needs"), value, "needs")
    if needs is not None:
        t.task["needs"] = needs


def _task_join(t: _TaskCheck, value: object) -> None:
    if value in JOINS:
        t.task["join"] = value
    else:
        t.chk.error(
            "bad-value", t.at("join"), f"join must be one of {', '.join(JOINS)}, not {value!r}"
        )


def _task_emits(t: _TaskCheck, emits: object) -> None:
    entries = t.chk.named_entries(
        t.at("emits"), emits, "field", "emits must be a table of field = type"
    )
    for field, type_, fpath in entries:
        checked = check_type(t.chk, fpath, type_, f"type of emits field {field!r}")
        if checked is not None:
            t.task["emits"][field] = checked


def _task_emits_files(t: _TaskCheck, value: object) -> None:
    files = check_str_list(t.chk, t.at("emits_files"), value, "emits_files")
    if files is not None:
        t.task["emits_files"] = [
            f for i, f in enumerate(files) if _check_relative_glob(t.chk, t.at("emits_files", i), f)
        ]


def _task_temp_files(t: _TaskCheck, value: object) -> None:
    from crucible.compile._temps import check_temp_files  # lazy: edition 4 only

    check_temp_files(t.chk, t.at("temp_files"), value, t.task)


def _task_fanout(t: _TaskCheck, raw: Mapping[str, Any]) -> None:
    """Edition 4's map sources, matrix, key, parallelism (crucible.compile._fanout);
    before it, map is a "producer.field" reference."""
    if t.edition >= EDITION_CONTROL:
        # lazy: compile._fanout is not loaded with this module; only _task_fanout() needs it
        from crucible.compile._fanout import check_fanout_task

        check_fanout_task(t.chk, t.path, raw, t.task, t.edition)
    elif "map" in raw and isinstance(raw["map"], list | dict):
        t.chk.wrong_type(
            t.at("map"),
            raw["map"],
            f'map must be "producer.field" at edition {t.edition} (a literal or sequence '
            f"source needs edition {EDITION_CONTROL})",
        )
    elif "map" in raw:
        ref = check_ref(t.chk, t.at("map"), raw["map"], "map")
        if ref is not None:
            t.task["map"] = ref


#: what a fan-out with no instances settles as (issue 32; "pass" is the default)
ON_EMPTY: tuple[str, ...] = ("pass", "skip")


def _task_on_empty(t: _TaskCheck, raw: Mapping[str, Any]) -> None:
    """``on_empty``: only a mapped task (map or matrix) has instances to lack; the
    plan carries it only as ``"skip"`` (the default ``"pass"`` is omitted)."""
    if "on_empty" not in raw or "on_empty" not in t.known:
        return
    value = raw["on_empty"]
    if not isinstance(value, str):
        t.chk.wrong_type(t.at("on_empty"), value, 'on_empty must be "pass" or "skip"')
    elif value not in ON_EMPTY:
        t.chk.error(
            "bad-value", t.at("on_empty"), f'on_empty must be "pass" or "skip", not {value!r}'
        )
    elif "map" not in raw and "matrix" not in raw:
        who = f"task {t.task['name']!r}" if t.task.get("name") else "the task"
        t.chk.error(
            "on-empty-needs-fanout",
            t.at("on_empty"),
            f"{who} has on_empty but no map or matrix (only a fan-out can have no instances)",
        )
    elif value == "skip":
        t.task["on_empty"] = value


def _task_cache(t: _TaskCheck, value: object) -> None:
    # docs/spec/cache.md: false = never looked up or recorded
    if type(value) is not bool:
        t.chk.wrong_type(t.at("cache"), value, "cache must be a boolean")
    else:
        t.task["cache"] = value


def _task_reads(t: _TaskCheck, value: object) -> None:
    # lazy: compile._reads is not loaded with this module; only _task_reads() needs it
    from crucible.compile._reads import check_reads

    reads = check_reads(t.chk, t.at("reads"), value)
    if reads:
        t.task["reads"] = reads


def _task_sandbox(t: _TaskCheck, value: object) -> None:
    # lazy: compile._reads is not loaded with this module; only _task_sandbox() needs it
    from crucible.compile._reads import check_flag

    check_flag(t.chk, t.at("sandbox"), value, "sandbox", t.task)


def _task_network(t: _TaskCheck, value: object) -> None:
    # lazy: compile._reads is not loaded with this module; only _task_network() needs it
    from crucible.compile._reads import check_flag

    check_flag(t.chk, t.at("network"), value, "network", t.task)


def _task_params(t: _TaskCheck, value: object) -> None:
    # the params the task may read (docs/spec/manifest.md); names checked
    # against [workflow.params] by crucible.compile._task_params
    names = check_str_list(t.chk, t.at("params"), value, "params")
    if names is not None:
        t.task["params"] = names


def _task_resources(t: _TaskCheck, value: object) -> None:
    # lazy: compile._resources is not loaded with this module; only _task_resources() needs it
    from crucible.compile._resources import check_resources

    check_resources(t.chk, t.at("resources"), value, t.task)


def _task_retries(t: _TaskCheck, retries: object) -> None:
    if type(retries) is not int:
        t.chk.wrong_type(t.at("retries"), retries, "retries must be an integer")
    elif not 0 <= retries <= 1000:
        t.chk.error(
            "bad-value", t.at("retries"), f"retries must be between 0 and 1000, not {retries}"
        )
    else:
        t.task["retries"] = retries


def _task_timeout(t: _TaskCheck, timeout: object) -> None:
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        t.chk.wrong_type(t.at("timeout"), timeout, "timeout must be a number of seconds")
    elif (problem := duration_problem(timeout, zero=False)) is not None:
        t.chk.error("bad-value", t.at("timeout"), f"timeout {problem}, not {timeout!r}")
    else:
        t.task["timeout"] = timeout


def _task_description(t: _TaskCheck, value: object) -> None:
    if check_str(t.chk, t.at("description"), value, "description", nonempty=False):
        t.task["description"] = value


def _task_epilogue(t: _TaskCheck, value: object) -> None:
    if isinstance(value, bool):
        t.task["epilogue"] = value
    else:
        t.chk.wrong_type(t.at("epilogue"), value, "epilogue must be a boolean")


def _task_env(t: _TaskCheck, value: object) -> None:
    env = check_str_list(t.chk, t.at("env"), value, "env")
    if env is None:
        return
    good = []
    for i, name in enumerate(env):
        if (problem := env_problem(name)) is not None:
            t.chk.error("bad-name", t.at("env", i), problem)
        else:
            good.append(name)
    if good:
        t.task["env"] = good


def _task_inputs(t: _TaskCheck, inputs: object) -> None:
    declared: dict[str, Any] = {}
    entries = t.chk.named_entries(
        t.at("inputs"), inputs, "input", 'inputs must be a table of name = "producer.field"'
    )
    for name, source, ipath in entries:
        if name in RESERVED_INPUTS:
            t.chk.error(
                "input-reserved-name",
                ipath,
                f"input name {name!r} is reserved: {name} arrives undeclared "
                "where it applies; choose another name",
            )
            continue
        paths = t.edition >= EDITION_CONTROL  # a.items[0], a.config.region
        ref = check_ref(t.chk, ipath, source, f"input {name!r}", paths=paths)
        if ref is None:
            continue
        # provisional: the graph rules, which know the task names, settle which
        # dot ends the producer (crucible.core.refs; rules._check_input)
        declared[name] = input_form(parse_ref(ref))
    if declared:
        t.task["inputs"] = declared


def _task_control(t: _TaskCheck, raw: Mapping[str, Any]) -> None:
    # when, on_failure, allow_exit, retry, deadline: crucible.compile._conditions
    check_control_keys(t.chk, t.path, raw, t.task, t.known)


#: The task check, in the order its diagnostics are reported: ``(key, step)`` runs
#: the step on the key's value when the table has the key and the edition knows
#: it (a key it does not know was already refused as unknown); ``(None, step)``
#: runs on the whole table, for checks that read several keys or report a
#: missing one. A new task key is one entry here and one in editions.py.
_TASK_STEPS: tuple[tuple[str | None, _Step], ...] = (
    (None, _task_name),
    (None, _task_kind),
    (None, _task_body),  # run / prompt, by kind
    ("needs", _task_needs),
    ("join", _task_join),
    ("emits", _task_emits),
    ("emits_files", _task_emits_files),
    ("temp_files", _task_temp_files),
    (None, _task_fanout),  # map, matrix, key, parallelism
    (None, _task_on_empty),
    ("cache", _task_cache),
    ("params", _task_params),
    ("resources", _task_resources),
    ("reads", _task_reads),
    ("sandbox", _task_sandbox),
    ("network", _task_network),
    ("retries", _task_retries),
    ("timeout", _task_timeout),
    ("description", _task_description),
    ("epilogue", _task_epilogue),
    ("env", _task_env),
    ("inputs", _task_inputs),
    (None, _task_control),  # when, on_failure, allow_exit, retry, deadline
)


def check_task(
    chk: Checker,
    path: KeyPath,
    raw: Mapping[str, Any],
    edition: int,
    *,
    label: str = "[[workflow.task]]",
) -> dict[str, Any]:
    """A task table (or ``task()`` kwargs) → a plan-shaped task dict.

    ``inputs`` entries carry ``"type": None`` until the graph rules fill it in.
    """
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
    t = _TaskCheck(chk, path, raw, task, edition, known_task_keys(edition), label)
    _check_unknown_task_keys(t)
    for key, step in _TASK_STEPS:
        if key is None:
            step(t, raw)
        elif key in raw and key in t.known:
            step(t, raw[key])
    return task


def _check_workflow_keys(
    chk: Checker,
    path: KeyPath,
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
    path: KeyPath,
    raw: Mapping[str, Any],
    edition: int,
    *,
    tasks_key: str = "task",
    task_label: str = "[[workflow.task]]",
    allowed: tuple[str, ...] = WORKFLOW_KEYS,
    label: str = "[workflow]",
) -> tuple[dict[str, Any], list[dict[str, Any]], list[KeyPath]]:
    """A workflow table (without ``source``) → (plan workflow, plan tasks, their paths)."""
    _check_workflow_keys(chk, path, raw, allowed, label, edition)
    workflow: dict[str, Any] = {"name": "", "params": {}}
    if "name" not in raw:
        chk.error("missing-key", path, f"{label} has no name")
    elif check_str(chk, (*path, "name"), raw["name"], "workflow name", nonempty=True):
        workflow["name"] = raw["name"]
    if "description" in raw and check_str(
        chk, (*path, "description"), raw["description"], "description", nonempty=False
    ):
        workflow["description"] = raw["description"]
    if "params" in raw:
        workflow["params"] = check_params(chk, (*path, "params"), raw["params"])
    if edition >= EDITION_CONTROL:
        # [workflow.outputs], [workflow.publish] (omitted from the plan when empty)
        from crucible.compile._fanout import check_publish
        from crucible.compile._results import check_outputs

        if "outputs" in raw and (outputs := check_outputs(chk, (*path, "outputs"), raw["outputs"])):
            workflow["outputs"] = outputs
        if "publish" in raw and (publish := check_publish(chk, (*path, "publish"), raw["publish"])):
            workflow["publish"] = publish
        if "limits" in raw:
            # [workflow.limits] (docs/spec/export.md): an accounted pack
            from crucible.compile._accounted import check_limits

            if (limits := check_limits(chk, (*path, "limits"), raw["limits"])) is not None:
                workflow["limits"] = limits
    defaults: dict[str, Any] = {}
    if edition >= EDITION_CONTROL:
        # reads, sandbox, network: defaults merged into every task (compile._reads)
        from crucible.compile._reads import check_defaults

        defaults = check_defaults(chk, path, raw)
    tasks: list[dict[str, Any]] = []
    paths: list[KeyPath] = []
    raw_tasks = raw.get(tasks_key, [])
    if not isinstance(raw_tasks, list | tuple):
        chk.error("wrong-type", (*path, tasks_key), f"{task_label} must be an array of tables")
        raw_tasks = []
    if not raw_tasks:
        chk.error("no-tasks", path, "the workflow has no tasks")
    for i, raw_task in enumerate(raw_tasks):
        tpath = (*path, tasks_key, i)
        if not isinstance(raw_task, dict):
            chk.wrong_type(tpath, raw_task, f"{task_label} entry {i} must be a table")
            continue
        task = check_task(chk, tpath, raw_task, edition, label=task_label)
        if defaults:
            # lazy: compile._reads is not loaded with this module; only check_workflow() needs it
            from crucible.compile._reads import inherit

            inherit(task, raw_task, defaults)
        tasks.append(task)
        paths.append(tpath)
    return workflow, tasks, paths

"""Values two or more tools must agree on, each with one owner: this module.

compile refuses a pack the dispatcher or stage would refuse later, so the
rules both apply live here, not in copies kept in sync by comments
(docs/spec/cli.md, "Shared contract values").
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from crucible.core.errors import UsageError

__all__ = [
    "EMIT_CAP_DEFAULT",
    "EMIT_CAP_MAX",
    "EMIT_CAP_MIN",
    "FILE_NAME_MAX",
    "IDENT_MAX_BYTES",
    "IR_VERSION_OF_EDITION",
    "JOINS",
    "KINDS",
    "NAME_MAX_BYTES",
    "RESERVED_ENV_PREFIX",
    "RESERVED_INPUTS",
    "RESERVED_PREFIX",
    "RESULT_STATUSES",
    "SUPPORTED_EDITIONS",
    "SUPPORTED_VERSIONS",
    "TASK_KEYS_SINCE",
    "TASK_NAME_SUFFIXES",
    "TYPES",
    "emit_cap_from",
    "emit_cap_problem",
    "json_type",
    "task_name_problems",
]

#: plan IR versions this engine reads and runs (plan-ir.md)
SUPPORTED_VERSIONS: tuple[int, ...] = (1, 2, 3)
#: manifest editions this engine compiles and plans it reads (manifest.md)
SUPPORTED_EDITIONS: tuple[int, ...] = (1, 2, 3, 4)
#: the IR version each edition compiles to (plan-ir.md; compile._editions.ir_version_for)
IR_VERSION_OF_EDITION: Mapping[int, int] = {1: 1, 2: 1, 3: 2, 4: 3}

#: task keys by the edition that introduced them (editions are cumulative): the
#: one table of task members. compile's keys per edition and per IR version
#: (compile._editions) and the plan model's members (core.plan.TASK_MEMBERS) are
#: derived from it; a new key is one line here (docs/ARCHITECTURE.md)
TASK_KEYS_SINCE: Mapping[str, int] = {
    "name": 1,
    "kind": 1,
    "run": 1,
    "needs": 1,
    "join": 1,
    "emits": 1,
    "emits_files": 1,
    "map": 1,
    "retries": 1,
    "timeout": 1,
    "prompt": 1,
    "description": 1,
    "epilogue": 1,
    "env": 2,
    "inputs": 3,
    # control flow (issue 16; crucible.compile._conditions)
    "when": 4,
    "on_failure": 4,
    "allow_exit": 4,
    "retry": 4,
    "deadline": 4,
    # fan-out vocabulary (issue 17)
    "matrix": 4,
    "key": 4,
    "parallelism": 4,
    # the task cache (issue 15): false = always run (its results are state)
    "cache": 4,
    # the params a task may read: staged, offered to when, keyed (issue 34)
    "params": 4,
    # what a unit needs on its worker (issue 19; crucible.compile._resources)
    "resources": 4,
    # declared reads and the sandbox that enforces them (issue 34; compile._reads)
    "reads": 4,
    "sandbox": 4,
    "network": 4,
    # issue 32: what a fan-out with no instances settles as (compile._shape)
    "on_empty": 4,
    # captured files freed once their direct dependants settled (issue 33)
    "temp_files": 4,
}

#: value types of emits fields, inputs and params (plan-ir.md)
TYPES: tuple[str, ...] = ("string", "integer", "number", "boolean", "object", "array", "any")
#: task kinds
KINDS: tuple[str, ...] = ("command", "evaluate", "agent")
#: a task's join: every need passed, or every need settled
JOINS: tuple[str, ...] = ("all", "settled")

#: reserved keys of the v1 whole input object; at edition 3 they arrive as
#: reserved inputs under their own names, undeclared (ADR-0058)
RESERVED_INPUTS: tuple[str, ...] = ("params", "item", "history", "revision", "kept", "outcome")

#: NAME_MAX, the file-name limit of every common file system (ext4, xfs, btrfs,
#: tmpfs, APFS): no name the tools derive may be longer
FILE_NAME_MAX = 255

#: every suffix a tool appends to a task name to name a file: output/<n>/<task>.json,
#: results/<task>.json and .jsonl, logs/<task>.log, prompts/<task>.txt. Stage's
#: own files about a unit live in "@" directories instead (shared/@tampered/<task>),
#: so a suffix longer than these would need a lower limit (docs/spec/manifest.md, "Names")
TASK_NAME_SUFFIXES: tuple[str, ...] = (".json", ".jsonl", ".log", ".txt")

#: a task name is a path component: at most FILE_NAME_MAX minus its longest suffix,
#: so that results/<task>.jsonl fits (249; 250 before, when that file did not fit)
NAME_MAX_BYTES = FILE_NAME_MAX - max(len(s) for s in TASK_NAME_SUFFIXES)

#: an input, field or param name (an ASCII identifier): the bound of an escaped
#: fan-out key, whose longest suffix is ".json" (output/<n>/<task>/<key>.json); an
#: input's file, inputs/@values/<input>, has no suffix at all
IDENT_MAX_BYTES = FILE_NAME_MAX - len(".json")

#: the reserved directory inputs/@values/ starts with this character
RESERVED_PREFIX = "@"

#: host variables with this prefix never reach a task (run.md); a pack cannot
#: ask for one in env
RESERVED_ENV_PREFIX = "CRUCIBLE_"

#: the status of a settled result record: stage writes them, dispatch and its
#: report read them (docs/schemas/result-record.json)
RESULT_STATUSES: tuple[str, ...] = ("passed", "failed", "skipped")

#: bytes of a task's emitted result object (--emit-cap / CRUCIBLE_EMIT_CAP)
EMIT_CAP_DEFAULT = 65536
#: the least cap: a cap of 0 would refuse every declared field (the shortest
#: JSON is 1 byte)
EMIT_CAP_MIN = 1
#: the cap is recorded (plan_admitted, the result record): a safe JSON integer
EMIT_CAP_MAX = 2**53 - 1  # canon.MAX_SAFE_INTEGER (canon imports orjson; this module stays light)


def emit_cap_problem(shown: str) -> str:
    """The one message for a bad emit cap, from any source (``shown``: the value
    as the user gave it, quoted)."""
    return (
        f"the emit cap must be an integer from {EMIT_CAP_MIN} to {EMIT_CAP_MAX} bytes, not {shown}"
    )


def emit_cap_from(option: str | int | None, environ: Mapping[str, str]) -> int:
    """The emit cap of a stage or dispatch: ``--emit-cap`` (``option``), else
    ``CRUCIBLE_EMIT_CAP``, else :data:`EMIT_CAP_DEFAULT`. The one rule and the
    one message for every tool: a value outside EMIT_CAP_MIN..EMIT_CAP_MAX, or
    not an integer, is a :class:`UsageError` naming where it came from."""
    if option is not None:
        text, where = str(option), "--emit-cap"
    else:
        text, where = environ.get("CRUCIBLE_EMIT_CAP", ""), "CRUCIBLE_EMIT_CAP"
        if not text:
            return EMIT_CAP_DEFAULT
    try:
        cap = int(text)
    except ValueError:
        cap = 0
    if type(option) is bool or not EMIT_CAP_MIN <= cap <= EMIT_CAP_MAX:
        raise UsageError(emit_cap_problem(repr(text)), where=where)
    return cap


_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


#: a name that breaks no rule below, by its look alone: ASCII letters, digits,
#: ``_``, ``-`` and ``.`` (not first), short enough. One match for the common
#: name instead of eight checks (~1.5 ms of loading a 1,000-task plan)
_PLAIN_NAME_RE = re.compile(rf"[A-Za-z0-9_-][A-Za-z0-9_.-]{{0,{NAME_MAX_BYTES - 1}}}")


def task_name_problems(name: str) -> list[tuple[str, str]]:
    """Every rule ``name`` breaks, as ``(code, message)``; empty when valid."""
    if _PLAIN_NAME_RE.fullmatch(name) and name not in RESERVED_INPUTS:
        return []
    if name == "":
        return [("name-empty", "task name is empty")]
    problems: list[tuple[str, str]] = []
    if name in (".", ".."):
        problems.append(("name-dot", f"task name {name!r} is a relative directory"))
    if "[" in name or "]" in name:
        problems.append(
            ("name-bracketed", f"task name {name!r} contains a bracket (reserved for fan-out keys)")
        )
    if "/" in name or "\\" in name:
        problems.append(("name-separator", f"task name {name!r} contains a path separator"))
    if name.startswith(RESERVED_PREFIX):
        problems.append(
            (
                "name-reserved-prefix",
                f"task name {name!r} starts with {RESERVED_PREFIX!r} "
                f"(reserved for inputs/{RESERVED_PREFIX}values)",
            )
        )
    if _CONTROL_RE.search(name):
        problems.append(("name-control", f"task name {name!r} contains a control character"))
    if len(name.encode("utf-8", "surrogatepass")) > NAME_MAX_BYTES:
        problems.append(
            (
                "name-too-long",
                f"task name is longer than {NAME_MAX_BYTES} bytes of UTF-8 "
                f"(results/<task>.jsonl must fit the {FILE_NAME_MAX}-byte file-name limit)",
            )
        )
    if name in RESERVED_INPUTS:
        problems.append(
            (
                "name-reserved-input",
                f"task name {name!r} is a reserved input name "
                f"({', '.join(RESERVED_INPUTS)}); rename the task",
            )
        )
    return problems


def json_type(value: object) -> str:
    """The JSON type of a value, by the one rule every tool applies: an integral
    number is an ``integer`` wherever it was written (``2.0`` too), booleans are
    never numbers (capture's field types, dispatch's params)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"

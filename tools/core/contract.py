"""Values two or more tools must agree on, each with one owner: this module.

compile refuses a pack the dispatcher or stage would refuse later, so the
rules both apply live here, not in copies kept in sync by comments
(docs/spec/cli.md, "Shared contract values").
"""

from __future__ import annotations

import re

__all__ = [
    "EMIT_CAP_DEFAULT",
    "EMIT_CAP_MIN",
    "NAME_MAX_BYTES",
    "RESERVED_ENV_PREFIX",
    "RESERVED_INPUTS",
    "RESERVED_PREFIX",
    "RESULT_STATUSES",
    "SUPPORTED_VERSIONS",
    "json_type",
    "task_name_problems",
]

#: plan IR versions this engine reads and runs (plan-ir.md)
SUPPORTED_VERSIONS: tuple[int, ...] = (1, 2, 3)

#: reserved keys of the v1 whole input object; at edition 3 they arrive as
#: reserved inputs under their own names, undeclared (ADR-0058)
RESERVED_INPUTS: tuple[str, ...] = ("params", "item", "history", "revision", "kept", "outcome")

#: a task name (and an input name) becomes a path component and, with ".json",
#: a result-record file name: 250 keeps "<name>.json" within the common 255-byte
#: file-name limit (our choice; the same bound as stage's escaped keys)
NAME_MAX_BYTES = 250

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
#: the least cap: the smallest result object, ``{}``, is 2 bytes, and a cap of
#: 0 would refuse every result; dispatch refuses 0 (stage still takes it: to align)
EMIT_CAP_MIN = 1

_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def task_name_problems(name: str) -> list[tuple[str, str]]:
    """Every rule ``name`` breaks, as ``(code, message)``; empty when valid."""
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
            ("name-too-long", f"task name is longer than {NAME_MAX_BYTES} bytes of UTF-8")
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

"""Name rules: task names become path components, so some are refused.

Task names are used as directory names under ``inputs/`` and ``STATE/files/``
(ADR-0058 "Producer paths"), and as keys of the v1 whole input object.
"""

from __future__ import annotations

import re

from crucible.compile.editions import RESERVED_INPUTS

__all__ = [
    "ENV_RE",
    "IDENT_RE",
    "NAME_MAX_BYTES",
    "RESERVED_ENV_PREFIX",
    "RESERVED_PREFIX",
    "env_problem",
    "ident_problem",
    "task_name_problems",
]

#: host variables with this prefix never reach a task (run.md)
RESERVED_ENV_PREFIX = "CRUCIBLE_"
#: the reserved directory inputs/@values/ starts with this character
RESERVED_PREFIX = "@"
#: a task name becomes a path component and, with ".json", a result-record file name;
#: 250 keeps "<name>.json" within the common 255-byte limit (our choice; same bound
#: as stage's escaped keys)
NAME_MAX_BYTES = 250

#: fields, inputs, params, env names (our choice: identifier-like, no dots)
IDENT_RE = re.compile(r"\A[A-Za-z_][A-Za-z0-9_-]*\Z")
ENV_RE = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")
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


def ident_problem(kind: str, name: object) -> str | None:
    """A message when ``name`` is not a valid field / input / param name."""
    if not isinstance(name, str) or not IDENT_RE.match(name):
        return (
            f"{kind} name {name!r} is not an identifier "
            "(a letter or _, then letters, digits, _ or -)"
        )
    if len(name) > NAME_MAX_BYTES:  # an identifier is ASCII: bytes = characters
        # an input becomes a file name under inputs/ (stage refuses it there)
        return f"{kind} name {name[:40]!r}… is longer than {NAME_MAX_BYTES} bytes"
    return None


def env_problem(name: str) -> str | None:
    if not ENV_RE.match(name):
        return f"environment variable name {name!r} is not valid (letters, digits, _)"
    if name.startswith(RESERVED_ENV_PREFIX):
        # the dispatcher never passes a host CRUCIBLE_* variable to a task
        return (
            f"environment variable name {name!r} is reserved: {RESERVED_ENV_PREFIX}* "
            "variables are set by crucible, never taken from the host"
        )
    return None

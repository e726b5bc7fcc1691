"""Name rules: task names become path components, so some are refused.

Task names are used as directory names under ``inputs/`` and ``STATE/files/``
(ADR-0058 "Producer paths"), and as keys of the v1 whole input object.
"""

from __future__ import annotations

import re

from crucible.core.contract import (
    IDENT_MAX_BYTES,
    NAME_MAX_BYTES,
    RESERVED_ENV_PREFIX,
    RESERVED_PREFIX,
    task_name_problems,
)

__all__ = [
    "ENV_RE",
    "IDENT_MAX_BYTES",
    "IDENT_RE",
    "NAME_MAX_BYTES",
    "RESERVED_ENV_PREFIX",
    "RESERVED_PREFIX",
    "env_problem",
    "ident_problem",
    "task_name_problems",
]

#: fields, inputs, params, output names (our choice: identifier-like, no dots)
IDENT_RE = re.compile(r"\A[A-Za-z_][A-Za-z0-9_-]*\Z")


def ident_problem(kind: str, name: object) -> str | None:
    """A message when ``name`` is not a valid field / input / param name."""
    if not isinstance(name, str) or not IDENT_RE.match(name):
        return (
            f"{kind} name {name!r} is not an identifier "
            "(a letter or _, then letters, digits, _ or -)"
        )
    if len(name) > IDENT_MAX_BYTES:  # an identifier is ASCII: bytes = characters
        # an input becomes a file name under inputs/ (stage refuses it there)
        return f"{kind} name {name[:40]!r}… is longer than {IDENT_MAX_BYTES} bytes"
    return None


#: environment variable names: what a POSIX shell accepts (no "-")
ENV_RE = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")


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

"""Editions, IR versions and the keys each edition knows.

This module is the one place that decides which IR version an edition compiles
to (:func:`ir_version_for`) and which keys a manifest task table, a Starlark
``task()`` call or a plan task may carry at a given edition / IR version.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from crucible.core.contract import (
    IR_VERSION_OF_EDITION,
    RESERVED_INPUTS,
    SUPPORTED_EDITIONS,
    SUPPORTED_VERSIONS,
    TASK_KEYS_SINCE,
    TYPES,
)
from crucible.core.errors import Location, UnsupportedVersion

__all__ = [
    "DEFAULT_EDITION",
    "EDITION_CONTROL",
    "LATEST_EDITION",
    "PLAN_TASK_KEYS",
    "RESERVED_INPUTS",
    "SUPPORTED_EDITIONS",
    "SUPPORTED_VERSIONS",
    "TYPES",
    "check_edition",
    "check_version",
    "edition_for_version",
    "ir_version_for",
    "known_task_keys",
    "known_top_keys",
    "task_key_since",
    "top_key_since",
    "workflow_key_since",
]

DEFAULT_EDITION = 1
LATEST_EDITION = 4


#: The edition that brings control flow, fan-out sources, run results, the task
#: cache and the scored loop (issues 15-18). Every new key enters here, never as an
#: optional key of an older edition: ADR-0058 makes the version the gate, so an
#: engine that does not know a key refuses the whole plan by its version instead of
#: running it with the key dropped. Edition 4 compiles to IR v3.
EDITION_CONTROL = 4

# Workflow-table keys (``[workflow.X]``) and top-level keys by the edition that
# introduced them; the original ones are edition 1.
_WORKFLOW_KEYS_SINCE: dict[str, int] = {
    "name": 1,
    "description": 1,
    "params": 1,
    "source": 1,
    "task": 1,
    # run results and published files (issue 17)
    "outputs": 4,
    "publish": 4,
    # defaults every task inherits (issue 34): a task's reads add to these
    "reads": 4,
    "sandbox": 4,
    "network": 4,
    # an accounted pack's bounds (issue 28; crucible.compile._accounted)
    "limits": 4,
}
_TOP_KEYS_SINCE: dict[str, int] = {
    "edition": 1,
    "workflow": 1,
    # the scored loop (issue 18; crucible.compile._loop)
    "loop": 4,
}

#: keys of a plan task per IR version (the v2 additions are omitted when empty):
#: the task keys of the editions that compile to it or an older version
PLAN_TASK_KEYS: dict[int, frozenset[str]] = {
    v: frozenset(k for k, e in TASK_KEYS_SINCE.items() if IR_VERSION_OF_EDITION[e] <= v)
    for v in SUPPORTED_VERSIONS
}


def ir_version_for(edition: int) -> int:
    """The IR version an edition compiles to: editions 1–2 → v1, 3 → v2, 4 → v3."""
    return IR_VERSION_OF_EDITION[check_edition(edition)]


def edition_for_version(version: int) -> tuple[int, ...]:
    """The editions whose plans carry ``version``."""
    return tuple(e for e in SUPPORTED_EDITIONS if ir_version_for(e) == version)


def _shown(value: object) -> str:
    """A refused value as the user wrote it (JSON/TOML spelling: true, "3"), not repr."""
    # lazy: json costs start-up; only _shown() needs it
    import json

    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return str(value)  # a TOML date or time: 1979-05-27


def _supported(
    value: object, supported: Sequence[int], what: str, plural: str, where: Location | None
) -> int:
    if type(value) is not int or value not in supported:
        listed = ", ".join(map(str, supported))
        raise UnsupportedVersion(
            f"unsupported {what} {_shown(value)}; this engine supports {plural} {listed}",
            location=where,
        )
    return value


def check_edition(edition: object, *, where: Location | None = None) -> int:
    return _supported(edition, SUPPORTED_EDITIONS, "edition", "editions", where)


def check_version(version: object, *, where: Location | None = None) -> int:
    return _supported(version, SUPPORTED_VERSIONS, "plan version", "versions", where)


def task_key_since(key: str) -> int | None:
    """The edition that introduced a task key, or None for a key no edition knows."""
    return TASK_KEYS_SINCE.get(key)


@functools.cache
def known_task_keys(edition: int) -> frozenset[str]:
    """The task keys a manifest (or ``task()`` call) of ``edition`` may use (asked
    once per task of a plan: cached)."""
    return frozenset(k for k, since in TASK_KEYS_SINCE.items() if since <= edition)


def workflow_key_since(key: str) -> int | None:
    """The edition that introduced a ``[workflow]`` key, or None for an unknown key."""
    return _WORKFLOW_KEYS_SINCE.get(key)


def top_key_since(key: str) -> int | None:
    """The edition that introduced a top-level manifest key, or None."""
    return _TOP_KEYS_SINCE.get(key)


def known_top_keys(edition: int) -> tuple[str, ...]:
    """The top-level manifest keys of ``edition``, in the order they arrived."""
    return tuple(k for k, since in _TOP_KEYS_SINCE.items() if since <= edition)

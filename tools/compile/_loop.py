"""The scored loop's ``[loop]`` table (issue 18; docs/spec/loop.md): structure and graph rules.

Two steps, like the task checks: :func:`check_loop_table` checks the table's keys,
types and values and returns the plan member (body sorted, defaults written out,
absent optional keys omitted); :func:`check_loop_graph` checks it against the
workflow's tasks once their structure is sound (the body is a convex sub-DAG of
plain regular tasks, the score task is an evaluate task in it, the metric one of
its declared numeric fields). Both run on manifests and on plan files alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from crucible.compile._checker import Checker, str_items
from crucible.compile._diagnostics import KeyPath
from crucible.compile._durations import MAX_DURATION_S, duration_problem
from crucible.compile._names import ident_problem
from crucible.core.canon import MAX_SAFE_INTEGER

__all__ = [
    "DIRECTIONS",
    "HISTORY_BYTES_DEFAULT",
    "HISTORY_BYTES_MAX",
    "HISTORY_BYTES_MIN",
    "LOOP_KEYS",
    "MAX_REVISIONS_CAP",
    "check_loop_graph",
    "check_loop_table",
    "describe_loop",
]

LOOP_KEYS: tuple[str, ...] = (
    "body",
    "score",
    "metric",
    "direction",
    "max_revisions",
    "target",
    "patience",
    "min_delta",
    "time_budget",
    "history_bytes",
)
DIRECTIONS: tuple[str, ...] = ("max", "min")
#: most revisions one loop may run (the contract's cap): each revision is a set of
#: units with its own records, so the state of a loop stays linear and bounded
MAX_REVISIONS_CAP = 10_000
HISTORY_BYTES_MIN = 256
HISTORY_BYTES_DEFAULT = 65_536
#: our choice: the history input is staged as one file and may be inlined in a
#: prompt's marked region; 1 GiB is far past any useful prompt
HISTORY_BYTES_MAX = 2**30
_NUMERIC = ("integer", "number")
_PATH: KeyPath = ("loop",)

#: the integer members: (key, least, most, what a good value is, for the message)
_INTEGERS: tuple[tuple[str, int, int, str], ...] = (
    (
        "max_revisions",
        1,
        MAX_REVISIONS_CAP,
        f"a positive integer of at most {MAX_REVISIONS_CAP}",
    ),
    (
        "patience",
        1,
        MAX_REVISIONS_CAP,
        "a positive integer (revisions in a row without an improvement) of at most "
        f"{MAX_REVISIONS_CAP}",
    ),
    (
        "history_bytes",
        HISTORY_BYTES_MIN,
        HISTORY_BYTES_MAX,
        f"between {HISTORY_BYTES_MIN} and {HISTORY_BYTES_MAX} bytes",
    ),
)

#: the [loop] numbers with a lower bound: key, the check, what the key must be, why
_BOUNDED_NUMBERS: tuple[tuple[str, Callable[[float], bool], str, str], ...] = (
    (
        "min_delta",
        lambda n: n >= 0,
        "0 or more",
        ": an improvement is a score better than the kept one by at least min_delta",
    ),
    (
        "time_budget",
        lambda n: duration_problem(n, zero=False) is None,
        f"a number of seconds greater than zero and at most {MAX_DURATION_S} (365 days)",
        "",
    ),
)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _integer(chk: Checker, key: str, value: object, low: int, high: int, what: str) -> int | None:
    where = (*_PATH, key)
    if type(value) is not int:
        chk.wrong_type(where, value, f"[loop] {key} must be an integer")
        return None
    if not low <= value <= high:
        chk.error("bad-value", where, f"[loop] {key} must be {what}, not {value}")
        return None
    return value


def _number(chk: Checker, key: str, value: object) -> int | float | None:
    where = (*_PATH, key)
    if not _is_number(value):
        chk.wrong_type(where, value, f"[loop] {key} must be a number")
        return None
    assert isinstance(value, int | float)
    if not math.isfinite(value):
        chk.error("bad-value", where, f"[loop] {key} must be a finite number, not {value}")
        return None
    if abs(value) > MAX_SAFE_INTEGER:  # 1e308 is finite: say what is wrong with it
        chk.error(
            "bad-value",
            where,
            f"[loop] {key} must be within ±(2^53−1) = ±{MAX_SAFE_INTEGER}, not {value!r}",
        )
        return None
    return value


def check_loop_table(chk: Checker, raw: object) -> dict[str, Any] | None:
    """``[loop]`` → the plan's ``loop`` member, or None when any part is refused."""
    if not isinstance(raw, dict):
        chk.wrong_type(_PATH, raw, "loop must be a table")
        return None
    before = len(chk.diagnostics)
    chk.known_keys(_PATH, raw, LOOP_KEYS, "[loop]")
    for key in ("body", "score", "metric", "max_revisions"):
        if key not in raw:
            chk.error("missing-key", _PATH, f"[loop] has no {key}")
    loop: dict[str, Any] = {
        "direction": "max",
        "min_delta": 0,
        "history_bytes": HISTORY_BYTES_DEFAULT,
    }
    if "body" in raw:
        body = _check_body(chk, raw["body"])
        if body is not None:
            loop["body"] = sorted(body)
    for key in ("score", "metric"):
        if key not in raw:
            continue
        value = raw[key]
        if not isinstance(value, str):
            chk.wrong_type((*_PATH, key), value, f"[loop] {key} must be a string")
        elif key == "metric" and (problem := ident_problem("field", value)) is not None:
            chk.error("bad-name", (*_PATH, key), f"[loop] metric: {problem}")
        elif not value:
            chk.error("bad-value", (*_PATH, key), f"[loop] {key} must not be empty")
        else:
            loop[key] = value
    if "direction" in raw:
        if raw["direction"] in DIRECTIONS:
            loop["direction"] = raw["direction"]
        else:
            chk.error(
                "bad-value",
                (*_PATH, "direction"),
                f'[loop] direction must be "max" or "min", not {raw["direction"]!r}',
            )
    for key, low, high, expected in _INTEGERS:
        if key in raw and (value := _integer(chk, key, raw[key], low, high, expected)) is not None:
            loop[key] = value
    if "target" in raw and (target := _number(chk, "target", raw["target"])) is not None:
        loop["target"] = target
    for key, in_range, expected, why in _BOUNDED_NUMBERS:
        if key not in raw or (number := _number(chk, key, raw[key])) is None:
            continue
        if in_range(number):
            loop[key] = number
        else:
            chk.error(
                "bad-value", (*_PATH, key), f"[loop] {key} must be {expected}, not {number}{why}"
            )
    return None if len(chk.diagnostics) > before else loop


def _check_body(chk: Checker, value: object) -> list[str] | None:
    where = (*_PATH, "body")
    if not isinstance(value, list | tuple):
        chk.wrong_type(where, value, "[loop] body must be an array of task names")
        return None
    if not value:
        chk.error("bad-value", where, "[loop] body must name at least one task")
        return None
    return str_items(chk, where, value, "[loop] body")


def check_loop_graph(
    chk: Checker,
    loop: Mapping[str, Any],
    tasks: Sequence[Mapping[str, Any]],
    written_body: Sequence[str] | None = None,
) -> None:
    """The rules across tasks; ``written_body`` is the body in the author's order
    (for locating an entry; the plan keeps it sorted)."""
    by_name = {t["name"]: t for t in reversed(tasks)}
    order = list(written_body) if written_body is not None else list(loop["body"])

    def at(name: str) -> KeyPath:
        return (*_PATH, "body", order.index(name)) if name in order else (*_PATH, "body")

    body = set(loop["body"])
    for name in loop["body"]:
        task = by_name.get(name)
        if task is None:
            chk.error(
                "loop-unknown-task",
                at(name),
                f"[loop] body names {name!r}, which is not a task of this workflow",
            )
        elif task["epilogue"]:
            chk.error(
                "loop-epilogue",
                at(name),
                f"[loop] body names {name!r}, an epilogue: epilogues run once, after the loop",
            )
        elif "map" in task or "matrix" in task:
            chk.error(
                "loop-mapped",
                at(name),
                f"[loop] body names {name!r}, a mapped task: a loop cannot run inside a "
                "fan-out (loop over the whole mapped task's consumer instead)",
            )
    _check_score(chk, loop, by_name, body)
    if body <= by_name.keys():
        _check_convex(chk, tasks, body, at)


def _check_score(
    chk: Checker, loop: Mapping[str, Any], by_name: Mapping[str, Mapping[str, Any]], body: set[str]
) -> None:
    score = loop["score"]
    where = (*_PATH, "score")
    task = by_name.get(score)
    if task is None:
        chk.error(
            "loop-unknown-task",
            where,
            f"[loop] score names {score!r}, which is not a task of this workflow",
        )
        return
    if score not in body:
        chk.error(
            "loop-score-not-in-body",
            where,
            f"[loop] score task {score!r} is not in the body: add it to body",
        )
    if task["kind"] != "evaluate":
        chk.error(
            "loop-score-not-evaluate",
            where,
            f"[loop] score task {score!r} is a {task['kind']} task; it must be "
            'kind = "evaluate" (its verdict gates the revision, its metric scores it)',
        )
    metric = loop["metric"]
    declared = task["emits"].get(metric)
    if declared is None:
        chk.error(
            "loop-metric-undeclared",
            (*_PATH, "metric"),
            f"[loop] metric {metric!r} is not a field score task {score!r} declares "
            f'in emits; add {metric} = "number" to its emits',
        )
    elif declared not in _NUMERIC:
        chk.error(
            "loop-metric-not-numeric",
            (*_PATH, "metric"),
            f"[loop] metric {metric!r} of task {score!r} is declared {declared}; a score "
            "is an integer or a number",
        )


def _check_convex(
    chk: Checker,
    tasks: Sequence[Mapping[str, Any]],
    body: set[str],
    at: Any,
) -> None:
    """Refuse a path body -> outside -> body: the outside task would have to run
    inside every revision, so the body would not be a sub-DAG of the pack."""
    users: dict[str, list[str]] = {}
    for task in tasks:
        for need in task["needs"]:
            users.setdefault(need, []).append(task["name"])
    # breadth-first from the body through outside tasks only, remembering how each
    # outside task was reached so the message can print the path
    came_from: dict[str, str] = {}
    frontier = sorted(body)
    while frontier:
        nxt: list[str] = []
        for node in frontier:
            for user in users.get(node, ()):
                if user in body:
                    if node in body:
                        continue  # an edge inside the body
                    path = [user, node]
                    while path[-1] not in body:
                        path.append(came_from[path[-1]])
                    route = " -> ".join(reversed(path))
                    outside = path[-2]
                    chk.error(
                        "loop-not-subdag",
                        at(user),
                        f"[loop] body is not a sub-DAG: {outside!r} is outside the body "
                        f"but lies between body tasks ({route}); add it to body or "
                        "remove the dependency",
                    )
                    return
                if user not in came_from:
                    came_from[user] = node
                    nxt.append(user)
        frontier = nxt


def describe_loop(loop: Mapping[str, Any]) -> str:
    """One line for people (``--graph``): what the loop optimizes and when it stops."""
    parts = [
        f"loop: {loop['direction']} {loop['score']}.{loop['metric']}",
        f"at most {loop['max_revisions']} revisions",
    ]
    if "target" in loop:
        parts.append(f"target {loop['target']}")
    if "patience" in loop:
        parts.append(f"patience {loop['patience']}")
    if loop.get("min_delta"):
        parts.append(f"min_delta {loop['min_delta']}")
    if "time_budget" in loop:
        parts.append(f"time budget {loop['time_budget']} s")
    return ", ".join(parts)

"""Control-flow keys of edition 4: ``when``, ``on_failure``, ``allow_exit``,
``retry``, ``deadline`` (docs/spec/manifest.md, "Control flow").

Two passes, like the rest of the compiler: :func:`check_control_keys` checks
one task's values and writes their normal form into the plan task (called from
``shape.check_task``); :func:`check_control_rules` checks what spans tasks —
the names a condition reads — once the graph is sound (called from
``rules.check_graph``).

Conditions are Starlark expressions (starlark-pyo3, already our Starlark
engine): deterministic, no I/O, no unbounded loops, so a condition can neither
touch the machine nor hang the dispatcher. Starlark parses and evaluates them;
the names an expression reads are found by walking Python's ``ast`` of the same
text, since starlark-pyo3 exposes no syntax tree (Starlark's expression grammar
is a subset of Python's, so the walk sees exactly what Starlark will read; an
expression only Starlark accepts is refused as ``when-syntax``).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from crucible.compile._checker import Checker, type_name
from crucible.compile._durations import duration_problem
from crucible.core.canon import MAX_SAFE_INTEGER
from crucible.core.structs import dataclass

if TYPE_CHECKING:
    from crucible.compile._diagnostics import KeyPath

__all__ = [
    "CONDITION_ROOTS",
    "ON_FAILURE",
    "RETRY_DEFAULTS",
    "RETRY_KEYS",
    "RETRY_WHEN_FIELDS",
    "Read",
    "check_control_keys",
    "check_control_rules",
    "condition_reads",
    "parse_condition",
]

ON_FAILURE: tuple[str, ...] = ("fail", "continue")
RETRY_KEYS: tuple[str, ...] = (
    "limit",
    "delay",
    "factor",
    "max_delay",
    "on_exit",
    "on_timeout",
    "when",
)
#: what ``retry.when`` reads of the failed attempt (issue 32; Argo's ``lastRetry``)
RETRY_WHEN_FIELDS: tuple[str, ...] = (
    "exit_code",
    "signal",
    "reason",
    "duration_s",
    "stderr_tail",
    "attempt",
)
#: written out in the plan when a ``retry`` table leaves them out (normal form)
RETRY_DEFAULTS: dict[str, Any] = {"delay": 0.5, "factor": 2, "max_delay": 30, "on_timeout": True}
#: the names a condition may start from (DESIGN.md fixes them)
CONDITION_ROOTS: tuple[str, ...] = ("params", "inputs", "item", "needs", "outcome")
#: Starlark's standard global functions and constants, plus the two extensions the
#: evaluator loads (struct, json); anything else a condition names is refused.
_BUILTINS = frozenset(
    [
        "True",
        "False",
        "None",
        "any",
        "all",
        "bool",
        "dict",
        "dir",
        "enumerate",
        "fail",
        "float",
        "getattr",
        "hasattr",
        "hash",
        "int",
        "len",
        "list",
        "max",
        "min",
        "range",
        "repr",
        "reversed",
        "sorted",
        "str",
        "tuple",
        "type",
        "zip",
        "struct",
        "json",
    ]
)
#: longest condition we accept (our choice: a condition is a line, not a program)
MAX_CONDITION = 4096


@dataclass(frozen=True)
class Read:
    """One name chain a condition reads: ``needs.build.status`` → ("needs", "build", "status")."""

    parts: tuple[str, ...]
    line: int
    col: int


def parse_condition(text: str) -> ast.Expression | str:
    """The expression's Python AST, or a one-line reason it is not one Starlark expression."""
    # lazy: starlark is heavy; only parse_condition() needs it
    import starlark

    # lazy: compile._starbound is not loaded with this module; only parse_condition() needs it
    from crucible.compile._starbound import MAX_NESTING, nesting_problem

    if len(text) > MAX_CONDITION:
        return f"a condition is at most {MAX_CONDITION} characters"
    # Both parsers recurse on the nesting (4,000 unary minus signs: a RecursionError
    # in Python's, a native stack overflow in Starlark's): bounded first.
    deep = nesting_problem(text)
    if deep is not None:
        at = deep[0]
        return f"nested deeper than {MAX_NESTING} levels (at {at.line}:{at.col})"
    try:
        starlark.parse("when", text)
    except starlark.StarlarkError as exc:
        return _starlark_reason(str(exc))
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        # Starlark accepted a statement (x = 1) or syntax Python lacks.
        where = f" at 1:{exc.offset}" if exc.offset else ""
        return f"not a single expression{where}"
    except (RecursionError, MemoryError):  # a shape the nesting bound did not foresee
        return f"nested too deeply to parse (at most {MAX_NESTING} levels)"
    return tree


def _starlark_reason(report: str) -> str:
    """First line of starlark's report, plus the ``line:col`` from its ``--> when:L:C``."""
    lines = report.splitlines()
    head = lines[0].removeprefix("error: ") if lines else "syntax error"
    # "…, expected one of "(", "+", … or "~"": the list of tokens says little
    head = head.split(", expected one of ")[0]
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("--> when:"):
            return f"{head} (at {stripped.removeprefix('--> when:')})"
    return head


def condition_reads(tree: ast.Expression) -> list[Read]:
    """Every free name of the expression with the attribute chain read from it."""
    bound: set[str] = set()
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
        if isinstance(node, ast.comprehension):
            bound.update(n.id for n in ast.walk(node.target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Lambda):
            bound.update(a.arg for a in node.args.args)
    reads: list[Read] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Name) or node.id in bound:
            continue
        parts = [node.id]
        cur: ast.AST = node
        while isinstance(up := parents.get(id(cur)), ast.Attribute) and up.value is cur:
            parts.append(up.attr)
            cur = up
        reads.append(Read(tuple(parts), node.lineno, node.col_offset + 1))
    reads.sort(key=lambda r: (r.line, r.col))
    return reads


# -- one task's keys ---------------------------------------------------------


def _number(
    chk: Checker, path: KeyPath, value: object, what: str, *, zero: bool, duration: bool = True
) -> bool:
    """A number of seconds within MAX_DURATION_S (``duration``), or a factor."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        chk.wrong_type(path, value, f"{what} must be a number")
        return False
    if duration:
        problem = duration_problem(value, zero=zero)
        if problem is not None:
            chk.error("bad-value", path, f"{what} {problem}, not {value!r}")
            return False
        return True
    low_ok = value >= 0 if zero else value > 0
    if not (math.isfinite(value) and low_ok and value <= MAX_SAFE_INTEGER):
        bound = "zero or more" if zero else "greater than zero"
        chk.error("bad-value", path, f"{what} must be {bound} and at most 2^53-1, not {value!r}")
        return False
    return True


def _exit_codes(chk: Checker, path: KeyPath, value: object, what: str) -> list[int] | None:

    if not isinstance(value, list | tuple) or not value:
        chk.error("wrong-type", path, f"{what} must be a non-empty array of exit codes")
        return None
    codes: list[int] = []
    for i, code in enumerate(value):
        if type(code) is not int:
            chk.wrong_type((*path, i), code, f"{what}[{i}] must be an integer")
            return None
        if not 1 <= code <= 255:
            chk.error(
                "bad-value", (*path, i), f"{what}[{i}] must be an exit code 1…255, not {code}"
            )
            return None
        if code in codes:
            chk.error("duplicate-entry", (*path, i), f"{what} lists {code} twice")
            return None
        codes.append(code)
    return sorted(codes)


def _check_retry(chk: Checker, path: KeyPath, raw: object) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        chk.wrong_type(path, raw, "retry must be a table")
        return None
    ok = chk.known_keys(path, raw, RETRY_KEYS, "retry")
    if "limit" not in raw:
        chk.error(
            "missing-key", path, "retry has no limit (how many retries after the first attempt)"
        )
        return None
    limit = raw["limit"]
    if type(limit) is not int:
        chk.wrong_type((*path, "limit"), limit, "retry limit must be an integer")
        return None
    if not 0 <= limit <= 1000:
        chk.error(
            "bad-value", (*path, "limit"), f"retry limit must be between 0 and 1000, not {limit}"
        )
        return None
    out: dict[str, Any] = {"limit": limit, **RETRY_DEFAULTS}
    for key in ("delay", "max_delay"):
        if key in raw:
            if _number(chk, (*path, key), raw[key], f"retry {key}", zero=True):
                out[key] = raw[key]
            else:
                ok = False
    if "factor" in raw:
        factor = raw["factor"]
        if (
            _number(chk, (*path, "factor"), factor, "retry factor", zero=False, duration=False)
            and factor >= 1
        ):
            out["factor"] = factor
        else:
            if not isinstance(factor, bool) and isinstance(factor, int | float) and 0 < factor < 1:
                chk.error(
                    "bad-value", (*path, "factor"), f"retry factor must be 1 or more, not {factor}"
                )
            ok = False
    if "on_timeout" in raw:
        if isinstance(raw["on_timeout"], bool):
            out["on_timeout"] = raw["on_timeout"]
        else:
            chk.wrong_type(
                (*path, "on_timeout"), raw["on_timeout"], "retry on_timeout must be a boolean"
            )
            ok = False
    if "on_exit" in raw:
        codes = _exit_codes(chk, (*path, "on_exit"), raw["on_exit"], "retry on_exit")
        if codes is None:
            ok = False
        else:
            out["on_exit"] = codes
    if "when" in raw:
        when = _check_retry_when(chk, (*path, "when"), raw["when"])
        if when is None:
            ok = False
        else:
            out["when"] = when
    return out if ok else None


def _check_retry_when(chk: Checker, path: KeyPath, when: object) -> str | None:
    """``retry.when``: one expression reading only ``last.<field>`` (and Starlark's
    built-ins); kept as written."""
    if not isinstance(when, str):
        chk.error("wrong-type", path, f"retry when must be a string, not {type_name(when)}")
        return None
    if not when.strip():
        chk.error("bad-value", path, "retry when must not be empty")
        return None
    parsed = parse_condition(when)
    if isinstance(parsed, str):
        chk.error("when-syntax", path, f"retry when {_shown(when)}: {parsed}")
        return None
    for read in condition_reads(parsed):
        root, rest = read.parts[0], read.parts[1:]
        problem = None
        if root == "last":
            if rest and rest[0] not in RETRY_WHEN_FIELDS:
                problem = f"last.{rest[0]}: the last attempt has {', '.join(RETRY_WHEN_FIELDS)}"
        elif root not in _BUILTINS:
            problem = f"unknown name {root!r} (a retry condition reads last.<field>)"
        if problem is not None:
            chk.error("when-unknown-name", path, f"retry when at {read.line}:{read.col}: {problem}")
            return None
    return when


def check_control_keys(
    chk: Checker, path: KeyPath, raw: Mapping[str, Any], task: dict[str, Any], known: frozenset[str]
) -> None:
    """Check the control keys of one task and set their normal form in ``task``:
    ``when`` as written, ``on_failure`` only when ``"continue"``, ``allow_exit``
    sorted, ``retry`` with every default written out, ``deadline``."""
    if "when" in raw and "when" in known:
        when = raw["when"]
        if not isinstance(when, str):
            chk.error(
                "wrong-type", (*path, "when"), f"when must be a string, not {type_name(when)}"
            )
        elif not when.strip():
            chk.error("bad-value", (*path, "when"), "when must not be empty")
        else:
            parsed = parse_condition(when)
            if isinstance(parsed, str):
                chk.error("when-syntax", (*path, "when"), f"when {_shown(when)}: {parsed}")
            else:
                task["when"] = when
    if "on_failure" in raw and "on_failure" in known:
        value = raw["on_failure"]
        if value not in ON_FAILURE or not isinstance(value, str):
            chk.error(
                "bad-value",
                (*path, "on_failure"),
                f"on_failure must be one of {', '.join(map(repr, ON_FAILURE))}, not {value!r}",
            )
        elif value == "continue":
            task["on_failure"] = value
    if "allow_exit" in raw and "allow_exit" in known:
        codes = _exit_codes(chk, (*path, "allow_exit"), raw["allow_exit"], "allow_exit")
        if codes is not None:
            if raw.get("on_failure") == "fail":
                chk.error(
                    "control-conflict",
                    (*path, "allow_exit"),
                    'allow_exit tolerates failures, on_failure = "fail" tolerates none: drop one',
                )
            else:
                task["allow_exit"] = codes
    if "retry" in raw and "retry" in known:
        retry = _check_retry(chk, (*path, "retry"), raw["retry"])
        if retry is not None:
            if raw.get("retries", 0) != 0:
                chk.error(
                    "control-conflict",
                    (*path, "retry"),
                    "retries and retry both set the number of retries: keep retry "
                    "(retries = N is retry = { limit = N })",
                )
            else:
                task["retry"] = retry
    if (
        "deadline" in raw
        and "deadline" in known
        and _number(
            chk,
            (*path, "deadline"),
            raw["deadline"],
            "deadline (seconds over all attempts)",
            zero=False,
        )
    ):
        task["deadline"] = raw["deadline"]


def _shown(text: str) -> str:
    """The condition as a message quotes it: a long one by its start."""
    return repr(text) if len(text) <= 80 else f"{text[:60]!r}… ({len(text)} characters)"


# -- rules across tasks ------------------------------------------------------


def _read_problem(
    read: Read, task: dict[str, Any], params: Mapping[str, Any] | None, mapped: set[str]
) -> str | None:
    root, rest = read.parts[0], read.parts[1:]
    if root in _BUILTINS:
        return None
    if root not in CONDITION_ROOTS:
        return f"unknown name {root!r} (a condition reads {', '.join(CONDITION_ROOTS)})"
    first = rest[0] if rest else None
    if root == "params":
        if first is not None and params is not None and first not in params:
            return f"params.{first}: no param {first!r} is declared"
    elif root == "inputs":
        if first is not None and first not in task.get("inputs", {}):
            return f"inputs.{first}: task {task['name']!r} declares no input {first!r}"
    elif root == "item":
        if "map" not in task and "matrix" not in task:
            return f"item: task {task['name']!r} is not mapped, so it has no item"
    elif root == "needs":
        if first is not None and first not in task["needs"]:
            return f"needs.{first}: {first!r} is not in the needs of task {task['name']!r}"
        if len(rest) >= 2 and rest[1] == "counts" and first not in mapped:
            return f"needs.{first}.counts: {first!r} is not mapped (counts are per instance status)"
        if len(rest) >= 2 and rest[1] not in ("status", "counts"):
            return f"needs.{first}.{rest[1]}: a need has a status (and, when mapped, counts)"
    elif root == "outcome":
        if not task["epilogue"]:
            return f"outcome: task {task['name']!r} is not an epilogue, so it has no outcome"
        if first is not None and first != "status":
            return f"outcome.{first}: a condition reads only outcome.status"
    return None


def check_control_rules(
    chk: Checker,
    tasks: Sequence[dict[str, Any]],
    paths: Sequence[KeyPath],
    params: Mapping[str, Any] | None,
) -> None:
    """Every name a ``when`` reads must exist: a declared param (when the caller
    knows them), a declared input, a direct need's status, ``item`` in a mapped
    task, ``outcome.status`` in an epilogue."""
    mapped = {t["name"] for t in tasks if "map" in t or "matrix" in t}
    for task, path in zip(tasks, paths, strict=True):
        when = task.get("when")
        if when is None:
            continue
        tree = parse_condition(when)
        if isinstance(tree, str):  # a plan file: the structural pass reported it
            continue
        for read in condition_reads(tree):
            problem = _read_problem(read, task, params, mapped)
            if problem is not None:
                chk.error(
                    "when-unknown-name",
                    (*path, "when"),
                    f"when of task {task['name']!r} at {read.line}:{read.col}: {problem}",
                )

"""Run params: read ``--params FILE`` and ``-p NAME=VALUE``, check them against the
pack's params schema, fill defaults (docs/spec/run.md, "Params").

``-p`` values are text; each is read according to the param's declared type
(``string`` verbatim, every other type as canonical JSON), so ``-p n=3`` is the
integer 3 and ``-p who=3`` the string "3" when ``who`` is a string.

One rule for integers, the one capture applies to a task's result
(docs/spec/inputs.md): an integer is a JSON number without a fractional part
within ±(2^53−1), so ``2.0`` is the integer 2 and ``2.5`` is not an integer.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from crucible.core import canon
from crucible.core.contract import json_type
from crucible.core.errors import InputRefused, ParseError, UsageError
from crucible.core.fsio import read_named
from crucible.core.plan import Plan

__all__ = ["changed_param", "read_params_file", "resolve_params"]


def read_params_file(path: str) -> dict[str, Any]:
    if path == "-":
        data = sys.stdin.buffer.read()
    else:
        data = read_named(
            Path(path),
            path,
            missing="no such params file",
            directory="the params file is a directory",
            cannot="cannot read params file",
        )
    try:
        value = canon.loads(data)
    except canon.CanonError as exc:
        raise ParseError(exc.message, where=path) from None
    if not isinstance(value, dict):
        raise InputRefused("params must be a JSON object", where=path)
    return value


def _article(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def _typed(name: str, declared: str, value: Any) -> Any:
    """``value`` as a value of the declared type, or a refusal saying what is wrong."""
    where = f"params.{name}"
    if isinstance(value, float) and not math.isfinite(value):
        raise InputRefused(f"param {name!r}: {value} is not a number JSON can carry", where=where)
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and abs(value) > canon.MAX_SAFE_INTEGER
        and json_type(value) == "integer"
        # an integer literal past 2^53 has no exact value; 1.5e308 is a fine number,
        # only not an integer
        and (isinstance(value, int) or declared == "integer")
    ):
        raise InputRefused(
            f"param {name!r}: {_number_text(value)} is outside the integers JSON carries "
            "exactly, ±(2^53−1)",
            where=where,
        )
    if declared == "any":
        return value
    actual = json_type(value)
    if declared == "integer" and actual == "integer":
        return int(value)
    if declared == "number" and actual in ("integer", "number"):
        return value
    if declared == actual:
        return value
    detail = ""
    if declared == "integer" and actual == "number":
        detail = f" ({value!r} has a fractional part)"
    raise InputRefused(
        f"param {name!r} must be {_article(declared)}, not {_article(actual)}{detail}",
        where=where,
    )


def _number_text(value: int | float) -> str:
    """A number as its JSON text: an integer exactly (``{:.0f}`` of 2^53+1 rounded
    it to 2^53), a float by its shortest spelling (``1.5e+308``, not 309 digits)."""
    return str(value) if isinstance(value, int) else repr(value)


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 60 else f"{text[:50]!r}… ({len(text)} characters)"


def _from_text(name: str, declared: str, text: str) -> Any:
    if declared == "string":
        return text
    try:
        return canon.loads(text.encode("utf-8", "surrogatepass"))
    except canon.CanonError as exc:
        try:
            parsed = json.loads(text)
        except (ValueError, RecursionError):
            parsed = exc  # not JSON at all
        if parsed is not exc:
            # JSON, but outside what crucible accepts: a number at the top says so in
            # its own words (_typed raises); anything else by what canon refused —
            # never let through to be refused later, without the param's name.
            _typed(name, declared, parsed)
            raise InputRefused(
                f"param {name!r}: {_shown(text)} is JSON crucible does not accept "
                f"({exc.message.removeprefix('invalid JSON: ')})",
                where=f"params.{name}",
            ) from None
        if declared == "any":
            return text
        raise InputRefused(
            f"param {name!r} expects {_article(declared)}; {_shown(text)} is not JSON "
            f"({exc.message.removeprefix('invalid JSON: ')})",
            where=f"params.{name}",
        ) from None


def resolve_params(plan: Plan, given: dict[str, Any], pairs: tuple[str, ...]) -> dict[str, Any]:
    """The params object a run uses: ``given`` (from a file) overridden by ``-p``
    pairs, each read by its declared type, then checked against the plan's params
    schema (unknown names, types, required values) with defaults filled in, by
    the compiler's public ``check_params`` (one set of rules for every tool)."""
    # lazy: compile._params is not loaded with this module; only resolve_params() needs it
    from crucible.compile import check_params

    schema = plan.workflow.params
    supplied = dict(given)
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"-p expects NAME=VALUE, got {pair!r}")
        if name not in schema:
            known = ", ".join(sorted(schema)) or "none"
            raise InputRefused(
                f"unknown param {name!r} (declared: {known})", where=f"params.{name}"
            )
        supplied[name] = _from_text(name, schema[name].type, text)
    for name, value in supplied.items():
        if name in schema:
            supplied[name] = _typed(name, schema[name].type, value)
    declared = {"workflow": {"params": {n: p.to_json() for n, p in schema.items()}}}
    return check_params(declared, supplied)


def changed_param(stored: dict[str, Any], resolved: dict[str, Any]) -> str | None:
    """The first param (by name) whose value differs between two resolved objects."""
    for name in sorted(set(stored) | set(resolved)):
        if name not in stored or name not in resolved:
            return name
        if canon.dumps(stored[name]) != canon.dumps(resolved[name]):
            return name
    return None

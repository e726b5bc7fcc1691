"""Run params: read ``--params FILE`` and ``-p NAME=VALUE``, check them against the
pack's params schema, fill defaults (docs/spec/run.md, "Params").

``-p`` values are text; each is read according to the param's declared type
(``string`` verbatim; ``integer``, ``number``, ``boolean``, ``object``,
``array`` and ``any`` as JSON), so ``-p n=3`` is the integer 3 and
``-p who=3`` the string "3" when ``who`` is a string.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from crucible.core import canon
from crucible.core.errors import InputRefused, OperationalError, ParseError, UsageError

__all__ = ["parse_pairs", "read_params_file", "resolve_params"]


def read_params_file(path: str) -> dict[str, Any]:
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except FileNotFoundError:
        raise UsageError("no such params file", where=path) from None
    except OSError as exc:
        raise OperationalError(f"cannot read params file: {exc.strerror}", where=path) from None
    try:
        value = canon.loads(data)
    except canon.CanonError as exc:
        raise ParseError(exc.message, where=path) from None
    if not isinstance(value, dict):
        raise InputRefused("params must be a JSON object", where=path)
    return value


def parse_pairs(pairs: tuple[str, ...]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"-p expects NAME=VALUE, got {pair!r}")
        out.append((name, value))
    return out


def _coerce(name: str, text: str, declared: str) -> Any:
    if declared == "string":
        return text
    try:
        return canon.loads(text)
    except canon.CanonError:
        if declared == "any":
            return text
        raise InputRefused(f"value {text!r} is not a JSON {declared}", where=f"-p {name}") from None


def _type_ok(value: Any, declared: str) -> bool:
    if declared == "any":
        return True
    if declared == "string":
        return isinstance(value, str)
    if declared == "boolean":
        return isinstance(value, bool)
    if declared == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if declared == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if declared == "object":
        return isinstance(value, dict)
    if declared == "array":
        return isinstance(value, list)
    return False


def resolve_params(
    schema: dict[str, dict[str, Any]],
    given: dict[str, Any],
    pairs: list[tuple[str, str]],
    *,
    source: str = "params",
) -> dict[str, Any]:
    """The params object a run uses: ``given`` (from a file) overridden by ``pairs``,
    checked against ``schema`` (unknown names, types, required values), defaults filled."""
    values = dict(given)
    where: dict[str, str] = {name: f"{source}:$.{name}" for name in given}
    for name, text in pairs:
        if name not in schema:
            raise InputRefused(
                f"unknown param {name!r} (declared: {_names(schema)})", where=f"-p {name}"
            )
        values[name] = _coerce(name, text, schema[name].get("type", "any"))
        where[name] = f"-p {name}"
    for name, value in values.items():
        if name not in schema:
            raise InputRefused(
                f"unknown param {name!r} (declared: {_names(schema)})", where=where[name]
            )
        declared = schema[name].get("type", "any")
        if not _type_ok(value, declared):
            raise InputRefused(
                f"param {name!r} must be {declared}, got {canon.dumps_str(value)[:60]}",
                where=where[name],
            )
    for name, spec in schema.items():
        if name not in values:
            if "default" not in spec:
                raise InputRefused(
                    f"param {name!r} is required (no default): pass -p {name}=VALUE", where=source
                )
            values[name] = spec["default"]
    return values


def _names(schema: dict[str, Any]) -> str:
    return ", ".join(sorted(schema)) or "none"

"""Run params: read ``--params FILE`` and ``-p NAME=VALUE``, check them against the
pack's params schema, fill defaults (docs/spec/run.md, "Params").

``-p`` values are text; each is read according to the param's declared type
(``string`` verbatim, every other type as JSON), so ``-p n=3`` is the integer 3
and ``-p who=3`` the string "3" when ``who`` is a string.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from crucible.core import canon
from crucible.core.errors import InputRefused, OperationalError, ParseError, UsageError

__all__ = ["read_params_file", "resolve_params"]


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


def resolve_params(
    plan: dict[str, Any], given: dict[str, Any], pairs: tuple[str, ...]
) -> dict[str, Any]:
    """The params object a run uses: ``given`` (from a file) overridden by ``-p``
    pairs, each read by its declared type, then checked against the plan's params
    schema (unknown names, types, required values) with defaults filled in, by
    ``crucible.compile.params`` (one set of rules for every tool)."""
    from crucible.compile import params as schema_params

    supplied = dict(given)
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"-p expects NAME=VALUE, got {pair!r}")
        supplied[name] = schema_params.coerce(plan, name, text)
    return schema_params.check(plan, supplied)

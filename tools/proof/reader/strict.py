"""Bounded, strict JSON reading for bundle files.

Order of checks for one file (docs/spec/verify.md, "Phase 1"): the byte ceiling
(done by the caller before reading), then parsing (syntax, UTF-8, NaN), nesting
depth, container and string bounds (``input-over-bound``), then the integer
domain and duplicate keys (``input-malformed``), then, for files that must be
canonical, byte equality with their RFC 8785 form (``input-malformed``).

orjson parses (its own depth limit of 1024 stops hostile nesting before Python
recursion is involved); one iterative walk then measures the value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from crucible.core import canon
from crucible.proof.reader.findings import Problem

__all__ = ["JsonBounds", "parse_json"]

_MAX_SAFE = 2**53 - 1


@dataclass(frozen=True)
class JsonBounds:
    """Structural ceilings for one JSON file (our choice; docs/spec/verify.md)."""

    depth: int = 32
    members: int = 4096
    string_bytes: int = 65536


def parse_json(data: bytes, path: str, bounds: JsonBounds, *, canonical: bool) -> Any:
    """Parse ``data`` strictly within ``bounds``; raise a phase-1 :class:`Problem`."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc) or "recursion" in str(exc):
            raise Problem(
                "input-over-bound", 1, f"nesting deeper than {bounds.depth}", path=path
            ) from None
        raise Problem("input-malformed", 1, f"invalid JSON: {exc}", path=path) from None
    _measure(value, path, bounds)
    if canonical:
        try:
            again = canon.dumps(value)
        except canon.CanonError as exc:
            raise Problem("input-malformed", 1, exc.message, path=path) from None
        if again == data:
            return value
    # Not canonical (or not required to be): duplicate keys are the one strict-JSON
    # violation orjson accepts silently; canon.loads names them.
    try:
        canon.loads(data)
    except canon.CanonError as exc:
        raise Problem("input-malformed", 1, exc.message, path=path) from None
    if canonical:
        raise Problem("input-malformed", 1, "not canonical JSON (RFC 8785) bytes", path=path)
    return value


def _measure(value: Any, path: str, bounds: JsonBounds) -> None:
    stack: list[tuple[Any, int]] = [(value, 1)]
    malformed: str | None = None
    while stack:
        v, depth = stack.pop()
        t = type(v)
        if t is dict or t is list:
            if depth > bounds.depth:
                raise Problem(
                    "input-over-bound", 1, f"nesting deeper than {bounds.depth}", path=path
                )
            if len(v) > bounds.members:
                raise Problem(
                    "input-over-bound",
                    1,
                    f"a container holds {len(v)} members (at most {bounds.members})",
                    path=path,
                )
            if t is dict:
                for k, item in v.items():
                    if len(k.encode("utf-8", "surrogatepass")) > bounds.string_bytes:
                        raise Problem("input-over-bound", 1, "an object key is too long", path=path)
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in v)
        elif t is str:
            if (
                len(v) > bounds.string_bytes // 4
                and len(v.encode("utf-8", "surrogatepass")) > bounds.string_bytes
            ):
                raise Problem(
                    "input-over-bound",
                    1,
                    f"a string exceeds {bounds.string_bytes} bytes",
                    path=path,
                )
        elif t is int and not -_MAX_SAFE <= v <= _MAX_SAFE and malformed is None:
            malformed = f"integer {v} is outside ±(2^53−1)"
    if malformed is not None:
        raise Problem("input-malformed", 1, malformed, path=path)

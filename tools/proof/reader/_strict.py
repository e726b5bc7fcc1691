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

from collections.abc import Iterator
from typing import Any

import orjson

from crucible.core import canon
from crucible.core.structs import dataclass
from crucible.proof.reader._findings import Problem, over_bound

__all__ = ["JsonBounds", "check_bounds", "parse_json"]

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
            raise over_bound(f"nesting deeper than {bounds.depth}", path) from None
        raise Problem("input-malformed", 1, f"invalid JSON: {exc}", path=path) from None
    _measure(value, path, bounds)
    if canonical:
        try:
            if _canonical_equal(value, data):
                return value
        except canon.CanonError as exc:
            raise Problem("input-malformed", 1, exc.message, path=path) from None
    # Not canonical (or not required to be): duplicate keys are the one strict-JSON
    # violation orjson accepts silently; canon.loads names them.
    try:
        canon.loads(data)
    except canon.CanonError as exc:
        raise Problem("input-malformed", 1, exc.message, path=path) from None
    if canonical:
        raise Problem("input-malformed", 1, "not canonical JSON (RFC 8785) bytes", path=path)
    return value


def _utf16(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")


def _chunks(value: Any, depth: int) -> Iterator[bytes]:
    """The RFC 8785 bytes of ``value`` in pieces: containers down to ``depth`` are
    opened here, deeper values serialized whole by ``canon.dumps``."""
    t = type(value)
    if depth and t is dict and value:
        sep = b"{"
        for key in sorted(value, key=_utf16):
            yield sep + canon.dumps(key) + b":"
            yield from _chunks(value[key], depth - 1)
            sep = b","
        yield b"}"
    elif depth and t is list and value:
        sep = b"["
        for item in value:
            yield sep
            yield from _chunks(item, depth - 1)
            sep = b","
        yield b"]"
    else:
        yield canon.dumps(value)


def _canonical_equal(value: Any, data: bytes) -> bool:
    """``canon.dumps(value) == data`` without building a second copy of a large file."""
    if len(data) < (1 << 20):
        return canon.dumps(value) == data
    view = memoryview(data)
    pos = 0
    for chunk in _chunks(value, 3):
        end = pos + len(chunk)
        if end > len(data) or view[pos:end] != chunk:
            return False
        pos = end
    return pos == len(data)


def check_bounds(value: Any, path: str, bounds: JsonBounds, *, depth: int = 1) -> None:
    """Nesting, container and string bounds (over-bound), then the integer domain
    (malformed), of a parsed value sitting at nesting level ``depth``."""
    _measure(value, path, bounds, depth)


def _measure(value: Any, path: str, bounds: JsonBounds, start: int = 1) -> None:
    stack: list[tuple[Any, int]] = [(value, start)]
    malformed: str | None = None
    while stack:
        v, depth = stack.pop()
        t = type(v)
        if t is dict or t is list:
            if depth > bounds.depth:
                raise over_bound(f"nesting deeper than {bounds.depth}", path)
            if len(v) > bounds.members:
                raise over_bound(
                    f"a container holds {len(v)} members (at most {bounds.members})", path
                )
            if t is dict:
                for k, item in v.items():
                    if len(k.encode("utf-8", "surrogatepass")) > bounds.string_bytes:
                        raise over_bound("an object key is too long", path)
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in v)
        elif t is str:
            if (
                len(v) > bounds.string_bytes // 4
                and len(v.encode("utf-8", "surrogatepass")) > bounds.string_bytes
            ):
                raise over_bound(f"a string exceeds {bounds.string_bytes} bytes", path)
        elif t is int and not -_MAX_SAFE <= v <= _MAX_SAFE and malformed is None:
            malformed = f"integer {v} is outside ±(2^53−1)"
    if malformed is not None:
        raise Problem("input-malformed", 1, malformed, path=path)

"""NDJSON: one canonical JSON object per line, ``\\n``-terminated.

Readers are lazy and keep the line number, so a bad line is reported as
``file:line``; the error is raised where the iteration happens.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import IO, Any

import orjson

from crucible.core import canon
from crucible.core.errors import Location, ParseError
from crucible.core.fdio import write_all

__all__ = ["NdjsonError", "append", "dumps_line", "iter_lines", "read_path", "write"]


class NdjsonError(ParseError):
    code = "ndjson"


def dumps_line(value: Any) -> bytes:
    """Canonical bytes of one object plus ``\\n``."""
    if not isinstance(value, dict):
        raise NdjsonError("an NDJSON record must be a JSON object")
    return canon.dumps(value) + b"\n"


def iter_lines(
    stream: Iterable[bytes], *, name: str = "-", strict: bool = True, skip_blank: bool = True
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)``; a bad line raises :class:`NdjsonError` at
    ``name:line``. ``strict`` uses :func:`canon.loads` (duplicate keys refused)."""

    parse = canon.loads if strict else orjson.loads
    for number, raw in enumerate(stream, start=1):
        line = raw.rstrip(b"\n")
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line.strip():
            if skip_blank:
                continue
            raise NdjsonError("blank line", location=Location(name, number))
        try:
            value = parse(line)
        except (canon.CanonError, orjson.JSONDecodeError) as exc:
            message = exc.message if isinstance(exc, canon.CanonError) else f"invalid JSON: {exc}"
            raise NdjsonError(message, location=Location(name, number)) from None
        if not isinstance(value, dict):
            raise NdjsonError("line is not a JSON object", location=Location(name, number))
        yield number, value


def read_path(
    path: str | os.PathLike[str], *, strict: bool = True
) -> Iterator[tuple[int, dict[str, Any]]]:
    """:func:`iter_lines` over a file (``-`` for stdin)."""

    if str(path) == "-":
        yield from iter_lines(sys.stdin.buffer, name="<stdin>", strict=strict)
        return
    with open(path, "rb") as f:
        yield from iter_lines(f, name=str(path), strict=strict)


def write(out: IO[bytes], records: Iterable[dict[str, Any]]) -> None:
    for record in records:
        out.write(dumps_line(record))


def append(fd: int, record: dict[str, Any], *, fsync: bool = True) -> None:
    """Append one line with a single ``write`` (O_APPEND fd) and fsync it."""
    write_all(fd, dumps_line(record))
    if fsync:
        os.fsync(fd)

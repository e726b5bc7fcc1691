"""One ledger line: ``{"c":"<xxh3_64 hex>","r":<canonical record>}`` plus ``\\n``.

The frame is fixed-width so a reader splits checksum and payload by byte slicing:
bytes 0..6 are ``{"c":"``, 6..22 the 16 lowercase hex digits of xxh3_64 over the
payload bytes, 22..28 ``","r":``, then the payload (the record's canonical JSON)
and a closing ``}``. The whole line is itself a canonical JSON object, so any
NDJSON reader can read the file. A line is a record only if the frame is intact,
the checksum matches and the payload is a well-formed record; anything else is a
bad line (or a torn tail, when it is the unterminated end of the file).
"""

from __future__ import annotations

import os
import time
from typing import Any

import orjson
import xxhash

from crucible.core import canon

__all__ = [
    "FORMAT_VERSION",
    "STATUSES",
    "check_record",
    "decode_line",
    "encode_line",
    "fact_line",
    "make_record",
    "read_line_at",
    "utc_now",
]

FORMAT_VERSION = 1
STATUSES = ("ok", "failed")

PREFIX = b'{"c":"'
MIDDLE = b'","r":'
SUM_START = len(PREFIX)  # 6
SUM_END = SUM_START + 16  # 22
PAYLOAD_START = SUM_END + len(MIDDLE)  # 28
SUFFIX = b"}"
MIN_LINE = PAYLOAD_START + 2 + len(SUFFIX)  # the smallest payload is "{}"

_checksum = xxhash.xxh3_64_hexdigest
_intsum = xxhash.xxh3_64_intdigest
_orjson_dumps = orjson.dumps
_SORTED = orjson.OPT_SORT_KEYS
#: canonical JSON's domain walk (True: orjson's bytes are JCS), used by
#: fact_line on the record's value and key only
_domain_fast = canon._fast_ok


_last_stamp: tuple[int, str] = (0, "")


def utc_now() -> str:
    """RFC 3339 UTC to the second (cached per second: appends are a hot path)."""
    global _last_stamp
    now = int(time.time())
    if _last_stamp[0] != now:
        _last_stamp = (now, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)))
    return _last_stamp[1]


def make_record(
    scope: str, step: str, status: str, value: Any, key: Any = None, at: str | None = None
) -> dict[str, Any]:
    """The record object (payload) for one settled fact."""
    record: dict[str, Any] = {
        "v": FORMAT_VERSION,
        "scope": scope,
        "step": step,
        "status": status,
        "value": value,
        "at": at or utc_now(),
    }
    if key is not None:
        record["key"] = key
    return record


def encode_line(record: dict[str, Any]) -> bytes:
    """The framed, ``\\n``-terminated line of ``record`` (raises CanonError outside
    the canonical domain: such a value cannot be recorded)."""
    return _frame(canon.dumps(record))


def _frame(payload: bytes) -> bytes:
    # PREFIX, the checksum as 16 lowercase hex digits, MIDDLE, payload, SUFFIX
    return b'{"c":"%016x","r":%b}\n' % (_intsum(payload), payload)


def fact_line(scope: str, step: str, status: str, value: Any, key: Any, at: str) -> bytes:
    """``encode_line(make_record(scope, step, status, value, key, at))``: the same
    bytes and the same refusals, for the path every append takes. Canonical
    JSON's domain walk visits only ``[value, key]``: the record's other members
    are checked here to be plain strings (and ``v`` is 1), and a list at the
    record's depth holding value and key, in the record's order, is walked
    exactly as the record would be (same depths, same first error). Anything
    else takes ``canon.dumps`` of the whole record (tests/ledger/test_append_fast.py
    pins the two equal)."""
    record = make_record(scope, step, status, value, key, at)
    if (
        type(scope) is str
        and type(step) is str
        and type(status) is str
        and type(at) is str
        and _domain_fast([value, key], "$")
    ):
        try:
            return _frame(_orjson_dumps(record, option=_SORTED))
        except TypeError as exc:  # a lone surrogate: what canon.dumps says
            raise canon.CanonError(f"not canonical JSON: {exc}") from None
    return _frame(canon.dumps(record))


def check_record(record: Any) -> str | None:
    """Why ``record`` is not a well-formed v1 record, or None if it is."""
    if not isinstance(record, dict):
        return "payload is not a JSON object"
    if record.get("v") != FORMAT_VERSION:
        return f"unsupported record version {record.get('v')!r}"
    for field in ("scope", "step"):
        text = record.get(field)
        if not isinstance(text, str) or not text:
            return f"field {field!r} is not a non-empty string"
    if record.get("status") not in STATUSES:
        return "field 'status' is not 'ok' or 'failed'"
    if "value" not in record:
        return "field 'value' is missing"
    if not isinstance(record.get("at"), str):
        return "field 'at' is not a string"
    return None


def frame_problem(line: bytes) -> str | None:
    """Why the frame of ``line`` (without its ``\\n``) is broken, or None."""
    if len(line) < MIN_LINE or not line.startswith(PREFIX) or not line.endswith(SUFFIX):
        return "not a ledger line (bad frame)"
    if line[SUM_END:PAYLOAD_START] != MIDDLE:
        return "not a ledger line (bad frame)"
    if _checksum(line[PAYLOAD_START:-1]).encode("ascii") != line[SUM_START:SUM_END]:
        return "checksum mismatch"
    return None


def decode_line(line: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """``(record, None)`` for a good line (without ``\\n``), else ``(None, reason)``."""
    problem = frame_problem(line)
    if problem is not None:
        return None, problem
    try:
        record = orjson.loads(line[PAYLOAD_START:-1])
    except orjson.JSONDecodeError:
        return None, "payload is not JSON"
    problem = check_record(record)
    if problem is not None:
        return None, problem
    return record, None


def read_line_at(fd: int, pos: int, chunk: int = 4096) -> bytes:
    """The line starting at byte ``pos`` of ``fd``, without its ``\\n``."""
    parts: list[bytes] = []
    offset = pos
    while True:
        block = os.pread(fd, chunk, offset)
        if not block:
            break
        end = block.find(b"\n")
        if end >= 0:
            parts.append(block[:end])
            break
        parts.append(block)
        offset += len(block)
        chunk = min(chunk * 4, 1 << 24)
    return b"".join(parts)

"""One pass over a ledger's bytes: identity -> offset of its latest record.

The hot loop is deliberately lean (it is benchmarked against a plain orjson loop):
checksum and payload are split by byte slicing, the payload bytes are hashed and
parsed once, and the index keeps only an integer offset per identity — the record
itself is read back on lookup. Strict mode (``verify``) also checks the frame and
every field of each record.
"""

from __future__ import annotations

import gc
from typing import Any

import orjson
import xxhash

from crucible.core.structs import dataclass, field
from crucible.ledger._record import (
    MIDDLE,
    PAYLOAD_START,
    PREFIX,
    SUFFIX,
    decode_line,
)

__all__ = ["MAX_LISTED_BAD", "Scan", "identity_hash", "scan"]

#: at most this many bad line numbers are kept (all are counted)
MAX_LISTED_BAD = 1000

Identity = tuple[str, str]


def identity_hash(scope: str, step: str) -> int:
    """xxh3_64 of ``LEN ":" SCOPE STEP`` (UTF-8; LEN the byte length of SCOPE, so
    no two identities share the bytes); 0 is the index's empty slot, so it is 1."""
    s, t = scope.encode(), step.encode()
    return xxhash.xxh3_64_intdigest(b"%d:%b%b" % (len(s), s, t)) or 1


@dataclass
class Scan:
    """What one pass found. ``index`` maps (scope, step) to the byte offset of the
    latest good record of that identity."""

    index: dict[Identity, int] = field(default_factory=dict)
    #: with ``hashed=True``: identity hash (``_index.identity_hash``) -> offset
    #: instead of ``index`` (what an index rebuild needs, without keeping strings)
    hashed: dict[int, int] = field(default_factory=dict)
    size: int = 0
    records: int = 0
    bad_lines: int = 0
    bad_line_numbers: list[int] = field(default_factory=list)
    bad_reasons: list[str] = field(default_factory=list)
    #: the file does not end in "\n" and its last segment is not a record
    torn_tail: bool = False
    #: the file does not end in "\n" (whether or not that last line is a record)
    unterminated: bool = False
    #: newline-terminated, non-blank lines
    complete_lines: int = 0

    @property
    def identities(self) -> int:
        return len(self.index) or len(self.hashed)

    @property
    def duplicates(self) -> int:
        return self.records - self.identities

    @property
    def damaged(self) -> bool:
        return self.bad_lines > 0 or self.torn_tail

    @property
    def garbage(self) -> bool:
        """Complete lines, none of them a record: not a ledger at all."""
        return self.records == 0 and self.bad_lines > 0 and self.complete_lines > 0


def scan(data: bytes, *, strict: bool = False, hashed: bool = False) -> Scan:
    """Index ``data`` (a whole ledger file). Never raises on bad content."""
    result = Scan(size=len(data))
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends in "\n"
    bad_positions: list[tuple[int, str]] = []
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a million small allocations would trigger many useless collections
    try:
        index = result.index
        if strict:
            pos = _scan_strict(lines, index, bad_positions)
        else:
            target: dict[Any, int] = result.hashed if hashed else index
            pos = _scan_fast(lines, target, bad_positions, hashed)
    finally:
        if gc_was_enabled:
            gc.enable()
    result.complete_lines = len(lines)
    if tail:
        result.unterminated = True
        record, _problem = decode_line(tail)
        if record is None:
            result.torn_tail = True
        elif hashed:
            result.hashed[identity_hash(record["scope"], record["step"])] = pos
        else:
            index[record["scope"], record["step"]] = pos
    good = len(lines) + (1 if tail and not result.torn_tail else 0)
    blank = 0
    for p, reason in bad_positions:
        if reason == "":
            blank += 1
            continue
        result.bad_lines += 1
        if len(result.bad_line_numbers) < MAX_LISTED_BAD:
            result.bad_line_numbers.append(data.count(b"\n", 0, p) + 1)
            result.bad_reasons.append(reason)
    result.complete_lines -= blank
    result.records = good - len(bad_positions)
    return result


def _scan_fast(
    lines: list[bytes], index: dict[Any, int], bad: list[tuple[int, str]], hashed: bool
) -> int:
    """Index every well-framed record's position by (scope, step), or by its
    identity hash when ``hashed``: one loop for both (a branch per line costs
    nothing measurable; a call per line would)."""
    checksum = xxhash.xxh3_64_hexdigest
    hash_of = xxhash.xxh3_64_intdigest
    loads = orjson.loads
    decode_error = orjson.JSONDecodeError
    frame = PREFIX + b"%b" + MIDDLE + b"%b" + SUFFIX
    pos = 0
    for line in lines:
        payload = line[PAYLOAD_START:-1]
        # rebuild the whole line from its payload and compare once: this checks the
        # checksum and every frame byte together, cheaper than separate slices
        if line == frame % (checksum(payload).encode(), payload):
            try:
                record = loads(payload)
                scope = record["scope"]
                step = record["step"]
            except (decode_error, KeyError, TypeError):
                bad.append((pos, "payload is not a ledger record"))
            else:
                if type(scope) is not str or type(step) is not str:
                    bad.append((pos, "payload is not a ledger record"))
                elif hashed:
                    s, t = scope.encode(), step.encode()
                    # identity_hash, inlined
                    index[hash_of(b"%d:%b%b" % (len(s), s, t)) or 1] = pos
                else:
                    index[scope, step] = pos
        else:
            bad.append((pos, "" if not line else "checksum mismatch or bad frame"))
        pos += len(line) + 1
    return pos


def _scan_strict(lines: list[bytes], index: dict[Identity, int], bad: list[tuple[int, str]]) -> int:
    pos = 0
    for line in lines:
        if not line:
            bad.append((pos, ""))
        else:
            record, problem = decode_line(line)
            if record is None:
                bad.append((pos, problem or "bad line"))
            else:
                index[record["scope"], record["step"]] = pos
        pos += len(line) + 1
    return pos

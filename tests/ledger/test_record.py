"""The line format: framing, checksum, torn tails, bad lines, truncation."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
import xxhash

from crucible.ledger import Ledger, Outcome
from crucible.ledger._record import decode_line, encode_line, make_record
from crucible.ledger._scan import scan

from .conftest import Warnings


def _line(i: int, value: object = None) -> bytes:
    return encode_line(make_record("s", f"step-{i}", "ok", value if value is not None else i))


def test_line_is_a_canonical_json_object_with_checksum_over_payload() -> None:
    line = _line(1, {"b": [1, 2], "a": "é\n"})
    assert line.endswith(b"}\n")
    outer = orjson.loads(line)
    assert set(outer) == {"c", "r"}
    payload = line[28:-2]
    assert outer["c"] == xxhash.xxh3_64_hexdigest(payload)
    assert orjson.loads(payload) == outer["r"]
    record, problem = decode_line(line[:-1])
    assert problem is None and record is not None and record["value"] == {"a": "é\n", "b": [1, 2]}


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda b: b[:40] + bytes([b[40] ^ 1]) + b[41:], "checksum mismatch"),
        (lambda b: b[:7] + (b"0" if b[7:8] != b"0" else b"1") + b[8:], "checksum mismatch"),
        (lambda b: b"[" + b[1:], "bad frame"),
        (lambda b: b[:-1] + b"]", "bad frame"),
        (lambda b: b[:10], "bad frame"),
    ],
)
def test_corrupt_lines_are_refused(mutate: object, reason: str) -> None:
    line = _line(7)[:-1]
    record, problem = decode_line(mutate(line))  # type: ignore[operator]
    assert record is None and problem is not None and reason in problem


def test_checksum_valid_but_not_a_record_is_refused() -> None:
    payload = b'{"v":1,"scope":"s"}'
    line = b'{"c":"' + xxhash.xxh3_64_hexdigest(payload).encode() + b'","r":' + payload + b"}"
    record, problem = decode_line(line)
    assert record is None and problem is not None and "step" in problem
    assert scan(line + b"\n", strict=True).bad_lines == 1


def test_scan_counts_bad_lines_with_numbers_and_keeps_latest() -> None:
    data = (
        _line(1, "first")
        + b"garbage\n"
        + _line(2)
        + b"\n"  # blank lines are skipped, not bad
        + _line(1, "second")
        + _line(3)[:-10]  # torn tail
    )
    for strict in (False, True):
        result = scan(data, strict=strict)
        assert result.records == 3
        assert result.identities == 2
        assert result.duplicates == 1
        assert result.bad_lines == 1
        assert result.bad_line_numbers == [2]
        assert result.torn_tail and result.unterminated and result.damaged
        first_pos = result.index["s", "step-1"]
        assert data[first_pos:].startswith(_line(1, "second"))


def test_unterminated_but_complete_last_line_is_a_record() -> None:
    data = _line(1) + _line(2)[:-1]
    result = scan(data)
    assert result.records == 2 and not result.torn_tail and result.unterminated


def _expected_survivors(lines: list[bytes], cut: int) -> set[str]:
    alive, pos = set(), 0
    for i, line in enumerate(lines):
        if cut >= pos + len(line) - 1:  # every byte but (perhaps) the newline is there
            alive.add(f"step-{i}")
        pos += len(line)
    return alive


def test_truncated_at_every_byte_offset_loses_only_the_torn_record(
    ledger_dir: Path, warnings: Warnings
) -> None:
    lines = [_line(i, {"text": "x" * (i * 7), "n": i}) for i in range(5)]
    full = b"".join(lines)
    path = ledger_dir / "steps.jsonl"
    for cut in range(len(full) + 1):
        path.write_bytes(full[:cut])
        expected = _expected_survivors(lines, cut)
        with Ledger(ledger_dir, warn=warnings) as ledger:
            found = {json.loads(p)["step"] for p in ledger.records()}
            assert found == expected, cut
            assert ledger.report.quarantined is None
            for step in expected:
                hit = ledger.lookup("s", step)
                assert hit is not None and hit.cached
            # the ledger stays usable: the next append starts on a fresh line
            assert ledger.record("s", "after", Outcome.ok(cut))
        with Ledger(ledger_dir, warn=warnings) as ledger:
            found = {json.loads(p)["step"] for p in ledger.records()}
            assert found == expected | {"after"}, cut
            after = ledger.lookup("s", "after")
            assert after is not None and after.value == cut
            ends = {sum(map(len, lines[:k])) for k in range(len(lines) + 1)}
            # a cut neither at a line end nor just before a newline leaves a fragment,
            # which the fresh-line rule turns into one counted bad line
            torn = cut not in ends and cut + 1 not in ends
            assert ledger.report.summary.bad_lines == (1 if torn else 0), cut
            assert not ledger.report.summary.torn_tail

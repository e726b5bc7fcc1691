"""verify (read-only report) and compact (atomic rewrite, latest per identity)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crucible.core.errors import OperationalError
from crucible.ledger import Ledger, Outcome, compact, verify
from crucible.ledger._record import encode_line, make_record


def _line(step: str, value: object) -> bytes:
    return encode_line(make_record("s", step, "ok", value, at="2026-01-01T00:00:00Z"))


def test_verify_reports_records_duplicates_bad_lines_and_torn_tail(ledger_dir: Path) -> None:
    path = ledger_dir / "steps.jsonl"
    data = _line("a", 1) + b"not a record\n" + _line("a", 2) + _line("b", 3) + _line("c", 4)[:20]
    path.write_bytes(data)
    report = verify(ledger_dir)
    assert report["records"] == 3
    assert report["identities"] == 2
    assert report["duplicates"] == 1
    assert report["bad_lines"] == 1
    assert report["bad"] == [{"line": 2, "reason": "not a ledger line (bad frame)"}]
    assert report["torn_tail"] and report["damaged"]
    assert path.read_bytes() == data  # verify changes nothing


def test_verify_of_a_healthy_or_missing_ledger(ledger_dir: Path) -> None:
    assert verify(ledger_dir)["records"] == 0
    assert not verify(ledger_dir)["damaged"]
    with Ledger(ledger_dir) as ledger:
        ledger.record("s", "x", Outcome.ok(1))
    report = verify(ledger_dir)
    assert report["records"] == 1 and not report["damaged"]


def test_verify_checks_the_frame_strictly(ledger_dir: Path) -> None:
    good = _line("a", 1)
    # payload and checksum intact, a frame byte damaged: a bad line for both the
    # fast open path and verify
    for damaged in (good[:-2] + b"]\n", good[:23] + b"x" + good[24:], b"[" + good[1:]):
        (ledger_dir / "steps.jsonl").write_bytes(_line("b", 2) + damaged)
        report = verify(ledger_dir)
        assert report["bad_lines"] == 1 and report["damaged"]
        with Ledger(ledger_dir, readonly=True, warn=lambda _m: None) as ledger:
            assert ledger.report.summary.bad_lines == 1 and len(ledger) == 1


def test_verify_cannot_read_is_operational(ledger_dir: Path) -> None:
    (ledger_dir / "steps.jsonl").mkdir()
    with pytest.raises(OperationalError, match="not a regular file"):
        verify(ledger_dir)


def test_compact_keeps_latest_per_identity_in_file_order(ledger_dir: Path) -> None:
    path = ledger_dir / "steps.jsonl"
    path.write_bytes(_line("a", 1) + _line("b", 2) + _line("a", 3) + _line("c", 4))
    path.chmod(0o640)
    report = compact(ledger_dir)
    assert (report.records_before, report.kept, report.dropped_duplicates) == (4, 3, 1)
    assert report.rejected is None
    assert path.read_bytes() == _line("b", 2) + _line("a", 3) + _line("c", 4)
    assert path.stat().st_mode & 0o777 == 0o640
    assert compact(ledger_dir).kept == 3  # idempotent


def test_compact_moves_damage_aside_and_never_silently_drops_it(ledger_dir: Path) -> None:
    path = ledger_dir / "steps.jsonl"
    torn = _line("z", 9)[:25]
    path.write_bytes(_line("a", 1) + b"garbage line\n" + _line("b", 2) + torn)
    report = compact(ledger_dir)
    assert report.dropped_bad == 1 and report.torn_tail and report.rejected is not None
    assert report.rejected.read_bytes() == b"garbage line\n" + torn + b"\n"
    assert path.read_bytes() == _line("a", 1) + _line("b", 2)
    assert not verify(ledger_dir)["damaged"]


def test_compact_keeps_an_unterminated_complete_record(ledger_dir: Path) -> None:
    path = ledger_dir / "steps.jsonl"
    path.write_bytes(_line("a", 1) + _line("b", 2)[:-1])
    report = compact(ledger_dir)
    assert report.kept == 2 and report.rejected is None
    assert path.read_bytes() == _line("a", 1) + _line("b", 2)


def test_compact_of_a_missing_ledger_is_a_no_op(ledger_dir: Path) -> None:
    assert compact(ledger_dir).kept == 0
    assert not (ledger_dir / "steps.jsonl").exists()


def test_open_ledger_reads_its_snapshot_after_compaction(ledger_dir: Path) -> None:
    with Ledger(ledger_dir) as ledger:
        ledger.record("s", "a", Outcome.ok(1))
        ledger.record("s", "a", Outcome.ok(2))
    with Ledger(ledger_dir) as ledger:
        compact(ledger_dir)  # offsets in this ledger's index refer to the old inode
        ledger._memo.clear()
        hit = ledger.lookup("s", "a")
        assert hit is not None and hit.value == 2
    assert not [p for p in os.listdir(ledger_dir) if p.endswith(".tmp")]

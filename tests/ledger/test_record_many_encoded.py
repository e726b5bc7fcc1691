"""Facts encoded by one process and appended by another (Ledger.encode_fact,
Ledger.append_encoded; docs/spec/ledger.md "Batch append"): the task cache's
workers encode their units' records and the dispatcher appends a batch of them
with one write and one fsync, indexed as record_many indexes them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crucible.ledger import Ledger, Outcome, verify
from tests.ledger.conftest import Warnings


def _encoded(n: int, tag: str = "e") -> list[tuple[bytes, str, str]]:
    return [
        (
            Ledger.encode_fact("s", f"{tag}-{i}", Outcome.ok({"i": i}), key={"k": i}),
            "s",
            f"{tag}-{i}",
        )
        for i in range(n)
    ]


def test_encoded_facts_are_one_batch_indexed_and_replayed(
    ledger_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"fsync": 0}
    real = os.fsync

    def fsync(fd: int) -> None:
        calls["fsync"] += 1
        real(fd)

    with Ledger(ledger_dir) as ledger:
        assert ledger.record("s", "first", Outcome.ok(0))
        monkeypatch.setattr(os, "fsync", fsync)
        assert ledger.append_encoded(_encoded(30)) == 30
        assert calls["fsync"] == 1
        monkeypatch.undo()
    with Ledger(ledger_dir) as ledger:
        assert ledger.report.source == "index"
        for i in range(30):
            hit = ledger.lookup("s", f"e-{i}")
            assert hit is not None and hit.status == "ok" and hit.value == {"i": i}
    report = verify(ledger_dir)
    assert report["records"] == 31 and not report["damaged"]


def test_an_encoded_fact_is_the_line_record_would_write(ledger_dir: Path) -> None:
    line = Ledger.encode_fact("s", "x", Outcome.failed({"why": "no"}), key=[1, 2])
    assert line.endswith(b"\n")
    with Ledger(ledger_dir) as ledger:
        assert ledger.append_encoded([(line, "s", "x")]) == 1
    with Ledger(ledger_dir) as ledger:
        hit = ledger.lookup("s", "x")
        assert hit is not None and hit.status == "failed" and hit.value == {"why": "no"}
    assert (ledger_dir / "steps.jsonl").read_bytes() == line


def test_unsettled_and_uncanonical_facts_cannot_be_encoded() -> None:
    with pytest.raises(ValueError):
        Ledger.encode_fact("s", "x", Outcome.transient(1))
    from crucible.core.canon import CanonError

    with pytest.raises(CanonError):
        Ledger.encode_fact("s", "x", Outcome.ok(float("nan")))


def test_a_broken_line_is_left_out_warned_the_others_recorded(
    ledger_dir: Path, warnings: Warnings
) -> None:
    good = _encoded(3)
    torn = (good[1][0][:-5] + b"\n", "s", "e-1")
    flipped = (good[2][0].replace(b'"i":2', b'"i":7'), "s", "e-2")
    with Ledger(ledger_dir, warn=warnings.append) as ledger:
        assert ledger.append_encoded([good[0], torn, flipped]) == 1
    assert len(warnings) == 2 and all("not a ledger line" in w for w in warnings)
    with Ledger(ledger_dir) as ledger:
        assert ledger.lookup("s", "e-0") is not None
        assert ledger.lookup("s", "e-1") is None and ledger.lookup("s", "e-2") is None
    assert not verify(ledger_dir)["damaged"]


def test_a_read_only_ledger_records_no_encoded_fact(ledger_dir: Path, warnings: Warnings) -> None:
    with Ledger(ledger_dir) as ledger:
        ledger.record("s", "first", Outcome.ok(0))
    with Ledger(ledger_dir, readonly=True, warn=warnings.append) as ledger:
        assert ledger.append_encoded(_encoded(2)) == 0
    assert any("read-only" in w for w in warnings)

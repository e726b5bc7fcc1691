"""Byte-exact outputs pinned by golden files. Regenerate deliberately with
CRUCIBLE_UPDATE_GOLDEN=1 (and review the diff: a change here is a format change)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crucible.core import canon
from crucible.ledger import command_key, content_step, verify
from crucible.ledger._record import encode_line, make_record

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("CRUCIBLE_UPDATE_GOLDEN") == "1"


def check(name: str, data: bytes) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_bytes(data)
    assert path.exists(), f"missing golden file {path}; run with CRUCIBLE_UPDATE_GOLDEN=1"
    assert data == path.read_bytes(), f"{name} differs from its golden file"


def _lines() -> bytes:
    key = command_key(
        ["cc", "-c", "main.c", "-o", "main.o"],
        {"CC": "gcc 13", "FLAGS": '-O2 -DX="1"'},
        {"main.c": "sha256:" + "ab" * 32},
    )
    records = [
        make_record(
            "make",
            content_step("run", key),
            "ok",
            {"exit": 0, "stdout": "", "stderr": "warn: é\n"},
            key,
            at="2026-11-30T08:00:00Z",
        ),
        make_record(
            "broker",
            "build:sha256:" + "cd" * 32,
            "failed",
            {"error": "compile error", "line": 3, "ratio": 0.5},
            at="2026-11-30T08:00:01Z",
        ),
        make_record(
            "broker", "measure:x", "ok", [1, None, True, "\u2028\t"], at="2026-11-30T08:00:02Z"
        ),
    ]
    return b"".join(encode_line(r) for r in records)


def test_ledger_lines_are_byte_exact() -> None:
    check("steps.jsonl", _lines())


def test_verify_report_is_byte_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("d").mkdir()
    lines = _lines()
    Path("d/steps.jsonl").write_bytes(lines + b"junk\n" + lines.splitlines(keepends=True)[0][:40])
    check("verify-report.json", canon.dumps(verify("d")) + b"\n")

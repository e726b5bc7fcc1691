"""Issue 27 item 17: a retry policy's "no retry" reason was glued onto the
task's output tail (``…connection refused; no retry: …``), and ``report``'s NOTE
cell showed the tail twice (once escaped with ``\\n``) and cut the reason at
160 characters. The reason now goes on the note's first line; the cell shows
the headline and the reason in full, the tail once, under the row."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from crucible.run.report._report import NOTE_CELL_MAX, Row, note_cell
from tests.run.dispatchtests import DISPATCH, write_pack

PACK = """
edition = 4
[workflow]
name = "reason"
[[workflow.task]]
name = "t"
retry = { limit = 2, on_exit = [75] }
run = 'echo "dialing"; echo "connection refused" >&2; exit 1'
"""

REASON = "no retry: exit code 1 is not in on_exit"


def test_the_no_retry_reason_is_on_the_first_line_and_the_tail_shown_once(
    tmp_path: Path,
) -> None:
    pack = write_pack(tmp_path, PACK)
    state = tmp_path / "state"
    run = subprocess.run(
        [DISPATCH, str(pack), "--state", str(state)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 1, run.stderr
    record = json.loads((state / "results" / "t.json").read_text())
    assert record["note"] == (
        f"exited with status 1 (see logs/t.log); {REASON}\ndialing\nconnection refused"
    )
    report = subprocess.run(
        [DISPATCH, "report", str(state)], capture_output=True, text=True, timeout=60
    ).stdout
    (row,) = [line for line in report.splitlines() if line.startswith("t ")]
    assert row.endswith(f"exited with status 1; {REASON}")
    assert report.count("connection refused") == 1  # under the row: "| connection refused"
    assert "\\n" not in report


def test_a_long_headline_is_cut_before_the_reason() -> None:
    row = Row(task="t", key=None, status="failed")
    row.note = "x" * 300 + f"; {REASON}"
    cell = note_cell(row)
    assert len(cell) == NOTE_CELL_MAX and cell.endswith(f"\u2026; {REASON}")


def test_a_note_recorded_with_the_reason_after_the_tail_shows_it_once() -> None:
    """A state written before the fix: "HEAD (see LOG)\\nTAIL; REASON"."""
    row = Row(task="t", key=None, status="failed")
    row.log = "logs/t.log"
    row.stderr_tail = "dialing\nconnection refused"
    row.note = f"exited with status 1 (see logs/t.log)\ndialing\nconnection refused; {REASON}"
    assert note_cell(row) == f"exited with status 1; {REASON}"

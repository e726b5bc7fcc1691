"""Failures where people look: a failed attempt's note names how it ended and
its log, with the last lines of its output (docs/spec/run.md, "Failures").

The result record of a failed unit gains ``log`` (the log's path relative to
STATE) and ``stderr_tail`` (the last lines of the attempt's output, at most
TAIL_LINES lines and TAIL_BYTES bytes of UTF-8). A task's stdout and stderr
share one pipe (the log keeps them in the order written), so the tail is of
both, as the log shows them.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from crucible.core import atomic, canon

__all__ = [
    "TAIL_BYTES",
    "TAIL_LINES",
    "compose_note",
    "exit_text",
    "failure_record",
    "tail_text",
    "with_reason",
    "write_record",
]

TAIL_LINES = 10
TAIL_BYTES = 2048


def tail_text(data: bytes) -> str:
    """The last TAIL_LINES lines of ``data``, at most TAIL_BYTES bytes of UTF-8
    (a line cut by the byte bound loses its start)."""
    data = data.rstrip(b"\n")
    if not data:
        return ""
    lines = data.split(b"\n")[-TAIL_LINES:]
    text = b"\n".join(lines)[-TAIL_BYTES:].decode("utf-8", "replace")
    # A cut through a multi-byte character left replacement characters first.
    while text.encode("utf-8") and len(text.encode("utf-8")) > TAIL_BYTES:
        text = text[1:]
    return text.lstrip("\ufffd")


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_text(code: int) -> str:
    """``exited with status 3``, or ``killed by SIGKILL`` for a negative code."""
    if code < 0:
        return f"killed by {signal_name(-code)}"
    return f"exited with status {code}"


def compose_note(note: str, code: int | None, log: str | None, tail: str) -> str:
    """A failure's note: capture's or ours, with a signal named, its log, and the
    last lines of its output."""
    if code is not None and code < 0:
        note = note.replace(f"exited with status {code}", exit_text(code))
    if log is not None:
        note += f" (see {log})"
    if tail:
        note += "\n" + tail
    return note


def with_reason(note: str, reason: str) -> str:
    """``note`` with ``reason`` (why no retry follows) appended to its first line:
    a note's later lines are its output's tail (compose_note), which the reason
    must not be glued to."""
    first, newline, tail = note.partition("\n")
    return f"{first}; {reason}{newline}{tail}"


def failure_record(
    result_format: str,
    task: str,
    key: str | None,
    note: str,
    *,
    log: str | None,
    tail: str,
    exit_code: int | None = None,
) -> dict[str, Any]:
    """A failed unit's record when nothing was captured (timeout, start or
    capture failure): stage's base record with the log fields."""
    record: dict[str, Any] = {"format": result_format, "task": task}
    if key is not None:
        record["key"] = key
    record.update(status="failed", note=note, retryable=False)
    if exit_code is not None:
        record["exit_code"] = exit_code
    add_log_fields(record, log, tail)
    return record


def add_log_fields(record: dict[str, Any], log: str | None, tail: str) -> None:
    if log is not None:
        record["log"] = log
    if tail:
        record["stderr_tail"] = tail


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Write a record atomically and durably (creating its task's directory)."""
    try:
        atomic.write_bytes(path, canon.dumps(record))
    except Exception:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_bytes(path, canon.dumps(record))

"""A resume reads the earlier sessions' events cut to what it uses
(crucible.run.session._log.read_earlier, issue 33: a million-instance log)."""

from __future__ import annotations

from pathlib import Path

import pytest

from crucible.core import canon, ndjson
from crucible.run.session._log import read_earlier, read_events

EVENTS = [
    {"event": "plan_admitted", "session": 1, "tasks": [{"name": "t"}], "digest": "sha256:x"},
    {"event": "task_started", "session": 1, "task": "t", "key": "a", "pid": 41, "item": "1"},
    {"event": "task_finished", "session": 1, "task": "t", "key": "a", "status": "passed",
     "duration": 0.5, "max_rss_kib": 9000},
    {"event": "task_started", "session": 1, "task": "u", "pid": 42, "attempt": 1},
    {"event": "run_finished", "session": 1, "status": "failed", "counts": {"passed": 1}},
]  # fmt: skip


def write(path: Path, events: list[dict[str, object]], tail: bytes = b"") -> Path:
    path.write_bytes(b"".join(canon.dumps(e) + b"\n" for e in events) + tail)
    return path


def test_unit_events_are_cut_the_others_kept(tmp_path: Path) -> None:
    path = write(tmp_path / "s.jsonl", EVENTS, tail=b'{"event": "task_sta')
    got = read_earlier(path)
    whole = read_events(path)
    assert len(got) == len(whole) == len(EVENTS)
    for cut, full in zip(got, whole, strict=True):
        if full["event"] in ("task_started", "task_finished"):
            assert cut == {k: full[k] for k in ("event", "task", "key", "pid") if k in full}
        else:
            assert cut == full
    assert got[1]["task"] is got[2]["task"]  # one string for a task's events


def test_a_bad_line_is_located(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(canon.dumps(EVENTS[0]) + b"\n[1]\n" + canon.dumps(EVENTS[1]) + b"\n")
    with pytest.raises(ndjson.NdjsonError) as got:
        read_earlier(path)
    assert got.value.where == f"{path}:2"


def test_no_log_no_events(tmp_path: Path) -> None:
    assert read_earlier(tmp_path / "none.jsonl") == []

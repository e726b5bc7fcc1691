"""A resume folds the earlier sessions' log into what it uses
(crucible.run.session._earlier.read_earlier, issue 33: a million-instance log)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crucible.core import canon, ndjson
from crucible.run.session._earlier import EarlierSessions, read_earlier
from crucible.run.session._log import read_events

EVENTS = [
    {"event": "plan_admitted", "session": 1, "tasks": [{"name": "t"}], "digest": "sha256:x"},
    {"event": "task_started", "session": 1, "task": "t", "key": "a", "pid": 41, "item": "1"},
    {"event": "task_finished", "session": 1, "task": "t", "key": "a", "status": "passed",
     "duration": 0.5, "max_rss_kib": 9000},
    {"event": "task_started", "session": 1, "task": "u", "pid": 42, "attempt": 1},
    {"event": "run_finished", "session": 1, "status": "failed", "counts": {"passed": 1}},
    {"event": "plan_admitted", "session": 2, "tasks": [{"name": "t"}], "digest": "sha256:x"},
    {"event": "task_started", "session": 2, "task": "t", "key": "b", "attempt": 1},
]  # fmt: skip


def write(path: Path, events: list[dict[str, Any]], tail: bytes = b"") -> Path:
    path.write_bytes(b"".join(canon.dumps(e) + b"\n" for e in events) + tail)
    return path


def reference(events: list[dict[str, Any]]) -> tuple[int, set[Any], dict[Any, int], Any]:
    """What the resume read from the whole event list before the fold: sessions,
    started units, started-and-unfinished units with their groups, last run."""
    unfinished: dict[Any, int] = {}
    for e in events:
        unit = (e.get("task"), e.get("key"))
        if e["event"] == "task_started" and type(e.get("pid")) is int:
            unfinished[unit] = e["pid"]
        elif e["event"] == "task_finished":
            unfinished.pop(unit, None)
    finished = [e for e in events if e["event"] == "run_finished"]
    return (
        sum(1 for e in events if e["event"] == "plan_admitted"),
        {(e["task"], e.get("key")) for e in events if e["event"] == "task_started"},
        unfinished,
        finished[-1] if finished else None,
    )


def folded(got: EarlierSessions) -> tuple[int, set[Any], dict[Any, int], Any]:
    return got.sessions, set(got.started), dict(got.unfinished), got.last_run_finished


def test_the_log_is_folded_into_what_a_resume_asks(tmp_path: Path) -> None:
    path = write(tmp_path / "s.jsonl", EVENTS, tail=b'{"event": "task_sta')
    got = read_earlier(path)
    assert folded(got) == reference(read_events(path))
    assert got.sessions == 2
    assert ("t", "a") in got.started and ("t", "b") in got.started and ("u", None) in got.started
    assert ("t", None) not in got.started and ("v", None) not in got.started
    assert got.started.tasks() == {"t", "u"}
    assert len(got.started) == 3
    assert got.unfinished == {("u", None): 42}  # t[b] started with no process group
    assert got.last_run_finished is not None and got.last_run_finished["status"] == "failed"


unit_events = st.lists(
    st.tuples(
        st.sampled_from(["task_started", "task_finished", "plan_admitted", "run_finished"]),
        st.sampled_from(["t", "u"]),
        st.sampled_from([None, "0", "1"]),
        st.one_of(st.none(), st.integers(2, 5)),
        st.sampled_from(["passed", "failed"]),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(unit_events)
def test_the_fold_equals_the_whole_log_read(tmp_path_factory: Any, spec: list[Any]) -> None:
    events: list[dict[str, Any]] = []
    for kind, task, key, pid, status in spec:
        event: dict[str, Any] = {"event": kind}
        if kind.startswith("task_"):
            event["task"] = task
            if key is not None:
                event["key"] = key
            if pid is not None and kind == "task_started":
                event["pid"] = pid
        elif kind == "run_finished":
            event["status"] = status
        events.append(event)
    path = write(tmp_path_factory.mktemp("log") / "s.jsonl", events)
    assert folded(read_earlier(path)) == reference(events)


def test_a_bad_line_is_located(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(canon.dumps(EVENTS[0]) + b"\n[1]\n" + canon.dumps(EVENTS[1]) + b"\n")
    with pytest.raises(ndjson.NdjsonError) as got:
        read_earlier(path)
    assert got.value.where == f"{path}:2"


def test_invalid_json_is_located(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(canon.dumps(EVENTS[0]) + b"\n{nope\n")
    with pytest.raises(ndjson.NdjsonError) as got:
        read_earlier(path)
    assert got.value.where == f"{path}:2"


def test_no_log_no_sessions(tmp_path: Path) -> None:
    got = read_earlier(tmp_path / "none.jsonl")
    assert folded(got) == (0, set(), {}, None)


def test_units_cost_a_key_each_not_an_event(tmp_path: Path) -> None:
    """10,000 started and finished instances: what is kept is their keys (one
    set per task), not 20,000 events: held under 1.5 MB here, where the cut
    events of the last version held ~7 MB."""
    lines = []
    for i in range(10_000):
        lines.append({"event": "task_started", "task": "each", "key": str(i), "pid": 100 + i})
        lines.append({"event": "task_finished", "task": "each", "key": str(i), "status": "passed"})
    got = read_earlier(write(tmp_path / "s.jsonl", lines))
    keys = got.started._by_task["each"]
    held = sys.getsizeof(keys) + sum(sys.getsizeof(k) for k in keys)
    assert len(got.started) == 10_000 and not got.unfinished
    assert held < 1_500_000

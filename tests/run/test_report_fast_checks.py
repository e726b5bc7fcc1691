"""The report's fast path through its checks (crucible.run.report._state:
an event or record cleared in one loop) accepts exactly what the checks that
name each problem accept (issue 33: three million events at 10^6 instances)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from crucible.core.errors import CrucibleError
from crucible.run.report import _state

FINISHED: dict[str, Any] = {
    "event": "task_finished", "session": 1, "time": "2026-12-05T06:51:07.535Z",
    "task": "each", "key": "0", "attempt": 1, "status": "passed", "note": "",
    "exit_code": 0, "duration": 0.0148, "output_bytes": 2, "cpu_user_s": 0.0007,
    "cpu_sys_s": 0, "max_rss_kib": 23556, "spawner_rss_kib": 23556, "read_bytes": 0,
    "write_bytes": 0, "vol_ctxt": 1, "inv_ctxt": 2, "cached": True, "retry": False,
}  # fmt: skip
STARTED: dict[str, Any] = {
    "event": "task_started", "session": 2, "time": "2026-12-05T06:51:07.535Z",
    "task": "each", "key": "0", "attempt": 1, "pid": 7, "item": "1", "workspace": "w",
}  # fmt: skip
RECORD: dict[str, Any] = {
    "format": "crucible.result/1", "task": "each", "key": "0", "status": "passed",
    "note": "", "retryable": False, "attempt": 1, "exit_code": 0, "cached": False,
    "extra": {}, "usage": {"cpu_user_s": 0.1, "cpu_sys_s": None, "max_rss_kib": 5},
}  # fmt: skip

VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**60), max_value=2**60),
    st.sampled_from([0, 1, -1, 2**53 - 1, 2**53, -(2**53)]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=3),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


def _outcome(check: Any, *args: Any) -> str:
    try:
        check(*args)
    except CrucibleError:
        return "refused"
    return "accepted"


@settings(max_examples=400, deadline=None)
@given(
    base=st.sampled_from(["finished", "started"]),
    changes=st.dictionaries(
        st.sampled_from([*sorted(FINISHED), "pid", "item", "log", "stderr_tail", "tolerated"]),
        VALUES,
        max_size=3,
    ),
    dropped=st.sets(st.sampled_from(["attempt", "task", "status", "session", "duration"])),
)
def test_events_fast_and_slow_agree(base: str, changes: dict[str, Any], dropped: set[str]) -> None:
    event = dict(FINISHED if base == "finished" else STARTED)
    event.update({k: v for k, v in changes.items() if k not in ("event", "time")})
    for name in dropped:
        event.pop(name, None)
    assert _outcome(_state._check_event, event, "x") == _outcome(
        _state._check_event_slowly, event, "x"
    )


@settings(max_examples=300, deadline=None)
@given(
    changes=st.dictionaries(
        st.sampled_from([*sorted(RECORD), "log", "stderr_tail", "tolerated", "keys", "counts"]),
        VALUES,
        max_size=3,
    ),
    usage=st.dictionaries(
        st.sampled_from(["cpu_user_s", "cpu_sys_s", "max_rss_kib", "read_bytes"]),
        VALUES,
        max_size=2,
    ),
)
def test_records_fast_and_slow_agree(changes: dict[str, Any], usage: dict[str, Any]) -> None:
    record = dict(RECORD)
    record.update(changes)
    if isinstance(record.get("usage"), dict):
        record["usage"] = {**record["usage"], **usage}
    fast = _outcome(_state._check_loaded, record, "x", "each", "0")
    slow = _outcome(_state._check_loaded_slowly, record, "x", "each", "0")
    assert fast == slow


def test_a_plain_event_and_record_take_the_fast_path() -> None:
    assert _state._check_event(dict(FINISHED), "x").kind == "task_finished"
    assert _state._check_loaded(dict(RECORD), "x", "each", "0") == RECORD

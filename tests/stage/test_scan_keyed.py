"""``_store.scan_keyed``: a fold's one pass over a task's packed records, in
blocks, keeping only each key's status and the lines of the keys that did not
pass (issue 33: a million-instance fold). It reads what ``load_keyed`` reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crucible.core import canon
from crucible.core.errors import ParseError
from crucible.stage import _store


def rec(key: str, status: str = "passed", note: str = "") -> dict[str, Any]:
    return {
        "format": "crucible.result/1",
        "task": "t",
        "key": key,
        "status": status,
        "note": note,
        "retryable": False,
    }


def tomb(key: str) -> dict[str, Any]:
    return {"format": "crucible.result/1", "task": "t", "key": key, "removed": True}


def write(state: Path, lines: list[bytes]) -> Path:
    path = state / "results" / "t.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(lines))
    return path


def expected(state: Path) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    _store._cache.clear()
    records = _store.load_keyed(state, "t")
    status = {k: records[k]["status"] for k in records}
    odd = {k: records[k] for k in records if records[k]["status"] != "passed"}
    return status, odd


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c", "d%e", "é"]),
            st.sampled_from(["passed", "failed", "skipped", "removed"]),
        ),
        max_size=30,
    ),
    torn=st.booleans(),
)
def test_same_as_load_keyed(tmp_path_factory: pytest.TempPathFactory, ops: Any, torn: bool) -> None:
    state = tmp_path_factory.mktemp("s")
    lines = [
        canon.dumps(tomb(k) if s == "removed" else rec(k, s, note=f"{k} {s}")) + b"\n"
        for k, s in ops
    ]
    if torn:
        lines.append(b'{"format": "crucible.res')
    write(state, lines)
    status, odd = _store.scan_keyed(state, "t")
    want_status, want_odd = expected(state)
    assert status == want_status
    assert {k: _store.parse_record_line(v) for k, v in odd.items()} == want_odd


def test_blocks_of_a_large_file_are_joined(tmp_path: Path) -> None:
    """3 MiB of records: lines cross the 1 MiB blocks the scan reads."""
    filler = "x" * 300
    lines = [canon.dumps(rec(str(i), "failed" if i % 997 == 0 else "passed", filler)) + b"\n"
             for i in range(9000)]  # fmt: skip
    write(tmp_path, lines)
    status, odd = _store.scan_keyed(tmp_path, "t")
    assert len(status) == 9000
    assert sorted(odd, key=int) == [str(i) for i in range(0, 9000, 997)]


def test_a_damaged_line_followed_by_another_is_located(tmp_path: Path) -> None:
    path = write(
        tmp_path, [canon.dumps(rec("a")) + b"\n", b"{garbage\n", canon.dumps(rec("b")) + b"\n"]
    )
    with pytest.raises(ParseError) as got:
        _store.scan_keyed(tmp_path, "t")
    assert got.value.where == f"{path}:2"


def test_a_damaged_last_line_is_a_torn_append(tmp_path: Path) -> None:
    write(tmp_path, [canon.dumps(rec("a")) + b"\n", b"{garbage\n"])
    assert _store.scan_keyed(tmp_path, "t")[0] == {"a": "passed"}


def test_no_file_is_no_records(tmp_path: Path) -> None:
    assert _store.scan_keyed(tmp_path, "t") == ({}, {})

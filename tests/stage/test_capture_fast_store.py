"""The packed-records reader's cache keeps lines, not parsed records (issue 14:
a dispatcher folding 100,000 no-op instances held ~1.2 KiB of dicts per
instance in it): memory per record, and the reader's contract unchanged."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path
from typing import Any

from crucible import stage
from crucible.core import canon
from crucible.stage import _store


def noop(key: str) -> dict[str, Any]:
    """A settled no-op instance's record, as capture writes it (~210 bytes)."""
    return {
        "attempt": 1,
        "emit_cap": 65536,
        "emit_sizes": {},
        "exit_code": 0,
        "files": [],
        "files_captured": False,
        "format": "crucible.result/1",
        "key": key,
        "note": "",
        "output": {},
        "retryable": False,
        "status": "passed",
        "task": "each",
    }


def _write(state: Path, keys: range) -> int:
    path = state / "results" / "each.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = b"".join(canon.dumps(noop(str(k))) + b"\n" for k in keys)
    with path.open("ab") as f:
        f.write(data)
    return len(data) // len(keys)


def test_the_cache_holds_about_a_line_per_record(tmp_path: Path) -> None:
    n = 5000
    line = _write(tmp_path, range(n))
    _store._cache.clear()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        records = stage.load_all(tmp_path, "each")
        assert len(records) == n and records["4999"]["status"] == "passed"
        del records
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        _store._cache.clear()
    per_record = kept / n
    # the line, its key and a dict slot; parsed records cost ~1.2 KiB each
    assert per_record < line + 160, (per_record, line)


def test_lookups_parse_fresh_records_and_views_keep_what_they_saw(tmp_path: Path) -> None:
    _write(tmp_path, range(3))
    first = stage.load_all(tmp_path, "each")
    got = first["1"]
    got["status"] = "failed"  # a caller's change reaches no other lookup
    assert first["1"]["status"] == "passed"
    assert stage.load_result(tmp_path, "each", "1")["status"] == "passed"  # type: ignore[index]
    _write(tmp_path, range(3, 5))
    later = stage.load_all(tmp_path, "each")
    assert list(later) == ["0", "1", "2", "3", "4"] and len(later) == 5
    assert list(first) == ["0", "1", "2"] and "3" not in first  # a snapshot
    assert first.get("4") is None and later.get("4") == noop("4")
    assert dict(later.items())["0"] == noop("0")
    stage.remove_result(tmp_path, "each", "0")
    assert "0" not in stage.load_all(tmp_path, "each") and "0" in later


def test_parse_packed_returns_the_records(tmp_path: Path) -> None:
    lines = [canon.dumps(noop(k)) + b"\n" for k in ("a", "b", "a")]
    tomb = {"format": "crucible.result/1", "key": "b", "removed": True, "task": "each"}
    data = b"".join(lines) + canon.dumps(tomb) + b"\n"
    assert _store.parse_packed(data, "x.jsonl", "each") == {"a": noop("a")}

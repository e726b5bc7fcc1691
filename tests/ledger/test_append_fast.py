"""The lean single-record append (``Ledger.record``; docs/spec/ledger.md §5, §6.1):
the line it writes is exactly ``encode_line(make_record(...))`` (same bytes,
same refusals), the index header it computes before the fsync is exactly
``Summary.pack``, the slot it probes is ``Table.insert``'s, and a failed fsync
leaves the index as it was."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crucible.core import canon
from crucible.ledger import Ledger, Outcome, verify
from crucible.ledger._files import _header_bytes
from crucible.ledger._index import INDEX_NAME, Summary, Table
from crucible.ledger._record import encode_line, fact_line, make_record
from tests.ledger.conftest import Warnings

AT = "2026-11-30T08:00:00Z"


def _both(scope: Any, step: Any, status: Any, value: Any, key: Any) -> tuple[object, object]:
    """(fact_line's result, encode_line(make_record)'s): bytes, or the refusal."""

    def run(fn: Any) -> object:
        try:
            return fn()
        except canon.CanonError as exc:
            return ("refused", str(exc))

    fast = run(lambda: fact_line(scope, step, status, value, key, AT))
    slow = run(lambda: encode_line(make_record(scope, step, status, value, key, at=AT)))
    return fast, slow


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


class _Str(str):
    pass


@pytest.mark.parametrize(
    "value",
    [
        {"exit": 0, "stdout": "built\n", "stderr": ""},
        0.5,
        1e21,
        -0.0,
        float("nan"),
        2**53,
        -(2**53 - 1),
        {"\ue000": 1, "a": 2},  # orjson's key order differs from JCS here
        {"k": "\ud800"},  # a lone surrogate
        {1: "x"},
        {"s": {1, 2}},
        _nested(127),  # the deepest a value may be inside the record
        _nested(128),
        [{"a": [0.1, {"b": 2**60}]}],
        None,
        _Str("sub"),
    ],
)
@pytest.mark.parametrize("key", [None, {"argv": ["cc"], "x": 1.5}, [2**54], "\ud800"])
def test_fact_line_is_encode_line_of_make_record(value: Any, key: Any) -> None:
    fast, slow = _both("make", "run:sha256:" + "ab" * 32, "ok", value, key)
    assert fast == slow


@pytest.mark.parametrize(
    ("scope", "step", "status"),
    [(_Str("s"), "a", "ok"), ("s", _Str("a"), "ok"), ("s", "a", _Str("ok")), ("\ud800", "a", "ok")],
)
def test_fact_line_treats_an_unusual_wrapper_as_encode_line_does(
    scope: Any, step: Any, status: Any
) -> None:
    fast, slow = _both(scope, step, status, {"v": 1}, None)
    assert fast == slow


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=_json, key=st.none() | _json, status=st.sampled_from(["ok", "failed"]))
def test_fact_line_matches_for_any_json_value(value: Any, key: Any, status: str) -> None:
    fast, slow = _both("scope", "step:x", status, value, key)
    assert fast == slow


@settings(max_examples=200, deadline=None)
@given(
    fields=st.lists(st.integers(min_value=0, max_value=2**64 - 1), min_size=12, max_size=12),
    generation=st.binary(min_size=8, max_size=8),
)
def test_the_header_computed_before_the_fsync_is_summary_pack(
    fields: list[int], generation: bytes
) -> None:
    names = ("covered", "tail_len", "slots", "identities", "records", "bad_lines", "newlines")
    s = Summary(fields[0], fields[1], generation)
    for name, value in zip(names, fields[2:9], strict=True):
        setattr(s, name, value)
    s.torn_tail = bool(fields[9] & 1)  # a bool since the index header's tidy-up
    s.fingerprint, s.first_bad_line = fields[10], fields[11]
    assert _header_bytes(s, s.covered, s.identities, s.records, s.newlines, s.fingerprint) == (
        s.pack()
    )


def test_a_record_is_one_write_one_fsync_and_two_index_writes(
    ledger_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: dict[str, int] = {}

    def counting(name: str) -> Any:
        real = getattr(os, name)

        def call(*args: Any) -> Any:
            calls[name] = calls.get(name, 0) + 1
            return real(*args)

        return call

    with Ledger(ledger_dir) as ledger:
        assert ledger.record("s", "first", Outcome.ok(0))  # the file and its index exist
        assert ledger.record("s", "second", Outcome.ok(0))
        for name in ("write", "fsync", "pwrite", "pread", "fstat", "open"):
            monkeypatch.setattr(os, name, counting(name))
        assert ledger.record("s", "third", Outcome.ok({"i": 3}))
        monkeypatch.undo()
    # pread: the generation token and one read of the probed slots; fstat: the
    # ledger's size and link count; pwrite: the slot and the header
    assert calls == {"write": 1, "fsync": 1, "pwrite": 2, "pread": 2, "fstat": 1}


def test_many_records_keep_the_index_exactly_as_a_rebuild_finds_it(ledger_dir: Path) -> None:
    rng = random.Random(5)
    steps = [f"step-{rng.randrange(400)}" for _ in range(1500)]  # repeats: duplicates
    latest: dict[str, int] = {}
    with Ledger(ledger_dir) as ledger:
        for i, step in enumerate(steps):
            assert ledger.record("s", step, Outcome.ok({"i": i, "pad": "x" * rng.randrange(80)}))
            latest[step] = i
    table = Table.open(ledger_dir)
    assert table is not None
    kept = table.summary
    table.close()
    with Ledger(ledger_dir) as ledger:
        assert ledger.report.source == "index"  # fresh: covered, fingerprint, generation
        for step, i in latest.items():
            hit = ledger.lookup("s", step)
            assert hit is not None and hit.value["i"] == i
    (ledger_dir / INDEX_NAME).unlink()
    with Ledger(ledger_dir) as ledger:
        assert ledger.report.source == "rebuilt"
    table = Table.open(ledger_dir)
    assert table is not None
    rebuilt = table.summary
    table.close()
    for field in ("covered", "tail_len", "identities", "records", "newlines", "fingerprint"):
        assert getattr(kept, field) == getattr(rebuilt, field), field
    assert kept.identities == len(latest) and kept.records == len(steps)


def test_a_failed_fsync_leaves_the_index_and_the_next_record_lands(
    ledger_dir: Path, monkeypatch: pytest.MonkeyPatch, warnings: Warnings
) -> None:
    real_fsync = os.fsync

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    with Ledger(ledger_dir, warn=warnings) as ledger:
        for i in range(3):
            assert ledger.record("s", f"a{i}", Outcome.ok(i))
        before = (ledger_dir / INDEX_NAME).read_bytes()
        size = (ledger_dir / "steps.jsonl").stat().st_size
        monkeypatch.setattr(os, "fsync", failing)
        assert not ledger.record("s", "lost", Outcome.ok("x"))
        monkeypatch.setattr(os, "fsync", real_fsync)
        assert (ledger_dir / INDEX_NAME).read_bytes() == before
        assert (ledger_dir / "steps.jsonl").stat().st_size == size  # truncated back
        assert ledger.record("s", "next", Outcome.ok("y"))
    assert any("not recorded" in w for w in warnings)
    with Ledger(ledger_dir) as ledger:
        assert ledger.report.source == "index"
        assert ledger.lookup("s", "lost") is None
        hit = ledger.lookup("s", "next")
        assert hit is not None and hit.value == "y"
    report = verify(ledger_dir)
    assert report["records"] == 4 and not report["damaged"]

from __future__ import annotations

from pathlib import Path

import pytest

from crucible.core.errors import InputRefused, ParseError
from crucible.stage import StateDir, load_result
from tests.stage.stageplans import plan, settle, task


def _fan() -> dict:  # type: ignore[type-arg]
    return plan(
        task("src", emits={"xs": "any"}),
        task("m", needs=["src"], map="src.xs", emits={"v": "integer"}),
    )


def test_record_settled_writes_a_record_without_capture(state: Path) -> None:
    p = plan(task("a"))
    rec = StateDir(p, state).record_settled(
        "a", status="skipped", note="dependency failed", extra={"why": 1}
    )
    assert rec == load_result(state, "a")
    assert rec["status"] == "skipped" and rec["retryable"] is False and rec["extra"] == {"why": 1}
    with pytest.raises(InputRefused, match="status"):
        StateDir(p, state).record_settled("a", status="done", note="")


def test_record_settled_without_key_on_a_mapped_task_is_an_empty_aggregate(
    state: Path,
) -> None:
    # A mapped task settled before it expanded (skipped, map source unreadable).
    p = _fan()
    rec = StateDir(p, state).record_settled("m", status="skipped", note="skipped: needs 'src'")
    assert rec == load_result(state, "m")
    assert rec["status"] == "skipped" and rec["note"] == "skipped: needs 'src'"
    assert rec["keys"] == [] and rec["counts"] == {"passed": 0, "failed": 0, "skipped": 0}
    assert "key" not in rec
    # an instance key is still checked against the plan; an unmapped task has no aggregate
    instance = StateDir(p, state).record_settled("m", status="failed", note="x", key="0")
    assert instance["key"] == "0" and "keys" not in instance
    plain = StateDir(p, state).record_settled("src", status="failed", note="x")
    assert "keys" not in plain and "counts" not in plain
    with pytest.raises(InputRefused, match="not mapped"):
        StateDir(p, state).record_settled("src", status="failed", note="x", key="0")


def test_load_result_absent_and_bad(state: Path) -> None:
    assert load_result(state, "a") is None
    (state / "results").mkdir()
    (state / "results" / "a.json").write_text("[1]")
    with pytest.raises(ParseError, match=r"a\.json"):
        load_result(state, "a")
    (state / "results" / "a.json").write_text(
        '{"format": "crucible.result/1", "task": "b", "status": "passed"}'
    )
    with pytest.raises(InputRefused, match="mismatch"):
        load_result(state, "a")
    (state / "results" / "a.json").write_text("{")
    with pytest.raises(ParseError):
        load_result(state, "a")


def test_map_items_array_order_and_object_order(state: Path) -> None:
    p = _fan()
    settle(p, state, "src", {"xs": ["c", "a", "b"]})
    assert StateDir(p, state).map_items("m") == [("0", "c"), ("1", "a"), ("2", "b")]
    # object keys in canonical order: UTF-16 code units (U+FB01 sorts before U+1F600)
    settle(p, state, "src", {"xs": {"b": 1, "a": 2, "\U0001f600": 3, "\ufb01": 4, "": 5}})
    assert [k for k, _ in StateDir(p, state).map_items("m")] == [
        "",
        "a",
        "b",
        "\U0001f600",
        "\ufb01",
    ]


def test_map_items_refusals(state: Path) -> None:
    p = _fan()
    with pytest.raises(InputRefused, match="not settled"):
        StateDir(p, state).map_items("m")
    settle(p, state, "src", {"xs": 3})
    with pytest.raises(InputRefused, match="not an array or object"):
        StateDir(p, state).map_items("m")
    settle(p, state, "src", {"xs": [1]}, exit_code=1)
    with pytest.raises(InputRefused, match="failed"):
        StateDir(p, state).map_items("m")
    with pytest.raises(InputRefused, match="not mapped"):
        StateDir(p, state).map_items("src")


def test_settle_fold(state: Path) -> None:
    p = _fan()
    settle(p, state, "src", {"xs": ["x", "y", "z"]})
    for k, v in StateDir(p, state).map_items("m"):
        settle(p, state, "m", {"v": 1} if v != "y" else {"v": "no"}, key=k)
    agg = StateDir(p, state).settle_fold("m", ["0", "1", "2"])
    assert agg["status"] == "failed" and agg["keys"] == ["0", "1", "2"]
    assert agg["counts"] == {"passed": 2, "failed": 1, "skipped": 0}
    assert "1 of 3" in agg["note"] and "'1'" in agg["note"]
    assert load_result(state, "m") == agg
    settle(p, state, "m", {"v": 2}, key="1")
    assert StateDir(p, state).settle_fold("m", ["0", "1", "2"])["status"] == "passed"
    assert StateDir(p, state).settle_fold("m", [])["status"] == "passed"
    with pytest.raises(InputRefused, match="no settled record"):
        StateDir(p, state).settle_fold("m", ["9"])
    with pytest.raises(InputRefused, match="unique"):
        StateDir(p, state).settle_fold("m", ["0", "0"])
    with pytest.raises(InputRefused, match="not mapped"):
        StateDir(p, state).settle_fold("src", [])


def test_amend_result_keeps_the_record_and_works_for_long_keys(state: Path) -> None:

    p = _fan()
    long_key = "k" * 600
    settle(p, state, "src", {"xs": {long_key: 1}})
    rec = settle(p, state, "m", {"v": 1}, key=long_key)
    amended = StateDir(p, state).amend_result(
        "m",
        key=long_key,
        status="failed",
        note="verdict: fail",
        extra={"verdict": "fail"},
    )
    assert amended == {
        **rec,
        "status": "failed",
        "note": "verdict: fail",
        "extra": {"verdict": "fail"},
    }
    assert load_result(state, "m", long_key) == amended
    with pytest.raises(InputRefused, match="no record"):
        StateDir(p, state).amend_result("m", key="other", status="failed", note="x")

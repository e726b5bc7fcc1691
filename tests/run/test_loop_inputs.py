"""crucible.run.loop._inputs: the scored loop's reserved inputs, built and written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crucible.core import canon
from crucible.core.plan import Plan
from crucible.run.loop import _inputs as li
from crucible.stage import StateLayout
from tests.stage.stageplans import loop_entry


def entry(
    n: int, *, note: str = "", score: Any = None, kept: bool = False, **fields: Any
) -> dict[str, Any]:
    """A STATE/loop.json revision entry (the engine's), with extra members history ignores."""
    return loop_entry(n, score, kept=kept, note=note, fields=dict(fields), duration_ms=12)


def test_history_record_has_the_seed_members_only() -> None:
    rec = li.history_record(entry(3, note="n", score=0.5, kept=True, score_=1))
    assert list(rec) == list(li.HISTORY_FIELDS)
    assert rec == {
        "revision": 3,
        "score": 0.5,
        "verdict": "improved",
        "note": "n",
        "kept": True,
        "fields": {"score_": 1},
    }
    failed = li.history_record({"revision": 1, "verdict": "failed"})
    assert failed == {
        "revision": 1,
        "score": None,
        "verdict": "failed",
        "note": "",
        "kept": False,
        "fields": {},
    }


def test_history_within_budget_keeps_everything_newest_last() -> None:
    revs = [entry(i, score=i / 10) for i in range(1, 6)]
    records, dropped = li.history_value(revs, 65536)
    assert dropped == 0
    assert [r["revision"] for r in records] == [1, 2, 3, 4, 5]


def test_history_budget_drops_the_oldest_first() -> None:
    revs = [entry(i, note="x" * 100, score=1) for i in range(10, 20)]  # records of one size
    one = len(canon.dumps(li.history_record(revs[0])))
    budget = 2 + 3 * one + 2  # three records and their two commas, exactly
    records, dropped = li.history_value(revs, budget)
    assert [r["revision"] for r in records] == [17, 18, 19]
    assert dropped == 7
    assert len(canon.dumps(records)) == budget
    records, dropped = li.history_value(revs, budget - 1)  # one byte short: two fit
    assert [r["revision"] for r in records] == [18, 19] and dropped == 8


def test_a_record_over_the_whole_budget_is_dropped_not_cut() -> None:
    revs = [entry(1, score=1), entry(2, note="y" * 1000, score=2)]
    records, dropped = li.history_value(revs, 256)
    assert records == [] and dropped == 2  # the newest does not fit, so nothing older follows it


def test_history_budget_must_hold_a_list() -> None:
    for bad in (1, 0, -5, 2.5, True, "64"):
        with pytest.raises(ValueError, match="budget"):
            li.history_value([], bad)  # type: ignore[arg-type]
    assert li.history_value([], 2) == ([], 0)


record_strategy = st.builds(
    entry,
    st.integers(1, 10_000),
    note=st.text(max_size=300),
    score=st.one_of(st.none(), st.integers(-(10**6), 10**6), st.floats(-1e6, 1e6, allow_nan=False)),
    kept=st.booleans(),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(record_strategy, max_size=40), st.integers(2, 8000))
def test_history_budget_property(revs: list[dict[str, Any]], budget: int) -> None:
    records, dropped = li.history_value(revs, budget)
    all_records = [li.history_record(r) for r in revs]
    # the newest suffix, in order, nothing altered
    assert records == all_records[len(all_records) - len(records) :]
    assert dropped + len(records) == len(revs)
    # within budget
    assert len(canon.dumps(records)) <= budget
    # and maximal: one more (older) record would not fit
    if dropped:
        assert len(canon.dumps(all_records[dropped - 1 :])) > budget


def test_kept_value() -> None:
    assert li.kept_value(None, None, {}) is None
    kept = li.kept_value(2, 0.75, {"propose": {"x": 1}, "evaluate": {"score": 0.75}})
    assert kept == {
        "revision": 2,
        "score": 0.75,
        "outputs": {"propose": {"x": 1}, "evaluate": {"score": 0.75}},
    }
    with pytest.raises(ValueError):
        li.kept_value(0, 1, {})


def test_declared_fields_keep_only_what_the_task_declares() -> None:
    emits = {"score": "number", "why": "string"}
    plan = Plan.from_json({"version": 1, "tasks": [{"name": "e", "kind": "command", "emits": emits}]})
    rec = {"output": {"score": 1, "why": "w", "extra": [1]}}
    assert li.declared_fields(plan, "e", rec) == {"score": 1, "why": "w"}
    assert li.declared_fields(plan, "e", None) == {}
    assert li.declared_fields(plan, "e", {"output": {"score": 2}}) == {"score": 2}


def read(state: Path, name: str) -> Any:
    return canon.loads((state / "reserved" / f"{name}.json").read_bytes())


def test_write_reserved_writes_the_four_files(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    records, dropped = li.history_value([entry(1, score=1, kept=True), entry(2, score=0)], 65536)
    kept = li.kept_value(1, 1, {"p": {"v": 3}})
    li.write_reserved(StateLayout(state), 3, (records, dropped), kept, budget=65536)
    assert read(state, "revision") == 3
    assert read(state, "history") == records
    assert read(state, "kept") == kept
    assert read(state, "meta") == {
        "format": li.META_FORMAT,
        "history": {"budget": 65536, "dropped": 0, "total": 2},
    }
    # canonical bytes, no temporaries left behind
    assert (state / "reserved" / "kept.json").read_bytes() == canon.dumps(kept)
    assert sorted(p.name for p in (state / "reserved").iterdir()) == [
        "history.json",
        "kept.json",
        "meta.json",
        "revision.json",
    ]
    # a path works as the layout; null kept; the pair with nothing dropped
    li.write_reserved(state, 1, ([], 0), None)
    assert read(state, "kept") is None and read(state, "history") == []
    assert read(state, "meta")["history"] == {"dropped": 0, "total": 0}
    # a bare list: the drop is unknown, so meta.json states none (no stale one left)
    li.write_reserved(state, 2, [li.history_record(entry(1))], None)
    assert read(state, "meta") == {"format": li.META_FORMAT}


def test_write_reserved_refuses_before_writing_anything(tmp_path: Path) -> None:
    state = tmp_path / "s"
    state.mkdir()
    with pytest.raises(ValueError):
        li.write_reserved(state, 0, [], None)
    with pytest.raises(TypeError):
        li.write_reserved(state, 1, {"not": "a list"}, None)
    with pytest.raises(canon.CanonError):
        li.write_reserved(state, 1, [], {"revision": 1, "score": float("nan"), "outputs": {}})
    assert not (state / "reserved").exists() or not any((state / "reserved").iterdir())


def test_reserve_reads_the_kept_revisions_records(tmp_path: Path) -> None:
    from tests.stage.stageplans import plan as mkplan
    from tests.stage.stageplans import settle, task

    p = mkplan(
        task("propose", emits={"x": "integer"}),
        task("evaluate", "evaluate", needs=["propose"], emits={"score": "number"}),
        version=2,
    )
    p["version"], p["edition"] = 3, 4
    p["loop"] = {
        "body": ["evaluate", "propose"],
        "score": "evaluate",
        "metric": "score",
        "direction": "max",
        "max_revisions": 5,
        "min_delta": 0,
        "history_bytes": 300,
    }
    state = tmp_path / "state"
    state.mkdir()
    for n, (x, score) in enumerate([(1, 0.1), (2, 0.9), (3, 0.5)], start=1):
        key = li.revision_key(n)
        settle(p, state, "propose", {"x": x, "undeclared": True}, key=key)
        settle(p, state, "evaluate", {"score": score}, key=key)
    revs = [
        entry(1, score=0.1, kept=True, score_=0.1),
        entry(2, score=0.9, kept=True),
        entry(3, score=0.5, note="n" * 120),
    ]
    history, dropped, kept = li.reserve(StateLayout(state), Plan.from_json(p), 4, revs)
    assert kept == {
        "revision": 2,
        "score": 0.9,
        "outputs": {"evaluate": {"score": 0.9}, "propose": {"x": 2}},
    }
    assert dropped >= 1 and [r["revision"] for r in history][-1] == 3
    assert len(canon.dumps(history)) <= 300
    assert read(state, "meta")["history"] == {"budget": 300, "dropped": dropped, "total": 3}
    assert read(state, "revision") == 4
    # nothing kept yet: null
    assert li.reserve(state, Plan.from_json(p), 2, [entry(1)])[2] is None
    assert read(state, "kept") is None


def test_the_meta_format_is_the_one_stage_reads() -> None:
    from crucible import stage

    assert li.META_FORMAT == stage.META_FORMAT
    assert li.revision_key(12) == "@rev12" and stage.revision_of("@rev12") == 12
    for bad in ("@rev0", "@rev01", "@rev", "rev1", "@rev1x", None, 3):
        assert stage.revision_of(bad) is None


def test_meta_json_matches_its_schema(tmp_path: Path) -> None:
    import json

    jsonschema = pytest.importorskip("jsonschema")
    schema_path = Path(__file__).resolve().parents[2] / "docs" / "schemas" / "reserved-meta.json"
    validator = jsonschema.Draft202012Validator(json.loads(schema_path.read_text()))
    state = tmp_path / "s"
    state.mkdir()
    revs = [entry(i, score=i, note="z" * 50) for i in range(1, 30)]
    li.write_reserved(state, 30, li.history_value(revs, 600), None, budget=600)
    meta = read(state, "meta")
    assert meta["history"]["dropped"] > 0
    validator.validate(meta)
    li.write_reserved(state, 1, [], None)
    validator.validate(read(state, "meta"))
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({"format": li.META_FORMAT, "history": {"dropped": -1, "total": 0}})

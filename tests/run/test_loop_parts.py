"""The scored loop's parts on their own (crucible.run.loop: _revision, _history,
_scoring, _budget): a revision's bookkeeping, keeping the best, judging a
revision and deciding to stop, without a dispatcher. The loop end to end is
tests/run/test_loop_run.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crucible.core import canon
from crucible.core.errors import InputRefused
from crucible.run.loop._budget import TimeBudget
from crucible.run.loop._history import LOOP_FORMAT, LoopHistory
from crucible.run.loop._revision import BodyGraph, Revision
from crucible.run.loop._scoring import judge, stop_reason
from crucible.run.loop._spec import LoopSpec

#: propose -> evaluate, and a lone note task in the body
NEEDS = {"seed": [], "propose": ["seed"], "evaluate": ["propose"], "note": []}


def _spec(**over: Any) -> LoopSpec:
    fields: dict[str, Any] = {
        "body": ("evaluate", "note", "propose"),
        "score": "evaluate",
        "metric": "m",
        "direction": "max",
        "max_revisions": 5,
        "min_delta": 0.0,
        "history_bytes": 65536,
    }
    return LoopSpec(**{**fields, **over})


def _revision() -> Revision:
    body = frozenset({"propose", "evaluate", "note"})
    return Revision(BodyGraph(body, ["seed", "propose", "evaluate", "note"], NEEDS))


def test_a_revision_wakes_a_body_task_once_its_body_needs_settled() -> None:
    rev = _revision()
    assert rev.body.order == ["propose", "evaluate", "note"]
    assert rev.begin(1) == ["propose", "note"] and rev.pending == 2 and rev.key == "@rev1"
    rev.settled("propose", "passed")
    assert rev.wake("propose") == ["evaluate"] and rev.pending == 2
    rev.settled("evaluate", "passed")
    assert rev.wake("evaluate") == [] and rev.unsettled() == 1
    rev.settled("note", "skipped")
    assert rev.pending == 0 and rev.unsettled() == 0
    rev.cut, rev.abort = True, "x"
    rev.begin(2)  # each revision starts clean
    assert rev.status == {} and not rev.cut and rev.abort is None and rev.key == "@rev2"


def test_a_task_joining_all_is_skipped_by_a_body_need_that_did_not_pass() -> None:
    rev = _revision()
    rev.begin(1)
    rev.settled("propose", "skipped")
    assert rev.failed_need("evaluate") == "skipped: needs 'propose', which was skipped"
    rev.status["propose"] = "failed"
    assert rev.failed_need("evaluate") == "skipped: needs 'propose', which failed"
    assert rev.failed_need("note") is None


def _passed(rev: Revision, score: Any) -> dict[str, Any]:
    for t in rev.body.order:
        rev.settled(t, "passed")
    return {"status": "passed", "note": "", "output": {"m": score, "other": 1}}


def test_judging_keeps_the_best_and_says_why(tmp_path: Path) -> None:
    spec = _spec(min_delta=0.5)
    history = LoopHistory(tmp_path / "loop.json", spec)
    rev = _revision()
    rev.begin(1)
    first = judge(spec, rev, _passed(rev, 2), {"m": "number"}, history, 7)
    assert first == {
        "revision": 1, "status": "passed", "score": 2, "verdict": "improved", "kept": True,
        "note": "the first passed revision", "delta": None, "fields": {"m": 2},
        "duration_ms": 7,
    }  # fmt: skip
    history.add(first)
    rev.begin(2)
    small = judge(spec, rev, _passed(rev, 2.25), {"m": "number"}, history, 1)
    assert (small["verdict"], small["kept"], small["delta"]) == ("not_improved", False, 0.25)
    assert small["note"] == "no improvement of at least 0.5 on revision 1"
    history.add(small)
    assert (history.kept, history.best, history.stale) == (1, 2, 1)
    rev.begin(3)
    big = judge(spec, rev, _passed(rev, 3), {"m": "number"}, history, 1)
    assert big["kept"] and big["note"] == "improved on revision 1 by 1"
    history.add(big)
    assert (history.kept, history.best, history.stale) == (3, 3, 0)


def test_a_revision_without_a_score_fails_saying_why(tmp_path: Path) -> None:
    spec = _spec(time_budget=2.0)
    history = LoopHistory(tmp_path / "loop.json", spec)
    rev = _revision()
    rev.begin(1)
    rev.abort = "body task 'propose' failed"
    assert judge(spec, rev, None, {}, history, 0)["note"] == "body task 'propose' failed"
    rev.begin(1)
    rev.settled("propose", "passed")
    entry = judge(spec, rev, None, {}, history, 0)
    assert entry["note"] == "the time budget of 2s ran out mid-revision"
    assert (entry["status"], entry["verdict"], entry["kept"]) == ("failed", "failed", False)
    rev.begin(1)
    rec = _passed(rev, "high")
    assert judge(spec, rev, rec, {}, history, 0)["note"] == (
        "score task 'evaluate' passed without a number in 'm'"
    )
    rev.status["evaluate"] = "failed"
    rec = {"status": "failed", "note": "exited 3\nstderr", "output": None}
    assert judge(spec, rev, rec, {}, history, 0)["note"] == "score task 'evaluate' failed: exited 3"


def test_the_loop_stops_for_the_first_reason_that_holds(tmp_path: Path) -> None:
    spec = _spec(target=10, patience=2, max_revisions=4)
    history = LoopHistory(tmp_path / "loop.json", spec)
    rev = _revision()
    budget = TimeBudget(None, 0.0)
    assert stop_reason(spec, history, rev, budget) is None
    history.add({"revision": 1, "kept": True, "score": 1})
    assert stop_reason(spec, history, rev, budget) is None
    rev.abort = "body task 'propose' failed"
    assert stop_reason(spec, history, rev, budget) == "body_failed"
    rev.abort = None
    history.add({"revision": 2, "kept": False})
    history.add({"revision": 3, "kept": False})
    assert stop_reason(spec, history, rev, budget) == "patience"
    assert stop_reason(spec, history, rev, TimeBudget(1.0, 5.0)) == "time_budget"
    history.add({"revision": 4, "kept": True, "score": 10})
    assert stop_reason(spec, history, rev, budget) == "target"


def test_loop_json_is_read_back_as_written(tmp_path: Path) -> None:
    spec = _spec()
    history = LoopHistory(tmp_path / "loop.json", spec)
    history.add({"revision": 1, "kept": True, "score": 4, "duration_ms": 1500})
    history.add({"revision": 2, "kept": False, "score": 3, "duration_ms": 500})
    history.stop_reason, history.finished = "max_revisions", True
    history.write()
    doc = canon.loads((tmp_path / "loop.json").read_bytes())
    assert doc["format"] == LOOP_FORMAT and doc["kept_revision"] == 1 and doc["best_score"] == 4
    again = LoopHistory(tmp_path / "loop.json", spec)
    again.load()
    assert (again.kept, again.best, again.stale, again.finished) == (1, 4, 1, True)
    assert again.stop_reason == "max_revisions" and again.duration_s() == 2.0
    (tmp_path / "loop.json").write_bytes(canon.dumps({"revisions": [{"revision": 2}]}))
    with pytest.raises(InputRefused, match="revision 1 is out of order"):
        LoopHistory(tmp_path / "loop.json", spec).load()


def test_a_time_budget_counts_earlier_sessions() -> None:
    assert TimeBudget(None, 99.0).stop_at() == () and not TimeBudget(None, 99.0).out_of_time()
    budget = TimeBudget(10.0, 9.96)
    budget.begin()
    assert budget.nearly_out() and not budget.out_of_time()
    assert TimeBudget(10.0, 10.0).out_of_time()
    (ends,) = TimeBudget(10.0, 4.0).stop_at()
    assert ends > 0

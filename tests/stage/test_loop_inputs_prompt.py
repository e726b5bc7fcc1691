"""History in an agent's prompt (issue 18 item 3; docs/spec/inputs.md 6): inside
its marked region, under the inline budget the other inputs leave, newest
records kept, and what is left out said before the region."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from crucible.core import canon
from crucible.core.plan import Plan
from crucible.run.loop import _inputs as li
from crucible.stage import (
    HISTORY_BEGIN,
    HISTORY_END,
    INLINE_TOTAL_MAX,
    INLINE_VALUE_MAX,
    StateDir,
)
from tests.stage.stageplans import plan, settle, task
from tests.stage.test_loop_inputs import loop_plan, rev_entry, run_revision


def region(text: str) -> Any:
    start = text.index(HISTORY_BEGIN) + len(HISTORY_BEGIN)
    return json.loads(text[start : text.index(HISTORY_END)])


def records(n: int, note_len: int) -> list[dict[str, Any]]:
    return [li.history_record(rev_entry(i, i, note="n" * note_len)) for i in range(1, n + 1)]


def _agent_plan(*, with_value: bool = False) -> dict[str, Any]:
    tasks = [task("a", emits={"big": "string"})]
    inputs = {"big": "a.big"} if with_value else None
    tasks.append(task("ag", "agent", needs=["a"], inputs=inputs, prompt="Go."))
    return plan(*tasks, version=2)


def _write(state: Path, history: list[Any], dropped: int = 0) -> None:
    li.write_reserved(state, len(history) + dropped + 1, (history, dropped), None)


def test_a_small_history_is_shown_whole_with_no_note(state: Path, ws: Path) -> None:
    p = _agent_plan()
    settle(p, state, "a", {"big": "b"})
    history = records(5, 10)
    _write(state, history)
    text = StateDir(p, state).render_prompt("ag", ws)
    assert region(text) == history
    assert "History:" not in text
    assert text.endswith(
        f"{HISTORY_BEGIN}\n{json.dumps(history, indent=2, sort_keys=True)}\n{HISTORY_END}\n"
    )


def test_a_long_history_shows_its_newest_records_within_the_total(state: Path, ws: Path) -> None:
    p = _agent_plan()
    settle(p, state, "a", {"big": "b"})
    history = records(200, 400)  # about 90 KB of records: over the 32 KiB total
    _write(state, history)
    text = StateDir(p, state).render_prompt("ag", ws)
    shown = region(text)
    assert shown == history[len(history) - len(shown) :] and shown[-1]["revision"] == 200
    # as many as fit: the next older one would pass the budget left by the other inputs
    inlined_revision = len(canon.dumps(1 + 200))  # the revision input (3 bytes) is inlined
    assert sum(len(canon.dumps(r)) for r in shown) <= INLINE_TOTAL_MAX - inlined_revision
    one_more = history[len(history) - len(shown) - 1 :]
    assert sum(len(canon.dumps(r)) for r in one_more) > INLINE_TOTAL_MAX - inlined_revision
    omitted = 200 - len(shown)
    assert (
        f"History: the {omitted} oldest records are not shown here (over the inline budget): "
        f"read inputs/@values/history.\n{HISTORY_BEGIN}\n"
    ) in text


def test_other_inlined_inputs_leave_less_for_history(state: Path, ws: Path) -> None:
    p = _agent_plan(with_value=True)
    big = "v" * (INLINE_VALUE_MAX - 2)  # exactly 2 KiB of canonical JSON: inlined
    settle(p, state, "a", {"big": big})
    history = records(200, 400)
    _write(state, history)
    text = StateDir(p, state).render_prompt("ag", ws)
    assert f"value: {json.dumps(big)}" in text
    shown = region(text)
    left = INLINE_TOTAL_MAX - INLINE_VALUE_MAX - len(canon.dumps(201))
    assert sum(len(canon.dumps(r)) for r in shown) <= left
    assert sum(len(canon.dumps(r)) for r in history[len(history) - len(shown) - 1 :]) > left


def test_a_newest_record_over_the_value_limit_hides_the_rest(state: Path, ws: Path) -> None:
    p = _agent_plan()
    settle(p, state, "a", {"big": "b"})
    history = [*records(3, 10), li.history_record(rev_entry(4, 4, note="z" * INLINE_VALUE_MAX))]
    _write(state, history)
    text = StateDir(p, state).render_prompt("ag", ws)
    assert region(text) == []
    assert "the 4 oldest records are not shown here" in text


def test_the_loop_budget_drop_is_said_too(state: Path, ws: Path) -> None:
    p = _agent_plan()
    settle(p, state, "a", {"big": "b"})
    history = records(4, 10)
    _write(state, history, dropped=3)
    text = StateDir(p, state).render_prompt("ag", ws)
    assert region(text) == history
    assert (
        f"History: the 3 oldest revisions were dropped by the loop's history budget.\n{HISTORY_BEGIN}"
        in text
    )


def test_v1_shows_the_whole_history_and_the_drop(state: Path, ws: Path) -> None:
    p = plan(task("a", emits={"x": "integer"}), task("ag", "agent", needs=["a"], prompt="Go."))
    settle(p, state, "a", {"x": 1})
    history = records(200, 400)  # v1 inlines everything, as it always has
    _write(state, history, dropped=2)
    text = StateDir(p, state).render_prompt("ag", ws)
    assert region(text) == history
    assert "@history" not in text.split(HISTORY_BEGIN)[0]
    assert (
        f"History: the 2 oldest revisions were dropped by the loop's history budget.\n{HISTORY_BEGIN}"
        in text
    )
    assert '"revision": 203' in text  # the revision input, in the object


def test_the_body_agent_sees_revision_kept_and_history(state: Path) -> None:
    p = loop_plan()
    settle(p, state, "before", {"seed": 7}, files={"seed.txt": b"7"})
    li.write_reserved(state, 1, [], None)
    run_revision(p, state, 1, 10, 0.9)
    li.reserve(state, Plan.from_json(p), 2, [rev_entry(1, 0.9, kept=True, note="first")])
    ws = state / "work" / "propose" / "%40rev2"
    text = StateDir(p, state).render_prompt("propose", ws, key="@rev2")
    assert text.startswith("Improve x.\n\n## Inputs\n")
    assert "- revision (any, 1 bytes, inputs/@values/revision)\n  value: 2\n" in text
    kept = json.dumps(
        {
            "outputs": {"evaluate": {"score": 0.9}, "propose": {"x": 10}},
            "revision": 1,
            "score": 0.9,
        },
        separators=(",", ":"),
    )
    assert f"  value: {kept}\n" in text
    assert region(text) == [
        {
            "fields": {"score": 0.9},
            "kept": True,
            "note": "first",
            "revision": 1,
            "score": 0.9,
            "verdict": "improved",
        }
    ]
    assert (ws / "inputs" / "@kept" / "propose" / "work" / "x.txt").read_text() == "10\n"
    assert "  files: inputs/@kept/propose/ (propose of revision 1, read-only)\n" in text


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.text(max_size=3000), max_size=60),
    st.integers(0, INLINE_TOTAL_MAX),
)
def test_the_shown_history_is_the_newest_suffix_within_budget(
    notes: list[str], budget: int
) -> None:
    from crucible.stage._prompt import _shown_history

    history = [{"revision": i, "note": n} for i, n in enumerate(notes, 1)]
    shown, omitted = _shown_history(history, budget)
    assert shown == history[len(history) - len(shown) :] and omitted + len(shown) == len(history)
    sizes = [len(canon.dumps(r)) for r in shown]
    assert sum(sizes) <= budget and all(s <= INLINE_VALUE_MAX for s in sizes)
    if omitted:  # the next older record would not fit
        nxt = len(canon.dumps(history[omitted - 1]))
        assert nxt > INLINE_VALUE_MAX or sum(sizes) + nxt > budget

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crucible.core import canon
from crucible.core.errors import InputRefused
from crucible.stage import (
    HISTORY_BEGIN,
    HISTORY_END,
    INLINE_TOTAL_MAX,
    INLINE_VALUE_MAX,
    StateDir,
)
from tests.stage.stageplans import plan, settle, task


def _region(text: str) -> str:
    start = text.index(HISTORY_BEGIN) + len(HISTORY_BEGIN)
    return text[start : text.index(HISTORY_END)]


def test_v2_lists_every_input_and_inlines_within_budget(state: Path, ws: Path) -> None:
    # 20 values of exactly 2 KiB canonical JSON: 16 fit the 32 KiB total, the
    # rest (and "tiny", which sorts after them) are listed only.
    n_small = 20
    emits = {f"f{i:02}": "string" for i in range(n_small)} | {"big": "string", "tiny": "integer"}
    inputs = {f"in{i:02}": f"a.f{i:02}" for i in range(n_small)} | {
        "big": "a.big",
        "tiny": "a.tiny",
    }
    p = plan(
        task("a", emits=emits),
        task("ag", "agent", needs=["a"], inputs=inputs, prompt="Do the thing."),
        version=2,
        params={"secret": {"type": "string", "default": "s3cr3t"}},
    )
    value = "v" * (INLINE_VALUE_MAX - 2)  # canonical size exactly 2 KiB
    out = {f"f{i:02}": value for i in range(n_small)} | {"big": "b" * INLINE_VALUE_MAX, "tiny": 7}
    settle(p, state, "a", out, emit_cap=1 << 20)
    text = StateDir(p, state).render_prompt("ag", ws)
    assert text.startswith("Do the thing.\n\n## Inputs\n")
    assert "s3cr3t" not in text and "params" not in text
    for name in [*inputs]:
        assert f"- {name} (" in text
    assert f"- big (string, {INLINE_VALUE_MAX + 2} bytes, inputs/@values/big, from a.big)" in text
    assert "b" * INLINE_VALUE_MAX not in text
    inlined = text.count("  value: ")
    assert (
        inlined == INLINE_TOTAL_MAX // INLINE_VALUE_MAX
    )  # 16 of the 2 KiB values (tiny comes after)
    assert text.count("not inlined: read the file") == len(inputs) - inlined
    # the inlined bytes stay within the total budget
    total = sum(
        len(line) - len("  value: ") for line in text.splitlines() if line.startswith("  value: ")
    )
    assert total <= INLINE_TOTAL_MAX


def test_v2_history_keeps_its_marked_region_and_fold_is_listed(state: Path, ws: Path) -> None:
    p = plan(
        task("src", emits={"xs": "array"}),
        task("m", needs=["src"], map="src.xs", emits={"v": "integer"}),
        task("ag", "agent", needs=["m"], inputs={"vs": "m.v"}, prompt="P"),
        version=2,
    )
    (state / "reserved").mkdir()
    history = [{"turn": i, "text": "x" * 3000} for i in range(20)]  # far over the budget
    (state / "reserved" / "history.json").write_bytes(canon.dumps(history))
    settle(p, state, "src", {"xs": [1, 2]})
    for k in ("0", "1"):
        settle(p, state, "m", {"v": int(k)}, key=k)
    StateDir(p, state).settle_fold("m", ["0", "1"])
    text = StateDir(p, state).render_prompt("ag", ws)
    # every record is over INLINE_VALUE_MAX: none is inlined (issue 18; the rest in
    # tests/stage/test_loop_inputs_prompt.py)
    assert json.loads(_region(text)) == []
    assert "History: the 20 oldest records are not shown here" in text
    assert "- vs (integer, fold of 2 entries, 2 bytes, inputs/@values/vs/, from m.v)" in text
    assert "- history (any," in text and "shown in the history region below" in text


def test_v1_renders_the_whole_object_pretty_without_params(state: Path, ws: Path) -> None:
    p = plan(
        task("a", emits={"x": "integer"}),
        task("ag", "agent", needs=["a"], prompt="Go."),
        params={"secret": {"type": "string", "default": "s3cr3t"}},
    )
    (state / "reserved").mkdir()
    (state / "reserved" / "history.json").write_text('["h1"]')
    settle(p, state, "a", {"x": 1, "big": "z" * 5000})
    text = StateDir(p, state).render_prompt("ag", ws)
    obj = {"a": {"big": "z" * 5000, "x": 1}}
    expected = (
        "Go.\n\n## Inputs\n\n```json\n"
        + json.dumps(obj, indent=2, sort_keys=True)
        + "\n```\n\n"
        + f'{HISTORY_BEGIN}\n[\n  "h1"\n]\n{HISTORY_END}\n'
    )
    assert text == expected


def test_prompt_uses_staged_inputs_and_refuses_non_agents(state: Path, ws: Path) -> None:
    p = plan(
        task("a", emits={"x": "integer"}),
        task("ag", "agent", needs=["a"], inputs={"x": "a.x"}),
        version=2,
    )
    settle(p, state, "a", {"x": 5})
    StateDir(p, state).stage_inputs("ag", ws)
    assert "  value: 5" in StateDir(p, state).render_prompt("ag", ws)
    with pytest.raises(InputRefused, match="not an agent"):
        StateDir(p, state).render_prompt("a", ws)

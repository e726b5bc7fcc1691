"""crucible.stage.commands called directly: options dataclasses in, data on the
stream given, exit code out (the click layer only builds the options)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from crucible.core import canon
from crucible.core.errors import InputRefused, PlanChanged, UsageError
from crucible.stage.commands import (
    CaptureOptions,
    InputsOptions,
    PromptOptions,
    TargetOptions,
    emit_cap_from,
    run_capture,
    run_inputs,
    run_prompt,
)
from tests.stage.stageplans import plan, settle, task

P = plan(
    task("a", emits={"x": "integer"}),
    task("c", needs=["a"], inputs={"x": "a.x"}),
    task("ag", "agent", needs=["a"], inputs={"x": "a.x"}, prompt="Count."),
    version=2,
)


def _state(tmp_path: Path) -> Path:
    state = tmp_path / "st"
    state.mkdir()
    (state / "plan.json").write_bytes(canon.dumps(P))
    settle(P, state, "a", {"x": 41})
    return state


def test_inputs_and_prompt_write_to_the_streams_given(tmp_path: Path) -> None:
    state = _state(tmp_path)
    out, err = io.BytesIO(), io.StringIO()
    target = TargetOptions(state=str(state), task="c")
    assert run_inputs(InputsOptions(target, "json"), out, err) == 0
    assert "CRUCIBLE_INPUTS_DIR" in canon.loads(out.getvalue())
    out = io.BytesIO()
    assert run_prompt(PromptOptions(TargetOptions(state=str(state), task="ag")), out, err) == 0
    assert out.getvalue().startswith(b"Count.\n\n## Inputs\n") and err.getvalue() == ""


def test_capture_from_stdin_and_its_refusals(tmp_path: Path) -> None:
    state = _state(tmp_path)
    (state / "work" / "a").mkdir(parents=True, exist_ok=True)
    target = TargetOptions(state=str(state), task="a")
    out = io.BytesIO()
    opts = CaptureOptions(target, exit_code=0, output="-")
    assert run_capture(opts, out, io.StringIO(), stdin=io.BytesIO(b'{"x": 1}')) == 0
    assert canon.loads(out.getvalue())["status"] == "passed"
    with pytest.raises(InputRefused, match=r"a failed: .*<stdin>|a failed"):
        run_capture(opts, io.BytesIO(), io.StringIO(), stdin=io.BytesIO(b"[]"))
    with pytest.raises(UsageError, match="CRUCIBLE_OUTPUT"):
        run_capture(CaptureOptions(target, exit_code=0), io.BytesIO(), io.StringIO())
    other = plan(task("a", emits={"x": "string"}), version=2)
    (tmp_path / "other.json").write_bytes(canon.dumps(other))
    changed = TargetOptions(state=str(state), task="a", plan=str(tmp_path / "other.json"))
    with pytest.raises(PlanChanged):
        run_capture(
            CaptureOptions(changed, exit_code=0, output="-"),
            io.BytesIO(),
            io.StringIO(),
            stdin=io.BytesIO(b"{}"),
        )


@pytest.mark.parametrize(
    ("option", "env", "expected"),
    [
        (None, {}, 65536),
        ("12", {}, 12),
        (None, {"CRUCIBLE_EMIT_CAP": "7"}, 7),
        ("3", {"CRUCIBLE_EMIT_CAP": "7"}, 3),
    ],
)
def test_emit_cap_sources(option: str | None, env: dict[str, str], expected: int) -> None:
    assert emit_cap_from(option, env) == expected


@pytest.mark.parametrize("bad", ["0", "-1", "x", "9" * 30])
def test_emit_cap_has_one_rule_and_names_its_source(bad: str) -> None:
    with pytest.raises(UsageError) as exc:
        emit_cap_from(bad, {})
    assert exc.value.where == "--emit-cap" and "from 1 to" in exc.value.message
    with pytest.raises(UsageError) as exc:
        emit_cap_from(None, {"CRUCIBLE_EMIT_CAP": bad})
    assert exc.value.where == "CRUCIBLE_EMIT_CAP"

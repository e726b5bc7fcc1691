"""Admission takes the plan's model from the compiler: it is built once per run,
from the plan compile checked, never again from the plan's JSON or its bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from crucible.compile import CompiledPlan, compile_path
from crucible.core import plan as plan_model
from crucible.run._options import RunOptions
from crucible.run.session._admit import _plan_changes, admit

PACK = """edition = 4
[workflow]
name = "w"

[[workflow.task]]
name = "a"
run = "true"
emits = { xs = "array" }

[[workflow.task]]
name = "b"
needs = ["a"]
map = "a.xs"
run = "true"
inputs = { xs = "a.xs" }
"""


@pytest.mark.parametrize("dry_run", [True, False])
def test_admission_builds_the_model_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dry_run: bool
) -> None:
    pack = tmp_path / "pack.toml"
    pack.write_text(PACK)
    built: list[object] = []
    from_json = plan_model.Plan.from_json.__func__  # type: ignore[attr-defined]

    def counting(cls: type[plan_model.Plan], obj: object, *, checked: bool = False) -> object:
        built.append(obj)
        return from_json(cls, obj, checked=checked)

    monkeypatch.setattr(plan_model.Plan, "from_json", classmethod(counting))
    admission = admit(RunOptions(plan=pack, state=tmp_path / "state", dry_run=dry_run), {})
    try:
        assert len(built) == 1  # compile's, and no other
        assert admission.model.order == ("a", "b")
        assert admission.model == plan_model.Plan.from_json(admission.plan)
    finally:
        admission.release()


def _compiled(tmp_path: Path, text: str) -> CompiledPlan:
    pack = tmp_path / "pack.toml"
    pack.write_text(text)
    return compile_path(pack)


def test_a_resume_refusal_says_what_changed_between_the_models(tmp_path: Path) -> None:
    old = _compiled(tmp_path, PACK + '[workflow.params.n]\ntype = "integer"\n')
    edited = PACK.replace('name = "b"', 'name = "b"\ndescription = "bee"')
    assert _plan_changes(old.data, _compiled(tmp_path, edited).model) == (
        "descriptions changed: b; params declared differently: n"
    )
    edited = PACK.replace('run = "true"\nemits', 'run = "false"\nemits') + (
        '[[workflow.task]]\nname = "c"\nrun = "true"\n'
    )
    assert _plan_changes(old.data, _compiled(tmp_path, edited).model) == (
        "tasks added: c; tasks changed: a; params declared differently: n"
    )
    assert _plan_changes(old.data, old.model) == "the workflow's other settings"
    assert _plan_changes(b"{}", old.model) == "the earlier plan cannot be read"

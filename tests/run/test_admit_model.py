"""Admission takes the plan's model from the compiler: it is built once per run,
from the plan compile checked, never again from the plan's JSON or its bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from crucible.core import plan as plan_model
from crucible.run._options import RunOptions
from crucible.run.session._admit import admit

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

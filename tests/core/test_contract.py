"""The tools agree on every shared contract value: one owner, crucible.core.contract."""

from __future__ import annotations

import pytest

from crucible.compile import _editions as editions
from crucible.compile import _names as names
from crucible.core import contract
from crucible.run.session import _admit as admit
from crucible.stage import _capture, _inputs, _names, _plan


def test_every_tool_uses_the_one_value() -> None:
    assert editions.RESERVED_INPUTS is contract.RESERVED_INPUTS is _inputs.RESERVED_INPUTS
    assert editions.SUPPORTED_VERSIONS is contract.SUPPORTED_VERSIONS is _plan.SUPPORTED_VERSIONS
    assert names.NAME_MAX_BYTES == contract.NAME_MAX_BYTES == _names.TASK_NAME_MAX
    assert _capture.EMIT_CAP_DEFAULT == contract.EMIT_CAP_DEFAULT == vars(admit)["EMIT_CAP_DEFAULT"]
    assert names.task_name_problems is contract.task_name_problems


@pytest.mark.parametrize(
    "name",
    [
        "a",
        "x" * contract.NAME_MAX_BYTES,
        "é" * (contract.NAME_MAX_BYTES // 2),
        "x" * (contract.NAME_MAX_BYTES + 1),
        "é" * (contract.NAME_MAX_BYTES // 2 + 1),
        "",
        ".",
        "..",
        "a/b",
        "a\\b",
        "@x",
        "a[1]",
        "a\x00b",
        "has space",
        "params",
    ],
)
def test_a_task_name_compile_accepts_stage_accepts(name: str) -> None:
    # compile is the stricter of the two (control characters, reserved inputs);
    # what it lets into a plan, stage must be able to stage
    if not contract.task_name_problems(name):
        assert _names.task_name_problem(name) is None
    if _names.task_name_problem(name) is not None:
        assert contract.task_name_problems(name)


def test_emit_cap_bounds() -> None:
    assert contract.EMIT_CAP_MIN >= 1 and contract.EMIT_CAP_DEFAULT >= contract.EMIT_CAP_MIN

"""The tools agree on every shared contract value: one owner, crucible.core.contract."""

from __future__ import annotations

import pytest

from crucible.compile import _editions as editions
from crucible.compile import _names as names
from crucible.core import canon, contract
from crucible.core.errors import UsageError
from crucible.run.session import _admit as admit
from crucible.stage import _capture, _inputs, _names, _plan


def test_every_tool_uses_the_one_value() -> None:
    assert editions.RESERVED_INPUTS is contract.RESERVED_INPUTS is _inputs.RESERVED_INPUTS
    assert editions.SUPPORTED_VERSIONS is contract.SUPPORTED_VERSIONS is _plan.SUPPORTED_VERSIONS
    assert names.NAME_MAX_BYTES == contract.NAME_MAX_BYTES == _names.TASK_NAME_MAX
    assert _capture.EMIT_CAP_DEFAULT == contract.EMIT_CAP_DEFAULT
    assert _capture.emit_cap_problem is contract.emit_cap_problem
    assert vars(admit)["contract"].emit_cap_from is contract.emit_cap_from
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
    assert contract.EMIT_CAP_MAX == canon.MAX_SAFE_INTEGER  # recorded as a JSON integer


@pytest.mark.parametrize("bad", ["0", "-3", "x", "1.5", str(2**53), ""])
def test_one_emit_cap_rule_and_message_for_every_source(bad: str) -> None:
    """Stage and dispatch both call contract.emit_cap_from: a flag and the
    environment get the same message, each naming where the value came from."""
    messages = set()
    for option, environ, where in (
        (bad, {}, "--emit-cap"),
        (None, {"CRUCIBLE_EMIT_CAP": bad}, "CRUCIBLE_EMIT_CAP"),
    ):
        if option is None and bad == "":
            assert contract.emit_cap_from(option, environ) == contract.EMIT_CAP_DEFAULT
            continue
        with pytest.raises(UsageError) as info:
            contract.emit_cap_from(option, environ)
        assert info.value.where == where and info.value.exit_code == 2
        messages.add(info.value.message)
    assert messages == {contract.emit_cap_problem(repr(bad))} or bad == ""


def test_the_emit_cap_default_and_bounds_are_taken() -> None:
    assert contract.emit_cap_from(None, {}) == contract.EMIT_CAP_DEFAULT
    assert contract.emit_cap_from(1, {}) == 1
    assert contract.emit_cap_from(str(contract.EMIT_CAP_MAX), {}) == contract.EMIT_CAP_MAX


def test_stage_and_compile_share_the_contracts_values() -> None:
    assert editions.TYPES is contract.TYPES and _plan.TYPES is contract.TYPES
    assert editions.SUPPORTED_EDITIONS is contract.SUPPORTED_EDITIONS

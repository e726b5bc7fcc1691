"""Issue 32 items 4-7 at compile time: the include-only matrix, ``on_empty``,
sequences with ``format`` and params, ``retry.when`` — plan forms, normal form,
and refusals with a code and a location."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crucible.compile import compile_bytes, load_plan_bytes
from crucible.compile._diagnostics import ValidationFailed
from crucible.compile._manifest import analyze_manifest
from crucible.core import canon

HEAD = """edition = 4
[workflow]
name = "v"
[workflow.params.n]
type = "integer"
default = 3
[workflow.params.word]
type = "string"
default = "x"
[workflow.params.anything]
type = "any"
"""


def plan_of(body: str, head: str = HEAD) -> dict[str, Any]:
    return compile_bytes((head + body).encode(), "pack.toml", Path(".")).plan


def codes(body: str, head: str = HEAD) -> list[tuple[str, str | None, str]]:
    analysis = analyze_manifest((head + body).encode(), "pack.toml", Path("."))
    return [(d.code, d.location.where(), d.message) for d in analysis.errors]


def task(body: str, name: str = "t", head: str = HEAD) -> dict[str, Any]:
    return next(t for t in plan_of(body, head)["tasks"] if t["name"] == name)


def one_task(lines: str) -> str:
    return f'[[workflow.task]]\nname = "t"\nrun = "true"\n{lines}\n'


def assert_refused(body: str, code: str, line: int, head: str = HEAD) -> str:
    found = codes(body, head)
    assert found and found[0][0] == code, found
    assert found[0][1] is not None and found[0][1].startswith(f"pack.toml:{line}:"), found
    return found[0][2]


def round_trips(body: str) -> None:
    """The plan passes the strict plan reader (normal form) with the same bytes."""
    plan = plan_of(body)
    data = canon.dumps(plan)
    assert load_plan_bytes(data, "plan.json").data == data


# -- item 4: the include-only matrix -------------------------------------------------


def test_an_include_only_matrix_compiles_to_no_axes_and_its_entries_in_order() -> None:
    body = one_task('matrix = { include = [{ os = "b", py = "3" }, { os = "a" }] }')
    assert task(body)["matrix"] == {"axes": [], "include": [{"os": "b", "py": "3"}, {"os": "a"}]}
    round_trips(body)


@pytest.mark.parametrize(
    ("lines", "code", "line"),
    [
        ("matrix = { include = [] }", "matrix-no-axes", 15),
        ("matrix = {}", "matrix-no-axes", 15),
        (
            'matrix = { include = [{ os = "a" }], exclude = [{ os = "a" }] }',
            "matrix-unknown-axis",
            15,
        ),
        ('matrix = { include = [{ os = "a" }, { os = "a" }] }', "duplicate-entry", 15),
        ("matrix = { include = [{ os = 1979-05-27 }] }", "bad-value", 15),
        ('matrix = { include = ["linux"] }', "wrong-type", 15),
        ('matrix = { include = "linux" }', "wrong-type", 15),
    ],
)
def test_include_only_matrix_refusals(lines: str, code: str, line: int) -> None:
    assert_refused(one_task(lines), code, line)


def test_a_repeated_include_entry_is_named_at_the_repeat() -> None:
    message = assert_refused(
        one_task("matrix = { include = [{ a = 1, b = 2 }, { c = 3 }, { b = 2, a = 1 }] }"),
        "duplicate-entry",
        15,
    )
    assert "include[2] repeats include[0]" in message


def test_an_include_only_matrix_is_refused_below_edition_4() -> None:
    head = HEAD.replace("edition = 4", "edition = 3").split("[workflow.params.n]")[0]
    found = codes(one_task('matrix = { include = [{ os = "a" }] }'), head)
    assert found[0][0] == "unknown-key" and "edition 4" in found[0][2], found


# -- item 5: on_empty -------------------------------------------------------------------


def test_on_empty_skip_is_kept_and_pass_is_omitted() -> None:
    body = one_task('map = "params.anything"\non_empty = "skip"')
    assert task(body)["on_empty"] == "skip"
    round_trips(body)
    assert "on_empty" not in task(one_task('matrix = { a = [1] }\non_empty = "pass"'))


@pytest.mark.parametrize(
    ("lines", "code", "line"),
    [
        ('on_empty = "skip"', "on-empty-needs-fanout", 15),
        ('on_empty = "pass"', "on-empty-needs-fanout", 15),
        ('map = [1]\non_empty = "never"', "bad-value", 16),
        ("map = [1]\non_empty = true", "wrong-type", 16),
        ('map = [1]\non_empty = ["skip"]', "wrong-type", 16),
    ],
)
def test_on_empty_refusals(lines: str, code: str, line: int) -> None:
    assert_refused(one_task(lines), code, line)


def test_on_empty_is_refused_below_edition_4() -> None:
    head = 'edition = 3\n[workflow]\nname = "v"\n'
    found = codes(one_task('on_empty = "skip"'), head)
    assert found[0][0] == "unknown-key" and "edition 4" in found[0][2], found


def test_a_plan_with_on_empty_pass_written_out_is_not_normal_form() -> None:
    plan = plan_of(one_task("map = [1]"))
    plan["tasks"][0]["on_empty"] = "pass"
    with pytest.raises(ValidationFailed) as caught:
        load_plan_bytes(canon.dumps(plan), "plan.json")
    assert [d.code for d in caught.value.diagnostics] == ["not-normal-form"]

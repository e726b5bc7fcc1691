"""Issue 32 items 1-3 at compile time: fan-out over a fan-out, element and member
references, computed run results: plan forms, normal form, located refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crucible.compile import compile_bytes, load_plan_bytes
from crucible.compile._diagnostics import ValidationFailed
from crucible.compile._manifest import analyze_manifest
from crucible.core import canon

HEAD = """edition = {edition}
[workflow]
name = "r"
[workflow.params.sep]
type = "string"
default = "-"
[[workflow.task]]
name = "gen"
run = "true"
emits = {{ items = "array", config = "object", n = "integer", rows = "any" }}
[[workflow.task]]
name = "m"
needs = ["gen"]
map = "gen.items"
run = "true"
emits = {{ v = "array", w = "integer" }}
"""


def plan_of(body: str, edition: int = 4) -> dict[str, Any]:
    text = HEAD.format(edition=edition) + body
    return compile_bytes(text.encode(), "pack.toml", Path(".")).plan


def found(body: str, edition: int = 4) -> list[tuple[str, str | None, str]]:
    text = HEAD.format(edition=edition) + body
    analysis = analyze_manifest(text.encode(), "pack.toml", Path("."))
    return [(d.code, d.location.where(), d.message) for d in analysis.errors]


def task(plan: dict[str, Any], name: str = "t") -> dict[str, Any]:
    return next(t for t in plan["tasks"] if t["name"] == name)


CONSUMER = '[[workflow.task]]\nname = "t"\nneeds = ["gen", "m"]\nrun = "true"\n'


def test_element_and_member_inputs_carry_their_path() -> None:
    plan = plan_of(CONSUMER + 'inputs = { a = "gen.items[0]", b = "gen.config.region" }\n')
    inputs = task(plan)["inputs"]
    assert inputs["a"] == {
        "from": "gen.items[0]",
        "producer": "gen",
        "field": "items",
        "path": [0],
        "type": "any",
    }
    assert inputs["b"]["path"] == ["region"] and inputs["b"]["field"] == "config"
    # the plan reads back in normal form, with the same digest
    data = canon.dumps(plan)
    assert load_plan_bytes(data, "plan.json").plan == plan


def test_a_dotted_task_name_keeps_its_meaning() -> None:
    body = (
        '[[workflow.task]]\nname = "gen.config"\nrun = "true"\nemits = { region = "string" }\n'
        + '[[workflow.task]]\nname = "t"\nneeds = ["gen.config", "gen"]\nrun = "true"\n'
        + 'inputs = { r = "gen.config.region", z = "gen.rows.zone" }\n'
    )
    inputs = task(plan_of(body))["inputs"]
    assert inputs["r"]["producer"] == "gen.config" and "path" not in inputs["r"]
    assert inputs["r"]["type"] == "string"
    assert (inputs["z"]["producer"], inputs["z"]["path"]) == ("gen", ["zone"])


def test_a_plan_whose_input_path_disagrees_is_not_normal_form() -> None:
    plan = plan_of(CONSUMER + 'inputs = { a = "gen.items[0]" }\n')
    task(plan)["inputs"]["a"]["path"] = [1]
    with pytest.raises(ValidationFailed, match=r"producer, field and path"):
        load_plan_bytes(canon.dumps(plan), "plan.json")


@pytest.mark.parametrize(
    ("line", "code", "says"),
    [
        (
            'inputs = { a = "gen.n[0]" }',
            "ref-wrong-type",
            "an element [0] of gen.n, which is declared integer",
        ),
        ('inputs = { a = "gen.items.k" }', "ref-wrong-type", "a member .k of gen.items"),
        ('inputs = { a = "m.v[0]" }', "ref-mapped-path", "a path into the values of 'm'"),
        (
            'inputs = { a = "gen.nope[0]" }',
            "input-unknown-field",
            "does not declare the field 'nope'",
        ),
        ('inputs = { a = "gen.items[-1]" }', "bad-ref", "expected [INDEX] or .MEMBER"),
        ('inputs = { a = "gen.items[0" }', "bad-ref", "at character 10"),
        ('map = "gen.n[0]"', "ref-wrong-type", "declared integer"),
        ('map = "m.v[0]"', "ref-mapped-path", "fans out"),
        ('matrix = { x = "gen.items.k" }', "ref-wrong-type", "a member .k"),
        ('matrix = { x = "gen.n" }', "matrix-axis-not-array", "declared integer"),
    ],
)
def test_misused_references_are_located(line: str, code: str, says: str) -> None:
    ((got, where, message),) = found(CONSUMER + line + "\n")
    assert got == code, message
    assert where is not None and where.startswith("pack.toml:21:"), where
    assert says in message, message


def test_paths_are_refused_below_edition_4() -> None:
    body = '[[workflow.task]]\nname = "t"\nneeds = ["gen"]\nrun = "true"\n'
    body += 'inputs = { a = "gen.items[0]" }\n'
    text = HEAD.format(edition=3).replace('map = "gen.items"\n', "") + body
    analysis = analyze_manifest(text.encode(), "pack.toml", Path("."))
    assert [d.code for d in analysis.errors] == ["bad-ref"]


def test_a_map_and_an_axis_over_a_mapped_task_compile_at_edition_4() -> None:
    plan = plan_of(
        CONSUMER.replace('"t"', '"b"')
        + 'map = "m.v"\nkey = "id"\n'
        + CONSUMER.replace('"t"', '"c"')
        + 'matrix = { x = "m.w", y = [1, 2] }\n'
        + CONSUMER.replace('"t"', '"d"')
        + 'map = "gen.config.list"\n'
    )
    assert task(plan, "b")["map"] == "m.v"
    assert task(plan, "c")["matrix"]["axes"][0]["source"] == "m.w"
    assert task(plan, "d")["map"] == "gen.config.list"


OUTPUTS = """[workflow.outputs]
{lines}
"""


@pytest.mark.parametrize(
    ("spelling", "form"),
    [
        ('"gen.n"', "gen.n"),
        ('"gen.items[1]"', "gen.items[1]"),
        ('"m.v"', "m.v"),  # a mapped task's fold (no more output-mapped)
        ('"tasks.gen.n + 1"', {"expression": "tasks.gen.n + 1"}),
        ('"tasks.gen.n"', {"expression": "tasks.gen.n"}),
        ('"len(tasks.m.w)"', {"expression": "len(tasks.m.w)"}),
        (
            "\"'%s%s' % (tasks.gen.n, params.sep)\"",
            {"expression": "'%s%s' % (tasks.gen.n, params.sep)"},
        ),
        ('{ expression = "tasks.gen.n" }', {"expression": "tasks.gen.n"}),
    ],
)
def test_outputs_are_references_or_expressions(spelling: str, form: Any) -> None:
    plan = plan_of(OUTPUTS.format(lines=f"x = {spelling}"))
    assert plan["workflow"]["outputs"] == {"x": form}
    assert load_plan_bytes(canon.dumps(plan), "plan.json").plan == plan


@pytest.mark.parametrize(
    ("spelling", "code", "says"),
    [
        ('"tasks.ghost.v"', "output-unknown-task", "'ghost' is not a task"),
        ('"tasks.gen.nope * 2"', "output-unknown-field", "does not declare the field 'nope'"),
        ('"tasks.gen"', "output-unknown-name", "tasks.TASK.FIELD"),
        ('"os.getenv(1)"', "output-unknown-name", "unknown name 'os'"),
        ('"params.nope"', "output-unknown-name", "no param 'nope'"),
        ('"tasks.gen.n +"', "output-syntax", "neither a reference"),
        ('"m.v[0]"', "ref-mapped-path", "tasks.m.v[0]"[:0] + "fans out"),
        ('"gen.n.k"', "ref-wrong-type", "a member .k"),
        ('{ expr = "tasks.gen.n" }', "unknown-key", "expr"),
    ],
)
def test_bad_outputs_are_located(spelling: str, code: str, says: str) -> None:
    ((got, where, message),) = found(OUTPUTS.format(lines=f"x = {spelling}"))
    assert got == code, message
    assert where is not None and where.startswith("pack.toml:"), where
    assert says in message, message


def test_a_starlark_pack_spells_them_alike(tmp_path: Path) -> None:
    from crucible.compile import compile_path

    (tmp_path / "pack.toml").write_text('edition = 4\n[workflow]\nsource = "pack.star"\n')
    (tmp_path / "pack.star").write_text(
        "workflow(name = 's', tasks = [\n"
        "    task(name = 'gen', run = 'true', emits = {'items': 'array', 'cfg': 'object'}),\n"
        "    task(name = 'use', needs = ['gen'], run = 'true',\n"
        "         inputs = {'a': 'gen.items[0]', 'b': 'gen.cfg.region'}),\n"
        "], outputs = {'n': 'len(tasks.gen.items)'})\n"
    )
    plan = compile_path(tmp_path / "pack.toml").plan
    assert task(plan, "use")["inputs"]["b"]["path"] == ["region"]
    assert plan["workflow"]["outputs"] == {"n": {"expression": "len(tasks.gen.items)"}}

"""The scored loop's ``[loop]`` table at compile time (issue 18 item 1): the IR v3
``loop`` member, its normal form in plan files, the edition rule, the digest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from crucible.compile import compile_bytes, load_plan_bytes
from crucible.compile._diagnostics import ValidationFailed
from crucible.compile._manifest import analyze_manifest

TASKS = """
[workflow]
name = "l"

[[workflow.task]]
name = "seed"
run = "true"
emits = { start = "number" }

[[workflow.task]]
name = "propose"
needs = ["seed"]
run = "true"
emits = { value = "number" }

[[workflow.task]]
name = "evaluate"
kind = "evaluate"
needs = ["propose"]
run = "true"
emits = { score = "number", rank = "integer", label = "string" }

[[workflow.task]]
name = "report"
needs = ["evaluate"]
run = "true"
"""

FULL = """
[loop]
body = ["propose", "evaluate"]
score = "evaluate"
metric = "score"
direction = "max"
max_revisions = 10
target = 0.95
patience = 3
min_delta = 0.01
time_budget = 600
history_bytes = 65536
"""

MINIMAL = """
[loop]
body = ["propose", "evaluate"]
score = "evaluate"
metric = "score"
max_revisions = 10
"""


def source(loop: str, edition: int = 4, tasks: str = TASKS) -> bytes:
    return f"edition = {edition}\n{tasks}{loop}".encode()


def compiled(loop: str, **kw: Any) -> Any:
    return compile_bytes(source(loop, **kw), "pack.toml", Path("."))


def test_the_loop_member_is_the_contracts() -> None:
    plan = compiled(FULL).plan
    assert plan["version"] == 3
    assert plan["loop"] == {
        "body": ["evaluate", "propose"],
        "direction": "max",
        "history_bytes": 65536,
        "max_revisions": 10,
        "metric": "score",
        "min_delta": 0.01,
        "patience": 3,
        "score": "evaluate",
        "target": 0.95,
        "time_budget": 600,
    }
    # the tasks themselves are compiled as without a loop
    without = compile_bytes(source(""), "pack.toml", Path(".")).plan
    assert plan["tasks"] == without["tasks"] and "loop" not in without


def test_defaults_are_written_out_and_absent_optionals_omitted() -> None:
    assert compiled(MINIMAL).plan["loop"] == {
        "body": ["evaluate", "propose"],
        "direction": "max",
        "history_bytes": 65536,
        "max_revisions": 10,
        "metric": "score",
        "min_delta": 0,
        "score": "evaluate",
    }


def test_the_canonical_bytes_take_the_exact_path() -> None:
    data = compiled(FULL.replace("0.95", "1e-7").replace("600", "600.5")).data
    loop = json.loads(data)["loop"]
    assert loop["target"] == 1e-7 and loop["time_budget"] == 600.5
    assert b'"target":1e-7' in data and b'"time_budget":600.5' in data


@pytest.mark.parametrize("loop", [FULL, MINIMAL])
def test_a_compiled_loop_plan_reads_back_with_the_same_digest(loop: str) -> None:
    plan = compiled(loop)
    again = load_plan_bytes(json.dumps(plan.plan, indent=1).encode(), "plan.json")
    assert again.digest == plan.digest and again.plan["loop"] == plan.plan["loop"]


@pytest.mark.parametrize(
    ("edit", "code"),
    [
        (lambda loop: loop.update(body=["propose", "evaluate"]), "not-normal-form"),
        (lambda loop: loop.pop("direction"), "not-normal-form"),
        (lambda loop: loop.pop("min_delta"), "not-normal-form"),
        (lambda loop: loop.update(colour=1), "unknown-key"),
        (lambda loop: loop.update(patience=0), "bad-value"),
        (lambda loop: loop.update(score="propose"), "loop-score-not-evaluate"),
        (lambda loop: loop.update(body=["evaluate", "ghost"]), "loop-unknown-task"),
        (lambda loop: loop.update(metric="label"), "loop-metric-not-numeric"),
    ],
)
def test_a_plan_file_loop_is_checked_like_a_manifest(edit: Any, code: str) -> None:
    plan = compiled(FULL).plan
    edit(plan["loop"])
    with pytest.raises(ValidationFailed) as err:
        load_plan_bytes(json.dumps(plan).encode(), "plan.json")
    assert err.value.diagnostics[0].code == code
    assert err.value.diagnostics[0].location.path is not None
    assert err.value.diagnostics[0].location.path.startswith("$.loop")


def test_a_v2_plan_with_a_loop_member_is_refused() -> None:
    plan = compile_bytes(source("", edition=3), "pack.toml", Path(".")).plan
    plan["loop"] = compiled(MINIMAL).plan["loop"]
    with pytest.raises(ValidationFailed) as err:
        load_plan_bytes(json.dumps(plan).encode(), "plan.json")
    assert [(d.code, d.location.path) for d in err.value.diagnostics] == [("unknown-key", "$.loop")]


@pytest.mark.parametrize("edition", [1, 2, 3])
def test_an_edition_3_or_older_pack_with_a_loop_is_refused_naming_edition_4(
    edition: int,
) -> None:
    analysis = analyze_manifest(source(FULL, edition=edition), "pack.toml", Path("."))
    assert [d.code for d in analysis.errors] == ["unknown-key"]
    error = analysis.errors[0]
    assert "'loop' needs edition 4" in error.message
    assert f"this pack is edition {edition}" in error.message
    assert error.location.where() == f"pack.toml:{TASKS.count(chr(10)) + 3}:2"


def test_a_pack_without_edition_is_edition_1_and_refused_too() -> None:
    analysis = analyze_manifest(TASKS.encode() + FULL.encode(), "pack.toml", Path("."))
    assert [d.code for d in analysis.errors] == ["unknown-key"]
    assert "needs edition 4" in analysis.errors[0].message


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('body = ["propose", "evaluate"]', 'body = ["seed", "propose", "evaluate"]'),
        ('metric = "score"', 'metric = "rank"'),
        ('direction = "max"', 'direction = "min"'),
        ("max_revisions = 10", "max_revisions = 11"),
        ("target = 0.95", "target = 0.96"),
        ("patience = 3", "patience = 4"),
        ("min_delta = 0.01", "min_delta = 0.02"),
        ("time_budget = 600", "time_budget = 601"),
        ("history_bytes = 65536", "history_bytes = 65537"),
        ("target = 0.95\n", ""),
        ("patience = 3\n", ""),
        ("time_budget = 600\n", ""),
    ],
)
def test_the_digest_changes_when_any_loop_value_changes(old: str, new: str) -> None:
    assert old in FULL
    assert compiled(FULL.replace(old, new)).digest != compiled(FULL).digest


def test_the_digest_does_not_change_with_the_body_order_or_written_defaults() -> None:
    # the plan holds the normal form: the same loop spelled two ways is one plan
    reordered = FULL.replace('["propose", "evaluate"]', '["evaluate", "propose"]')
    assert compiled(reordered).digest == compiled(FULL).digest
    written = MINIMAL + 'direction = "max"\nmin_delta = 0\nhistory_bytes = 65536\n'
    assert compiled(written).digest == compiled(MINIMAL).digest


def test_the_score_task_may_also_be_the_whole_body() -> None:
    plan = compiled(MINIMAL.replace('["propose", "evaluate"]', '["evaluate"]')).plan
    assert plan["loop"]["body"] == ["evaluate"]


def test_a_starlark_pack_takes_a_loop_beside_its_source(tmp_path: Path) -> None:
    (tmp_path / "pack.star").write_text(
        "workflow(\n"
        '    name = "s",\n'
        "    tasks = [\n"
        '        task(name = "p", run = "true", emits = {"v": "number"}),\n'
        '        task(name = "e", kind = "evaluate", needs = ["p"], run = "true",\n'
        '             emits = {"score": "number"}),\n'
        "    ],\n"
        ")\n"
    )
    manifest = (
        'edition = 4\n[workflow]\nsource = "pack.star"\n'
        '[loop]\nbody = ["p", "e"]\nscore = "e"\nmetric = "score"\nmax_revisions = 3\n'
    )
    plan = compile_bytes(manifest.encode(), "pack.toml", tmp_path).plan
    assert plan["loop"]["body"] == ["e", "p"]
    # a loop rule broken by a Starlark-built task is located in the manifest's [loop]
    bad = manifest.replace('score = "e"', 'score = "p"')
    analysis = analyze_manifest(bad.encode(), "pack.toml", tmp_path)
    assert [(d.code, d.location.where()) for d in analysis.errors] == [
        ("loop-score-not-evaluate", "pack.toml:6:1"),
        ("loop-metric-undeclared", "pack.toml:7:1"),
    ]


def test_graph_draws_the_body_as_one_labelled_cluster(tmp_path: Path) -> None:
    import subprocess
    import sys

    pack = tmp_path / "pack.toml"
    pack.write_bytes(source(FULL))
    compile_ = str(Path(sys.executable).parent / "crucible-compile")
    label = (
        "loop: max evaluate.score, at most 10 revisions, target 0.95, patience 3, "
        "min_delta 0.01, time budget 600 s"
    )
    dot = subprocess.run(
        [compile_, str(pack), "--graph", "dot"], capture_output=True, text=True, timeout=60
    )
    assert dot.returncode == 0, dot.stderr
    cluster = dot.stdout.split('subgraph "cluster_loop" {\n', 1)[1].split("  }\n", 1)[0]
    assert cluster.splitlines() == [
        f'    label="{label}"; style=dashed;',
        '    "evaluate";',
        '    "propose";',
    ]
    mermaid = subprocess.run(
        [compile_, str(pack), "--graph", "mermaid"], capture_output=True, text=True, timeout=60
    )
    assert mermaid.returncode == 0, mermaid.stderr
    assert f'  subgraph loop_body["{label}"]\n    t2\n    t1\n  end\n' in mermaid.stdout
    # a pack without a loop draws no cluster
    pack.write_bytes(source(""))
    plain = subprocess.run(
        [compile_, str(pack), "--graph", "dot"], capture_output=True, text=True, timeout=60
    )
    assert "cluster" not in plain.stdout


def test_the_schemas_take_the_loop_and_refuse_it_below_edition_4() -> None:
    import tomllib

    jsonschema = pytest.importorskip("jsonschema")
    schemas = Path(__file__).resolve().parents[2] / "docs" / "schemas"
    manifest = jsonschema.Draft202012Validator(json.loads((schemas / "manifest.json").read_text()))
    plan_v3 = jsonschema.Draft202012Validator(json.loads((schemas / "plan-v3.json").read_text()))
    assert manifest.is_valid(tomllib.loads(source(FULL).decode()))
    assert plan_v3.is_valid(compiled(FULL).plan) and plan_v3.is_valid(compiled(MINIMAL).plan)
    for edition in (1, 2, 3):
        assert not manifest.is_valid(tomllib.loads(source(FULL, edition=edition).decode()))
    assert not manifest.is_valid(tomllib.loads(TASKS + FULL))  # no edition: 1
    for edit in ({"colour": 1}, {"max_revisions": 0}, {"min_delta": -1}, {"direction": "up"}):
        doc = tomllib.loads(source(FULL).decode())
        doc["loop"].update(edit)
        assert not manifest.is_valid(doc), edit
        plan = compiled(FULL).plan
        plan["loop"].update(edit)
        assert not plan_v3.is_valid(plan), edit
    plan = compiled(MINIMAL).plan
    del plan["loop"]["direction"]  # the plan form writes defaults out
    assert not plan_v3.is_valid(plan)

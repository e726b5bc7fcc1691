"""Edition-4 control keys at compile time: normal form, the edition gate, and every
refusal with its code and file:line:col (docs/spec/manifest.md, "Control flow")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from crucible.compile import compile_path, load_plan_bytes
from crucible.compile._conditions import condition_reads, parse_condition
from crucible.compile._diagnostics import ValidationFailed

from .conftest import WritePack

VALIDATE = str(Path(sys.executable).parent / "crucible-validate")

HEAD = """
edition = 4

[workflow]
name = "c"

[workflow.params.publish]
type = "boolean"
default = false

[[workflow.task]]
name = "build"
run = "true"
emits = { version = "string", targets = "array" }
"""


def validate_json(path: Path) -> tuple[int, list[dict[str, Any]]]:
    proc = subprocess.run([VALIDATE, "--json", str(path)], capture_output=True, timeout=60)
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines()]


def test_control_keys_compile_to_their_normal_form(write_pack: WritePack) -> None:
    path = write_pack(
        HEAD
        + """
[[workflow.task]]
name = "publish"
needs = ["build"]
inputs = { version = "build.version" }
when = "params.publish and inputs.version != ''"
on_failure = "continue"
allow_exit = [3, 2]
retry = { limit = 2, delay = 0.25, on_exit = [75] }
deadline = 60
run = "true"

[[workflow.task]]
name = "quiet"
needs = ["build"]
on_failure = "fail"
run = "true"
"""
    )
    plan = compile_path(path)
    assert (plan.version, plan.edition) == (3, 4)
    publish, quiet = plan.plan["tasks"][1:]
    assert publish["when"] == "params.publish and inputs.version != ''"
    assert publish["on_failure"] == "continue"
    assert publish["allow_exit"] == [2, 3]
    assert publish["retry"] == {
        "limit": 2,
        "delay": 0.25,
        "factor": 2,
        "max_delay": 30,
        "on_timeout": True,
        "on_exit": [75],
    }
    assert publish["deadline"] == 60
    assert "on_failure" not in quiet  # the default is omitted
    # A plan file round-trips: normal form, and the digest is stable.
    again = load_plan_bytes(plan.data, "plan.json")
    assert again.digest == plan.digest


def test_an_edition_3_pack_refuses_when_naming_edition_4(write_pack: WritePack) -> None:
    path = write_pack(
        """
        edition = 3
        [workflow]
        name = "c"
        [[workflow.task]]
        name = "a"
        run = "true"
        when = "true"
        """
    )
    with pytest.raises(ValidationFailed) as info:
        compile_path(path)
    (diag,) = info.value.diagnostics
    assert diag.code == "unknown-key" and "needs edition 4" in diag.message


@pytest.mark.parametrize(
    ("task", "code", "line", "text"),
    [
        (
            'needs = ["build"]\nwhen = "inputs.version == \'1\'"',
            "when-unknown-name",
            16,
            "no input 'version'",
        ),
        (
            'needs = ["build"]\nwhen = "needs.deploy.status == \'failed\'"',
            "when-unknown-name",
            16,
            "'deploy' is not in the needs",
        ),
        ('when = "params.nope"', "when-unknown-name", 15, "no param 'nope'"),
        (
            'needs = ["build"]\nwhen = "needs.build.counts[\'passed\'] > 0"',
            "when-unknown-name",
            16,
            "'build' is not mapped",
        ),
        ('when = "item.x == 1"', "when-unknown-name", 15, "not mapped"),
        ("when = \"outcome.status == 'failed'\"", "when-unknown-name", 15, "not an epilogue"),
        (
            'needs = ["build"]\nwhen = "needs.build.result"',
            "when-unknown-name",
            16,
            "a need has a status",
        ),
        ("when = \"open('x')\"", "when-unknown-name", 15, "unknown name 'open'"),
        ('when = "params.publish =="', "when-syntax", 15, "at 1:"),
        ('when = "x = 1"', "when-syntax", 15, "not a single expression"),
        ('when = ""', "bad-value", 15, "must not be empty"),
        ('on_failure = "ignore"', "bad-value", 15, "on_failure must be one of"),
        ("allow_exit = [0]", "bad-value", 15, "1…255"),
        ('on_failure = "fail"\nallow_exit = [3]', "control-conflict", 16, "drop one"),
        ("retries = 2\nretry = { limit = 1 }", "control-conflict", 16, "retries and retry"),
        ("retry = { delay = 1 }", "missing-key", 15, "no limit"),
        ("retry = { limit = 1, backoff = 2 }", "unknown-key", 15, "'backoff'"),
        ("retry = { limit = 1, factor = 0.5 }", "bad-value", 15, "1 or more"),
        ("deadline = 0", "bad-value", 15, "greater than zero"),
    ],
)
def test_control_refusals_have_a_code_and_a_position(
    write_pack: WritePack, task: str, code: str, line: int, text: str
) -> None:
    path = write_pack(HEAD + '\n[[workflow.task]]\nname = "t"\nrun = "true"\n' + task + "\n")
    rc, diags = validate_json(path)
    assert rc == 1
    assert [d["code"] for d in diags] == [code], diags
    (diag,) = diags
    lines = path.read_text().splitlines()
    key = task.splitlines()[line - 15].split(" =")[0]
    assert diag["line"] == 1 + next(i for i, t in enumerate(lines) if t.startswith(key + " ="))
    assert diag["col"] >= 1
    assert text in diag["message"]


def test_an_epilogue_cycle_is_refused_with_its_path(write_pack: WritePack) -> None:
    path = write_pack(
        HEAD
        + """
[[workflow.task]]
name = "e1"
run = "true"
epilogue = true
needs = ["e2"]

[[workflow.task]]
name = "e2"
run = "true"
epilogue = true
needs = ["e1"]
"""
    )
    rc, diags = validate_json(path)
    assert rc == 1
    lines = path.read_text().splitlines()
    assert [(d["code"], d["line"]) for d in diags] == [("cycle", lines.index('name = "e1"') + 4)]
    assert "e1 -> e2 -> e1" in diags[0]["message"]


EPILOGUE_DAG = """
[[workflow.task]]
name = "report"
epilogue = true
run = "true"
emits = { channels = "array" }

[[workflow.task]]
name = "notify"
epilogue = true
needs = ["report"]
map = "report.channels"
when = "outcome.status == 'failed' and item != ''"
run = "true"
"""


def test_epilogues_form_a_dag_and_may_map_from_edition_4(write_pack: WritePack) -> None:
    plan = compile_path(write_pack(HEAD + EPILOGUE_DAG)).plan
    notify = plan["tasks"][-1]
    assert notify["needs"] == ["report"] and notify["map"] == "report.channels"


def test_epilogue_dag_stays_refused_before_edition_4(write_pack: WritePack) -> None:
    text = (HEAD + EPILOGUE_DAG).replace("edition = 4", "edition = 3")
    text = text.replace("when = \"outcome.status == 'failed' and item != ''\"\n", "")
    with pytest.raises(ValidationFailed) as info:
        compile_path(write_pack(text))
    assert {d.code for d in info.value.diagnostics} == {"needs-epilogue", "epilogue-map"}


def test_a_regular_task_still_cannot_need_an_epilogue(write_pack: WritePack) -> None:
    text = (
        HEAD
        + EPILOGUE_DAG
        + '\n[[workflow.task]]\nname = "late"\nneeds = ["report"]\nrun = "true"\n'
    )
    with pytest.raises(ValidationFailed) as info:
        compile_path(write_pack(text))
    assert [d.code for d in info.value.diagnostics] == ["needs-epilogue"]


def test_condition_reads_follow_attribute_chains_and_skip_bound_names() -> None:
    tree = parse_condition("any([x > 1 for x in inputs.sizes]) and needs.a.status == 'passed'")
    assert not isinstance(tree, str)
    parts = [r.parts for r in condition_reads(tree)]
    assert ("any",) in parts and ("inputs", "sizes") in parts
    assert ("needs", "a", "status") in parts and ("x",) not in parts


def test_a_plan_file_with_a_bad_condition_is_refused(write_pack: WritePack) -> None:
    plan = compile_path(
        write_pack(
            HEAD + '\n[[workflow.task]]\nname = "t"\nrun = "true"\nwhen = "params.publish"\n'
        )
    )
    data = plan.data.replace(b'"params.publish"', b'"params.other"')
    with pytest.raises(ValidationFailed) as info:
        load_plan_bytes(data, "plan.json")
    (diag,) = info.value.diagnostics
    assert diag.code == "when-unknown-name" and diag.location.path == "$.tasks[1].when"


def test_graph_shows_conditions_on_nodes_and_triggers_on_edges(write_pack: WritePack) -> None:
    from crucible.compile._graph import render

    plan = compile_path(
        write_pack(
            HEAD
            + """
[[workflow.task]]
name = "notify"
needs = ["build"]
join = "settled"
when = "needs.build.status == 'failed'"
on_failure = "continue"
run = "true"
"""
        )
    ).plan
    dot = render(plan, "dot")
    assert "notify\\nwhen needs.build.status == 'failed'\\n(on failure: continue)" in dot
    assert (
        '"build" -> "notify" [style=dashed, label="settled · when needs.build.status == \'failed\'"];'
        in dot
    )
    mermaid = render(plan, "mermaid")
    assert "t0 -.->|\"settled · when needs.build.status == 'failed'\"| t1" in mermaid


def test_starlark_tasks_take_the_control_keys(write_pack: WritePack) -> None:
    path = write_pack(
        'edition = 4\n[workflow]\nsource = "pack.star"\n',
        pack__star="""
        b = task(name = "build", run = "true")
        p = task(
            name = "pub",
            run = "true",
            needs = [b],
            when = "needs.build.status == 'passed'",
            allow_exit = [3],
            retry = {"limit": 1, "delay": 0},
        )
        workflow(name = "s", tasks = [b, p])
        """,
    )
    pub = compile_path(path).plan["tasks"][1]
    assert pub["when"] == "needs.build.status == 'passed'" and pub["allow_exit"] == [3]
    assert pub["retry"]["limit"] == 1 and pub["retry"]["delay"] == 0


def test_starlark_conditions_are_checked_at_the_task_call(write_pack: WritePack) -> None:
    path = write_pack(
        'edition = 4\n[workflow]\nsource = "pack.star"\n',
        pack__star="""
        b = task(name = "build", run = "true", when = "inputs.zz")
        workflow(name = "s", tasks = [b])
        """,
    )
    rc, diags = validate_json(path)
    assert rc == 1
    (diag,) = diags
    assert diag["code"] == "when-unknown-name" and diag["file"].endswith("pack.star")
    assert diag["line"] == 1


def test_float_members_of_edition_4_take_the_exact_canonical_path(write_pack: WritePack) -> None:
    from crucible.core import canon

    # orjson writes 2.0 as "2.0", RFC 8785 as "2": the fast path must not be taken
    path = write_pack(
        HEAD
        + '\n[[workflow.task]]\nname = "t"\nrun = "true"\n'
        + "retry = { limit = 1, delay = 2.0, max_delay = 100.0 }\ndeadline = 30.0\n"
    )
    compiled = compile_path(path)
    assert compiled.data == canon.dumps(compiled.plan)
    assert b'"deadline":30,' in compiled.data and b'"delay":2,' in compiled.data

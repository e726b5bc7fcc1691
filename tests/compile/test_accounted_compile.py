"""Accounted packs at compile time (issue 28 item 1, docs/spec/export.md §1–§3):
``[workflow.limits]``, the stage-tree shape with one located diagnostic per broken
rule, and the workflow record the plan carries (and re-validates)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from crucible.compile import compile_bytes, load_plan_bytes
from crucible.compile._accounted import LIMIT_DEFAULTS, camel_limits
from crucible.compile._diagnostics import ValidationFailed
from crucible.compile._manifest import analyze_manifest
from crucible.core import canon
from crucible.proof.writer import parse_workflow

COMPILE = str(Path(sys.executable).parent / "crucible-compile")

HEAD = """edition = 4
[workflow]
name = "org-people"
[workflow.limits]
max_bytes = 65536
max_files = 256
"""

ROOT = """
[[workflow.task]]
name = "org"
emits = { orgs = "array", note = "string" }
run = "true"
"""

PEOPLE = """
[[workflow.task]]
name = "people"
needs = ["org"]
map = "org.orgs"
emits = { person = "object" }
run = "true"
"""


def plan_of(body: str, head: str = HEAD) -> dict[str, Any]:
    return compile_bytes((head + body).encode(), "pack.toml", Path(".")).plan


def codes(body: str, head: str = HEAD) -> list[tuple[str, str | None]]:
    analysis = analyze_manifest((head + body).encode(), "pack.toml", Path("."))
    return [(d.code, d.location.where()) for d in analysis.errors]


def test_limits_and_record_in_the_plan() -> None:
    wf = plan_of(ROOT + PEOPLE)["workflow"]
    assert wf["limits"] == {**LIMIT_DEFAULTS, "max_bytes": 65536, "max_files": 256}
    assert wf["record"] == [
        {
            "name": "org",
            "input": {"fromStage": None, "fields": None, "admitMaxBytes": None},
            "output": {"pointer": "/orgs", "cardinality": "many"},
        },
        {
            "name": "people",
            "input": {"fromStage": "org", "fields": None, "admitMaxBytes": None},
            "output": {"pointer": "", "cardinality": "one"},
        },
    ]
    # the record is a workflow document the proof writer accepts
    doc = {
        "workflowVersion": 2,
        "name": wf["name"],
        "limits": camel_limits(wf["limits"]),
        "stages": wf["record"],
    }
    parsed = parse_workflow(canon.dumps(doc))
    assert parsed.limits.max_bytes == 65536
    assert [s.name for s in parsed.stages] == ["org", "people"]


def test_an_unaccounted_pack_has_neither() -> None:
    head = HEAD.replace("[workflow.limits]\nmax_bytes = 65536\nmax_files = 256\n", "")
    wf = plan_of(ROOT + PEOPLE, head)["workflow"]
    assert "limits" not in wf and "record" not in wf


def test_an_empty_limits_table_is_accounted_with_defaults() -> None:
    head = HEAD.replace("max_bytes = 65536\nmax_files = 256\n", "")
    assert plan_of(ROOT, head)["workflow"]["limits"] == LIMIT_DEFAULTS


def test_the_plan_round_trips_and_a_changed_record_is_refused() -> None:
    compiled = compile_bytes((HEAD + ROOT + PEOPLE).encode(), "pack.toml", Path("."))
    assert load_plan_bytes(compiled.data, "plan.json").data == compiled.data
    plan = json.loads(compiled.data)
    plan["workflow"]["record"][1]["output"]["cardinality"] = "many"
    with pytest.raises(ValidationFailed) as info:
        load_plan_bytes(canon.dumps(plan), "plan.json")
    assert "not-normal-form" in str(info.value.diagnostics[0].code)
    plan = json.loads(compiled.data)
    del plan["workflow"]["limits"]
    with pytest.raises(ValidationFailed):
        load_plan_bytes(canon.dumps(plan), "plan.json")


@pytest.mark.parametrize(
    ("value", "shown"),
    [("0", "0"), ("-3", "-3"), ('"10"', "'10'"), ("1.5", "1.5"), ("true", "true")],
)
def test_limits_must_be_positive_integers(value: str, shown: str) -> None:
    head = HEAD.replace("max_files = 256", f"max_files = {value}")
    analysis = analyze_manifest((head + ROOT).encode(), "pack.toml", Path("."))
    (err,) = analysis.errors
    assert err.code == "bad-limit"
    assert err.location.where() == "pack.toml:6:1"
    assert shown in err.message and "max_files" in err.message


def test_an_unknown_limit_and_an_old_edition() -> None:
    head = HEAD.replace("max_files = 256", "max_things = 3")
    assert codes(ROOT, head) == [("unknown-key", "pack.toml:6:1")]
    old = HEAD.replace("edition = 4", "edition = 3")
    assert codes(ROOT, old)[0][0] == "unknown-key"


@pytest.mark.parametrize(
    ("body", "code", "words"),
    [
        # two roots
        (ROOT + ROOT.replace('"org"', '"other"'), "accounted-root", "exactly one root"),
        # a join of the root's consumers
        (
            ROOT + PEOPLE + '\n[[workflow.task]]\nname = "sum"\nneeds = ["people"]\nrun = "true"\n',
            "accounted-root",
            "already",
        ),
        # a settled join
        (
            ROOT + PEOPLE.replace('run = "true"', 'join = "settled"\nrun = "true"'),
            "accounted-key",
            "join",
        ),
        (
            ROOT + PEOPLE.replace('run = "true"', 'retries = 2\nrun = "true"'),
            "accounted-key",
            "retries",
        ),
        (
            ROOT.replace('run = "true"', 'epilogue = true\nrun = "true"'),
            "accounted-key",
            "epilogue",
        ),
        (
            ROOT + PEOPLE.replace('run = "true"', 'when = "item.x == 1"\nrun = "true"'),
            "accounted-key",
            "when",
        ),
        # a matrix task is not a stage of the tree
        (
            ROOT + '\n[[workflow.task]]\nname = "m"\nmatrix = { a = [1, 2] }\nrun = "true"\n',
            "accounted-key",
            "matrix",
        ),
        # a literal map source
        (
            ROOT + '\n[[workflow.task]]\nname = "lit"\nmap = ["a", "b"]\nrun = "true"\n',
            "accounted-map",
            "earlier task",
        ),
        # fan-out over a fan-out
        (
            ROOT
            + PEOPLE.replace('person = "object"', 'papers = "array"')
            + '\n[[workflow.task]]\nname = "paper"\nneeds = ["people"]\nmap = "people.papers"\n'
            'run = "true"\n',
            # (refused by the general rule while dispatch has no fan-out over a fan-out)
            "accounted-fanout|map-mapped-source",
            "mapped",
        ),
        # two consumers of one stage over different fields
        (
            ROOT.replace('note = "string"', 'other = "array"')
            + PEOPLE
            + PEOPLE.replace('"people"', '"people2"').replace("org.orgs", "org.other"),
            "accounted-field",
            "one output field",
        ),
        # inputs beside the item
        (
            ROOT + PEOPLE.replace('run = "true"', 'inputs = { n = "org.note" }\nrun = "true"'),
            "accounted-inputs",
            "no inputs",
        ),
        # a task name that is no stage name
        (ROOT + PEOPLE.replace('"people"', '"People_x"'), "accounted-name", "stage names"),
    ],
)
def test_wrong_shapes_are_refused_with_the_task_and_rule(body: str, code: str, words: str) -> None:
    analysis = analyze_manifest((HEAD + body).encode(), "pack.toml", Path("."))
    found = [d for d in analysis.errors if d.code in code.split("|")]
    assert found, [(d.code, d.message) for d in analysis.errors]
    assert words in found[0].message
    assert found[0].location.where() is not None
    assert found[0].location.where().startswith("pack.toml:")


def test_the_command_prints_one_located_line(tmp_path: Path) -> None:
    pack = tmp_path / "pack.toml"
    pack.write_text(HEAD.replace("max_files = 256", "max_files = 0") + ROOT)
    out = tmp_path / "plan.json"
    proc = subprocess.run(
        [COMPILE, str(pack), "-o", str(out)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "pack.toml:6:1" in lines[0] and "[bad-limit]" in lines[0]
    assert not out.exists()

"""Edition 4 fan-out vocabulary at compile time: plan forms, normal form, refusals
with a code and a location (issue 17)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from crucible.compile import compile_bytes, load_plan_bytes
from crucible.compile._diagnostics import ValidationFailed
from crucible.compile._fanout import MAX_INSTANCES
from crucible.compile._manifest import analyze_manifest

COMPILE = str(Path(sys.executable).parent / "crucible-compile")

HEAD = """edition = 4
[workflow]
name = "f"
[workflow.params.regions]
type = "array"
default = ["eu", "us"]
[workflow.params.anything]
type = "any"
[workflow.params.n]
type = "integer"
default = 3
"""

PRODUCER = """
[[workflow.task]]
name = "split"
emits = { shards = "array", n = "integer", table = "object" }
emits_files = ["*.md"]
run = "true"
"""


def plan_of(body: str) -> dict[str, Any]:
    return compile_bytes((HEAD + body).encode(), "pack.toml", Path(".")).plan


def codes(body: str, head: str = HEAD) -> list[tuple[str, str | None]]:
    analysis = analyze_manifest((head + body).encode(), "pack.toml", Path("."))
    return [(d.code, d.location.where()) for d in analysis.errors]


def task(body: str, name: str = "t") -> dict[str, Any]:
    return next(t for t in plan_of(body)["tasks"] if t["name"] == name)


@pytest.mark.parametrize(
    ("spelling", "plan_form"),
    [
        ('["a", "b"]', {"items": ["a", "b"]}),
        ("{ items = { us = 1, eu = 2 } }", {"items": {"eu": 2, "us": 1}}),
        ('"params.regions"', {"param": "regions"}),
        ("{ count = 3 }", {"sequence": {"count": 3, "start": 0, "step": 1}}),
        ("{ start = 1, end = 9, step = 4 }", {"sequence": {"count": 3, "start": 1, "step": 4}}),
        ("{ start = 5, end = 1, step = -2 }", {"sequence": {"count": 3, "start": 5, "step": -2}}),
        ("{ start = 5, end = 1, step = -1 }", {"sequence": {"count": 5, "start": 5, "step": -1}}),
        ("{ start = 5, end = 5 }", {"sequence": {"count": 1, "start": 5, "step": 1}}),
    ],
)
def test_map_sources_compile_to_tagged_plan_forms(spelling: str, plan_form: Any) -> None:
    t = task(f'[[workflow.task]]\nname = "t"\nrun = "true"\nmap = {spelling}\n')
    assert t["map"] == plan_form


def test_a_plan_with_every_form_reads_back_in_normal_form() -> None:
    body = (
        PRODUCER
        + """
[[workflow.task]]
name = "t"
needs = ["split"]
run = "true"
parallelism = 2
matrix = { os = ["linux", "mac"], shard = "split.shards", r = "params.regions", n = { count = 2 }, exclude = [{ os = "mac", n = 1 }], include = [{ os = "linux", extra = 1.5 }] }
[[workflow.task]]
name = "k"
run = "true"
map = [{ name = "x" }, { name = "y" }]
key = "name"
[workflow.outputs]
shards = "split.n"
[workflow.publish]
"reports/" = "split:*.md"
"more/deep" = { from = ["split:a/*.md", "split:b.md"], settled = true }
"""
    )
    compiled = compile_bytes((HEAD + body).encode(), "pack.toml", Path("."))
    again = load_plan_bytes(compiled.data, "plan.json")
    assert again.digest == compiled.digest
    assert compiled.plan["workflow"]["publish"] == {
        "more/deep": {"from": ["split:a/*.md", "split:b.md"], "settled": True},
        "reports": {"from": ["split:*.md"], "settled": False},
    }
    matrix = next(t for t in compiled.plan["tasks"] if t["name"] == "t")["matrix"]
    assert [a["name"] for a in matrix["axes"]] == ["os", "shard", "r", "n"]
    # a plan in another spelling than the compiled one is not normal form
    plan = json.loads(compiled.data)
    plan["tasks"][1]["map"] = {"sequence": {"count": 2, "start": 0}}
    with pytest.raises(ValidationFailed):
        load_plan_bytes(json.dumps(plan).encode(), "plan.json")


def test_new_keys_need_edition_4() -> None:
    head = '[workflow]\nname = "f"\n'
    found = codes(
        '[[workflow.task]]\nname = "t"\nrun = "true"\nmatrix = { a = [1] }\n'
        '[workflow.outputs]\nx = "t.y"\n',
        head="edition = 3\n" + head,
    )
    assert [c for c, _ in found] == ["unknown-key", "unknown-key"]
    analysis = analyze_manifest(
        (
            "edition = 3\n" + head + '[[workflow.task]]\nname = "t"\nrun = "true"\nkey = "k"\n'
        ).encode(),
        "pack.toml",
        Path("."),
    )
    assert "needs edition 4" in analysis.errors[0].message
    # the literal form of map is not edition 3 either
    assert [
        c
        for c, _ in codes(
            '[[workflow.task]]\nname = "t"\nrun = "x"\nmap = [1]\n', "edition = 3\n" + head
        )
    ] == ["wrong-type"]


@pytest.mark.parametrize(
    ("body", "code", "line"),
    [
        # the validation list
        ('map = "params.nope"', "fanout-unknown-param", 15),
        ('matrix = { os = "linux" }', "bad-ref", 15),
        ("matrix = { os = { items = { a = 1 } } }", "matrix-axis-not-array", 15),
        ('matrix = { os = ["a"], exclude = [{ arch = "x" }] }', "matrix-unknown-axis", 15),
        # more
        ('matrix = { os = "params.n" }', "matrix-axis-not-array", 15),
        ('map = "params.n"', "map-not-collection", 15),
        ("matrix = { exclude = [{ a = 1 }] }", "matrix-no-axes", 15),
        ("map = [1]\nmatrix = { a = [1] }", "map-and-matrix", 16),
        ('key = "name"', "key-needs-map", 15),
        ('map = [{ name = "a" }, { name = "a" }]\nkey = "name"', "key-invalid", 15),
        ('map = [{ name = "a" }, { other = 1 }]\nkey = "name"', "key-invalid", 15),
        ("parallelism = 2", "parallelism-needs-fanout", 15),
        ("map = [1]\nparallelism = 0", "bad-value", 16),
        ("map = { count = 1, end = 3 }", "bad-value", 15),
        ("map = { count = 100001 }", "fanout-too-large", 15),
        ("map = { step = 0, end = 3 }", "bad-value", 15),
        ("map = { items = [1], more = 2 }", "unknown-key", 15),
        ("map = { colour = 1 }", "bad-value", 15),
        ("map = [1979-05-27]", "bad-value", 15),
    ],
)
def test_refusals_carry_a_code_and_a_line(body: str, code: str, line: int) -> None:
    found = codes(f'[[workflow.task]]\nname = "t"\nrun = "true"\n{body}\n')
    assert found and found[0][0] == code, found
    assert found[0][1] is not None and found[0][1].startswith(f"pack.toml:{line}:"), found


def test_a_static_matrix_over_the_bound_is_refused() -> None:
    axis = "[" + ", ".join(str(i) for i in range(400)) + "]"
    found = codes(
        f'[[workflow.task]]\nname = "t"\nrun = "true"\nmatrix = {{ a = {axis}, b = {axis} }}\n'
    )
    assert found[0][0] == "fanout-too-large"
    assert MAX_INSTANCES < 400 * 400


@pytest.mark.parametrize(
    ("table", "code"),
    [
        ('[workflow.outputs]\nx = "split.nope"', "output-unknown-field"),
        ('[workflow.outputs]\nx = "ghost.n"', "output-unknown-task"),
        ('[workflow.outputs]\nx = "split"', "output-unknown-name"),
        ('[workflow.outputs]\nx = "split.n +"', "output-syntax"),
        ('[workflow.publish]\n"../up" = "split:*.md"', "bad-path"),
        ('[workflow.publish]\n"/abs" = "split:*.md"', "bad-path"),
        ('[workflow.publish]\n"out" = "split:../*.md"', "bad-path"),
        ('[workflow.publish]\n"out" = "split:a/../../x"', "bad-path"),
        ('[workflow.publish]\n"out" = "ghost:*.md"', "publish-unknown-task"),
        ('[workflow.publish]\n"out" = "m:*.md"', "publish-no-files"),
        ('[workflow.publish]\n"out" = "split"', "bad-ref"),
        ('[workflow.publish]\n"a" = "split:*"\n"a/b" = "split:*"', "publish-overlap"),
        ('[workflow.publish]\n"a" = { from = "split:*", settled = "yes" }', "wrong-type"),
    ],
)
def test_outputs_and_publish_refusals(table: str, code: str) -> None:
    body = (
        PRODUCER
        + '[[workflow.task]]\nname = "m"\nrun = "true"\nmap = [1]\nemits = { v = "integer" }\n'
    )
    found = codes(body + table + "\n")
    assert [c for c, _ in found] == [code], found
    assert found[0][1] is not None and found[0][1].startswith("pack.toml:"), found


def test_validate_cli_names_the_publish_dotdot(tmp_path: Path) -> None:
    pack = tmp_path / "pack.toml"
    pack.write_text(HEAD + PRODUCER + '[workflow.publish]\n"../reports" = "split:*.md"\n')
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "crucible-validate"), str(pack)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert f"{pack}:" in proc.stderr + proc.stdout and "[bad-path]" in proc.stderr + proc.stdout


def test_graph_shows_matrix_axes(tmp_path: Path) -> None:
    pack = tmp_path / "pack.toml"
    pack.write_text(
        HEAD + PRODUCER + '[[workflow.task]]\nname = "t"\nneeds = ["split"]\nrun = "true"\n'
        'matrix = { os = ["a", "b"], shard = "split.shards" }\n'
    )
    for fmt in ("dot", "mermaid"):
        proc = subprocess.run(
            [COMPILE, str(pack), "--graph", fmt], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        assert "matrix os (2 items) × shard (split.shards)" in proc.stdout
        assert "axis shard" in proc.stdout


def test_starlark_takes_the_edition_4_keys(tmp_path: Path) -> None:
    (tmp_path / "pack.star").write_text(
        "workflow(\n"
        '    name = "s",\n'
        '    outputs = {"n": "a.n"},\n'
        '    publish = {"out/": "a:*.txt"},\n'
        "    tasks = [\n"
        '        task(name = "a", run = "true", emits = {"n": "integer"}, emits_files = ["*.txt"]),\n'
        '        task(name = "b", run = "true", matrix = {"x": [1, 2], "y": {"count": 2}},'
        " parallelism = 1),\n"
        "    ],\n"
        ")\n"
    )
    (tmp_path / "pack.toml").write_text('edition = 4\n[workflow]\nsource = "pack.star"\n')
    plan = compile_bytes(
        (tmp_path / "pack.toml").read_bytes(), str(tmp_path / "pack.toml"), tmp_path
    ).plan
    assert plan["workflow"]["outputs"] == {"n": "a.n"}
    assert plan["workflow"]["publish"] == {"out": {"from": ["a:*.txt"], "settled": False}}
    assert [a["name"] for a in plan["tasks"][1]["matrix"]["axes"]] == ["x", "y"]
    # edition 3: the same source is refused, naming edition 4 for the workflow keys
    (tmp_path / "pack.toml").write_text('edition = 3\n[workflow]\nsource = "pack.star"\n')
    with pytest.raises(ValidationFailed) as info:
        compile_bytes((tmp_path / "pack.toml").read_bytes(), "pack.toml", tmp_path)
    assert {d.code for d in info.value.diagnostics} == {"unknown-key"}

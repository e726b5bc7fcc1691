"""Edition-4 ``reads``, ``sandbox``, ``network`` (issue 34): plan form, the
``[workflow]`` defaults, and refusals (docs/spec/manifest.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crucible.compile import compile_bytes
from crucible.compile._manifest import analyze_manifest


def pack(task: str, workflow: str = "", edition: int = 4) -> bytes:
    return (
        f'edition = {edition}\n[workflow]\nname = "r"\n{workflow}\n[[workflow.task]]\nname = "t"\n'
        f'run = "true"\n{task}\n[[workflow.task]]\nname = "u"\nrun = "true"\n'
    ).encode()


def tasks(task: str, workflow: str = "") -> dict[str, dict[str, Any]]:
    plan = compile_bytes(pack(task, workflow), "pack.toml", Path(".")).plan
    return {t["name"]: t for t in plan["tasks"]}


def errors(task: str, workflow: str = "", edition: int = 4) -> list[tuple[str, str | None, str]]:
    analysis = analyze_manifest(pack(task, workflow, edition), "pack.toml", Path("."))
    return [(d.code, d.location.where(), d.message) for d in analysis.errors]


def test_reads_sandbox_network_in_the_plan() -> None:
    t = tasks('reads = ["data/*.csv", "/usr/share/dict/words", "a/../b.txt"]\nsandbox = true\n'
              "network = true")  # fmt: skip
    assert t["t"]["reads"] == ["data/*.csv", "/usr/share/dict/words", "a/../b.txt"]
    assert t["t"]["sandbox"] is True and t["t"]["network"] is True
    # absent and false are the same plan: an unchanged pack keeps its bytes and keys
    assert not {"reads", "sandbox", "network"} & set(t["u"])
    assert "sandbox" not in tasks("sandbox = false")["t"]


def test_workflow_defaults_are_merged_into_every_task() -> None:
    t = tasks(
        'reads = ["scripts/*.py", "data/*.csv"]\nsandbox = false',
        'reads = ["data/*.csv"]\nsandbox = true\nnetwork = true',
    )
    # the workflow's first, then the task's own that are new
    assert t["t"]["reads"] == ["data/*.csv", "scripts/*.py"]
    assert "sandbox" not in t["t"]  # the task's own false wins
    assert t["t"]["network"] is True
    assert t["u"]["reads"] == ["data/*.csv"]
    assert t["u"]["sandbox"] is True


def test_a_relative_read_climbing_above_the_pack_dir_is_refused_where_written() -> None:
    found = errors('reads = ["data/*.csv", "../shared/x.csv"]')
    assert found == [
        (
            "bad-path",
            "pack.toml:8:24",
            "reads entry '../shared/x.csv' climbs above the pack directory with '..'; "
            "name a file outside the pack by its absolute path",
        )
    ]
    # the same file named absolutely is accepted
    assert tasks('reads = ["/srv/shared/../x.csv"]')["t"]["reads"] == ["/srv/shared/../x.csv"]


@pytest.mark.parametrize(
    ("task", "code"),
    [
        ('reads = "data/*.csv"', "wrong-type"),
        ('reads = [""]', "bad-path"),
        ('reads = ["."]', "bad-path"),
        ('reads = ["a", "a"]', "duplicate-entry"),
        ('reads = ["data/[z-a].csv"]', "bad-path"),
        ('reads = ["data\\\\x"]', "bad-path"),
        ("sandbox = 1", "wrong-type"),
        ('network = "yes"', "wrong-type"),
    ],
)
def test_bad_values(task: str, code: str) -> None:
    assert [c for c, _, _ in errors(task)] == [code]


def test_workflow_defaults_are_checked_too() -> None:
    found = errors("", 'reads = ["../x"]\nsandbox = "yes"')
    assert [(c, w) for c, w, _ in found] == [
        ("bad-path", "pack.toml:4:10"),
        ("wrong-type", "pack.toml:5:1"),
    ]


@pytest.mark.parametrize("key", ["reads = []", "sandbox = true", "network = true"])
def test_edition_3_refuses_the_keys(key: str) -> None:
    found = errors(key, edition=3)
    assert [c for c, _, _ in found] == ["unknown-key"]
    assert "needs edition 4 (this pack is edition 3)" in found[0][2]
    found = errors("", key, edition=3)
    assert [c for c, _, _ in found] == ["unknown-key"]
    assert "needs edition 4 (this pack is edition 3)" in found[0][2]


def test_a_compiled_plan_is_accepted_back() -> None:
    from crucible.compile import load_plan_bytes
    from crucible.core import canon

    plan = compile_bytes(
        pack('reads = ["x/**"]\nsandbox = true', 'reads = ["d/*"]\nnetwork = true'),
        "pack.toml",
        Path("."),
    ).plan
    assert plan["tasks"][0]["reads"] == ["d/*", "x/**"]
    assert load_plan_bytes(canon.dumps(plan), "plan.json").plan == plan


def test_starlark_takes_the_same_keys(tmp_path: Path) -> None:
    from crucible.compile import compile_path
    from crucible.compile._diagnostics import ValidationFailed

    (tmp_path / "pack.toml").write_text('edition = 4\n[workflow]\nsource = "pack.star"\n')
    star = tmp_path / "pack.star"
    star.write_text(
        'a = task(name = "a", run = "true", reads = ["data/*.csv"], sandbox = True)\n'
        'workflow(name = "s", tasks = [a], reads = ["x/*"], network = True)\n'
    )
    task = compile_path(tmp_path / "pack.toml").plan["tasks"][0]
    assert task["reads"] == ["x/*", "data/*.csv"]
    assert task["sandbox"] is True and task["network"] is True
    star.write_text(
        'a = task(name = "a", run = "true", reads = ["../data/*.csv"])\n'
        'workflow(name = "s", tasks = [a])\n'
    )
    with pytest.raises(ValidationFailed) as caught:
        compile_path(tmp_path / "pack.toml")
    assert "climbs above the pack directory" in str(caught.value)

"""Edition-4 ``params = [...]`` on a task (issue 34 item 3): plan form and the
located refusals of a name not declared, a ``when``/``map``/axis reading a
param the task does not list, and the key at edition 3."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crucible.compile import compile_bytes
from crucible.compile._manifest import analyze_manifest

HEAD = """edition = {edition}
[workflow]
name = "p"
[workflow.params]
top = {{ type = "integer", default = 3 }}
xs = {{ type = "array", default = [1, 2] }}
[[workflow.task]]
name = "t"
run = "true"
"""


def pack(body: str, edition: int = 4) -> bytes:
    return (HEAD.format(edition=edition) + body).encode()


def codes(body: str, edition: int = 4) -> list[tuple[str, str | None, str]]:
    analysis = analyze_manifest(pack(body, edition), "pack.toml", Path("."))
    return [(d.code, d.location.where(), d.message) for d in analysis.errors]


def test_params_compile_into_the_plan_task() -> None:
    plan: dict[str, Any] = compile_bytes(pack('params = ["top"]\n'), "pack.toml", Path(".")).plan
    assert plan["tasks"][0]["params"] == ["top"]
    plan = compile_bytes(pack(""), "pack.toml", Path(".")).plan
    assert "params" not in plan["tasks"][0]  # absent: every param


@pytest.mark.parametrize(
    ("body", "code", "line", "words"),
    [
        ('params = ["nope"]\n', "task-params-unknown", 10, "'nope', which is not declared"),
        ('params = ["top", "top"]\n', "duplicate-entry", 10, "twice"),
        ('params = "top"\n', "wrong-type", 10, "array of strings"),
        ('params = []\nwhen = "params.top > 1"\n', "task-params-unread", 11, "params.top"),
        ('params = ["top"]\nmap = "params.xs"\n', "task-params-unread", 11, "params.xs"),
        (
            'params = ["top"]\nmatrix = { x = "params.xs" }\n',
            "task-params-unread",
            11,
            "params.xs",
        ),
    ],
)
def test_bad_params_are_refused_naming_line_and_param(
    body: str, code: str, line: int, words: str
) -> None:
    found = codes(body)
    assert [c for c, _, _ in found] == [code]
    where, message = found[0][1], found[0][2]
    assert where is not None and where.startswith(f"pack.toml:{line}")
    assert words in message


def test_listed_params_may_be_read_by_when_and_map() -> None:
    assert codes('params = ["top", "xs"]\nwhen = "params.top > 1"\nmap = "params.xs"\n') == []


def test_params_is_an_edition_4_key() -> None:
    found = codes('params = ["top"]\n', edition=3)
    assert [c for c, _, _ in found] == ["unknown-key"]
    assert "edition 4" in found[0][2]

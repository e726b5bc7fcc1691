"""Edition-4 ``resources = { cpus, memory, gpu }`` (issue 19): plan form and refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crucible.compile import compile_bytes
from crucible.compile._manifest import analyze_manifest
from crucible.compile._resources import parse_memory


def pack(resources: str, edition: int = 4) -> bytes:
    return (
        f'edition = {edition}\n[workflow]\nname = "r"\n[[workflow.task]]\nname = "t"\n'
        f'run = "true"\nresources = {resources}\n'
    ).encode()


def plan_task(resources: str) -> dict[str, Any]:
    plan = compile_bytes(pack(resources), "pack.toml", Path(".")).plan
    return plan["tasks"][0]  # type: ignore[no-any-return]


def codes(resources: str, edition: int = 4) -> list[tuple[str, str | None]]:
    analysis = analyze_manifest(pack(resources, edition), "pack.toml", Path("."))
    return [(d.code, d.location.where()) for d in analysis.errors]


def test_resources_compile_to_integers_with_memory_in_bytes() -> None:
    task = plan_task('{ cpus = 2, memory = "4GiB", gpu = 1 }')
    assert task["resources"] == {"cpus": 2, "memory": 4 * 2**30, "gpu": 1}
    assert plan_task("{ memory = 1000, gpu = 0 }")["resources"] == {"memory": 1000}


@pytest.mark.parametrize(
    ("text", "size"),
    [("4GiB", 4 * 2**30), ("1.5 GB", 1_500_000_000), ("512MiB", 2**29), ("10", 10), ("2kb", 2000)],
)
def test_memory_sizes(text: str, size: int) -> None:
    assert parse_memory(text) == size


@pytest.mark.parametrize(
    ("resources", "code"),
    [
        ("{ disk = 1 }", "unknown-key"),
        ("{ cpus = -1 }", "bad-value"),
        ("{ cpus = 1.5 }", "bad-value"),
        ('{ memory = "lots" }', "bad-value"),
        ('{ memory = "4XB" }', "bad-value"),
        ('"big"', "wrong-type"),
    ],
)
def test_bad_resources_are_refused_naming_line_and_field(resources: str, code: str) -> None:
    found = codes(resources)
    assert [c for c, _ in found] == [code]
    assert found[0][1] is not None and found[0][1].startswith("pack.toml:7")


def test_resources_before_edition_4_is_an_unknown_key() -> None:
    assert [c for c, _ in codes("{ cpus = 1 }", edition=3)] == ["unknown-key"]

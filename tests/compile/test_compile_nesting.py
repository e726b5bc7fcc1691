"""Deeply nested input: a diagnostic or a parse error, never exit 70 (QA regressions)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from crucible.compile import ValidationFailed, compile_path, load_plan_bytes
from crucible.compile._checker import MAX_DEFAULT_DEPTH
from crucible.core.canon import CanonError
from crucible.core.errors import ParseError

WritePack = Callable[..., Path]


def _pack(depth: int) -> str:
    nested = "[" * depth + "]" * depth
    return (
        'edition = 3\n[workflow]\nname = "deep"\n'
        f'[workflow.params.p]\ntype = "array"\ndefault = {nested}\n'
        '[[workflow.task]]\nname = "a"\nrun = "true"\n'
    )


def test_toml_nested_past_the_parser_is_a_parse_error(write_pack: WritePack) -> None:
    # tomllib recurses per level: 5000 levels used to escape as RecursionError (exit 70)
    path = write_pack("a = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ParseError, match="nested too deeply") as info:
        compile_path(path)
    assert info.value.where == str(path)


def test_default_at_the_depth_bound_compiles(write_pack: WritePack) -> None:
    compiled = compile_path(write_pack(_pack(MAX_DEFAULT_DEPTH)))
    assert compiled.plan["workflow"]["params"]["p"]["default"] is not None


@pytest.mark.parametrize("depth", [MAX_DEFAULT_DEPTH + 1, 300])
def test_default_past_the_depth_bound_is_bad_default(write_pack: WritePack, depth: int) -> None:
    # 300 levels used to reach orjson's 255-level limit when the plan was serialized
    path = write_pack(_pack(depth))
    with pytest.raises(ValidationFailed) as info:
        compile_path(path)
    (d,) = info.value.diagnostics
    assert d.code == "bad-default"
    assert f"deeper than {MAX_DEFAULT_DEPTH}" in d.message
    assert (d.location.line, d.location.col) == (6, 1)


def test_starlark_default_past_the_depth_bound_is_bad_default(write_pack: WritePack) -> None:
    path = write_pack(
        'edition = 3\n[workflow]\nsource = "pack.star"\n',
        pack__star="""
        def nest(n):
            v = []
            for _ in range(n):
                v = [v]
            return v
        workflow(name="x", params={"p": {"type": "array", "default": nest(300)}},
                 tasks=[task(name="a", run="true")])
        """,
    )
    with pytest.raises(ValidationFailed) as info:
        compile_path(path)
    assert [d.code for d in info.value.diagnostics] == ["bad-default"]


def test_plan_file_with_a_too_deep_default_is_bad_default() -> None:
    nested: list[object] = []
    for _ in range(300):
        nested = [nested]
    plan = {
        "version": 2,
        "edition": 3,
        "workflow": {"name": "x", "params": {"p": {"type": "array", "default": nested}}},
        "tasks": [
            {
                "name": "a",
                "kind": "command",
                "run": "true",
                "needs": [],
                "join": "all",
                "emits": {},
                "emits_files": [],
                "retries": 0,
                "epilogue": False,
            }
        ],
    }
    # A plan file is canonical JSON: nesting past canon.MAX_DEPTH (128) cannot
    # even be read (exit 2), before the default's own bound is checked.
    with pytest.raises(CanonError, match="nesting deeper than 128") as info:
        load_plan_bytes(json.dumps(plan).encode(), "plan.json")
    assert info.value.where == "plan.json" and info.value.exit_code == 2

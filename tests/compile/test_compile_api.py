"""The public API of crucible.compile (CONTRACT.md): editions, versions, bytes, digests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crucible.compile import (
    SUPPORTED_EDITIONS,
    CompiledPlan,
    ValidationFailed,
    compile_path,
    ir_version_for,
    load_any,
    load_plan_bytes,
    load_plan_path,
)
from crucible.core import canon, digest
from crucible.core.errors import ParseError, UnsupportedVersion, UsageError
from crucible.core.plan import Plan

WritePack = Callable[..., Path]

TASKS = """
[workflow]
name = "w"

[workflow.params.who]
type = "string"
default = "world"

[[workflow.task]]
name = "a"
run = ["echo", "a"]
emits = { n = "integer", xs = "array" }

[[workflow.task]]
name = "b"
needs = ["a"]
map = "a.xs"
run = "echo b"
"""


def manifest(edition: int | None, extra: str = "") -> str:
    head = "" if edition is None else f"edition = {edition}\n"
    return head + TASKS + extra


@pytest.mark.parametrize(("edition", "version"), [(None, 1), (1, 1), (2, 1), (3, 2)])
def test_edition_selects_ir_version(
    write_pack: WritePack, edition: int | None, version: int
) -> None:
    compiled = compile_path(write_pack(manifest(edition)))
    assert compiled.plan["version"] == version
    assert compiled.plan["edition"] == (edition or 1)
    assert ir_version_for(edition or 1) == version


def test_bytes_are_canonical_and_digest_is_sha256_of_them(write_pack: WritePack) -> None:
    compiled = compile_path(write_pack(manifest(3)))
    assert isinstance(compiled, CompiledPlan)
    assert compiled.data == canon.dumps(compiled.plan)
    assert compiled.digest == digest.of_bytes(compiled.data)
    assert canon.loads(compiled.data) == compiled.plan


@pytest.mark.parametrize("edition", [1, 3, 4])
def test_the_compiled_plan_carries_its_model(write_pack: WritePack, edition: int) -> None:
    """Compile emits the typed plan a run reads: the model of the plan it checked,
    whose JSON is the plan's bytes; a plan file read back carries an equal one."""
    compiled = compile_path(write_pack(manifest(edition)))
    assert isinstance(compiled.model, Plan)
    assert compiled.model == Plan.from_json(compiled.plan)
    assert canon.dumps(compiled.model.to_json()) == compiled.data
    assert (compiled.version, compiled.edition) == (compiled.plan["version"], edition)
    assert load_plan_bytes(compiled.data, "plan.json").model == compiled.model


def test_v2_only_fields_omitted_when_empty(write_pack: WritePack) -> None:
    """An edition-1/2 plan has no inputs/env members at all, so its bytes do not
    depend on what later editions add."""
    for edition in (1, 2, 3):
        plan = compile_path(write_pack(manifest(edition))).plan
        for task in plan["tasks"]:
            assert "inputs" not in task
            assert "env" not in task
            assert "map" in task or task["name"] == "a"
            assert "timeout" not in task and "prompt" not in task


def test_same_tasks_differ_only_in_version_and_edition(write_pack: WritePack) -> None:
    one = compile_path(write_pack(manifest(None))).plan
    two = compile_path(write_pack(manifest(2))).plan
    three = compile_path(write_pack(manifest(3))).plan
    for p in (two, three):
        assert {k: v for k, v in p.items() if k not in ("version", "edition")} == {
            k: v for k, v in one.items() if k not in ("version", "edition")
        }
    # An absent edition and `edition = 1` compile to the same bytes.
    assert (
        compile_path(write_pack(manifest(1))).data == compile_path(write_pack(manifest(None))).data
    )


def test_edition_1_warns_suggesting_edition_3(write_pack: WritePack) -> None:
    assert "edition = 3" in compile_path(write_pack(manifest(None))).warnings[0]
    assert compile_path(write_pack(manifest(2))).warnings == []
    assert compile_path(write_pack(manifest(3))).warnings == []


@pytest.mark.parametrize("edition", ["0", "5", '"3"', "true", "3.0"])
def test_unsupported_edition_names_supported(write_pack: WritePack, edition: str) -> None:
    path = write_pack(f"edition = {edition}\n" + TASKS)
    with pytest.raises(UnsupportedVersion) as info:
        compile_path(path)
    assert "1, 2, 3, 4" in str(info.value)
    assert str(info.value).startswith(f"{path}:1:1: ")
    assert info.value.exit_code == 1
    assert SUPPORTED_EDITIONS == (1, 2, 3, 4)


def test_plan_round_trip_and_load_any(write_pack: WritePack, tmp_path: Path) -> None:
    manifest_path = write_pack(
        manifest(
            3,
            '\n[[workflow.task]]\nname = "c"\nneeds = ["a"]\nrun = "x"\ninputs = { n = "a.n" }\nenv = ["HOME"]\ntimeout = 2.5\n',
        )
    )
    compiled = compile_path(manifest_path)
    plan_path = tmp_path / "plan.json"
    plan_path.write_bytes(compiled.data)
    loaded = load_plan_path(plan_path)
    assert loaded.data == compiled.data and loaded.digest == compiled.digest
    assert load_any(plan_path).digest == compiled.digest
    assert load_any(manifest_path).digest == compiled.digest
    # a non-canonical spelling of the same plan has the same canonical bytes
    import json

    plan_path.write_text(json.dumps(compiled.plan, indent=2))
    assert load_plan_path(plan_path).digest == compiled.digest


def _plan_file(tmp_path: Path, plan: dict) -> Path:  # type: ignore[type-arg]
    path = tmp_path / "plan.json"
    path.write_bytes(canon.dumps(plan))
    return path


def test_plan_unsupported_version_names_supported(write_pack: WritePack, tmp_path: Path) -> None:
    plan = compile_path(write_pack(manifest(3))).plan
    plan["version"] = 4
    with pytest.raises(UnsupportedVersion) as info:
        load_plan_path(_plan_file(tmp_path, plan))
    assert "supports versions 1, 2, 3" in str(info.value)
    assert "$.version" in str(info.value)


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (lambda p: p.update(extra=1), "unknown-key"),
        (lambda p: p["workflow"].update(edition=3), "unknown-key"),
        (lambda p: p["tasks"][0].update(colour="red"), "unknown-key"),
        (
            lambda p: p["tasks"][0].update(
                inputs={"n": {"from": "a.n", "producer": "a", "field": "n", "type": "integer"}}
            ),
            "unknown-key",
        ),
        (lambda p: p["tasks"][0].update(env=["HOME"]), "unknown-key"),
        (lambda p: p["tasks"][0].pop("join"), "missing-key"),
        (lambda p: p["tasks"][0].update(emits_files=None), "wrong-type"),
        (lambda p: p.update(version=2), "version-mismatch"),
        (lambda p: p["tasks"][1].update(needs=["zz"]), "unknown-need"),
        (lambda p: p["tasks"][0].update(description=""), None),
    ],
)
def test_plan_files_are_checked_strictly(
    write_pack: WritePack,
    tmp_path: Path,
    mutate: Callable[[dict[str, Any]], object],
    code: str | None,
) -> None:
    plan = compile_path(write_pack(manifest(1))).plan
    mutate(plan)
    path = _plan_file(tmp_path, plan)
    if code is None:
        load_plan_path(path)
        return
    with pytest.raises(ValidationFailed) as info:
        load_plan_path(path)
    assert code in {d.code for d in info.value.diagnostics}
    assert str(info.value).startswith(f"{path}:$")


def test_v2_plan_input_type_must_match_producer(write_pack: WritePack, tmp_path: Path) -> None:
    plan = compile_path(
        write_pack(
            manifest(
                3,
                '\n[[workflow.task]]\nname = "c"\nneeds = ["a"]\nrun = "x"\ninputs = { n = "a.n" }\n',
            )
        )
    ).plan
    plan["tasks"][2]["inputs"]["n"]["type"] = "string"
    with pytest.raises(ValidationFailed) as info:
        load_plan_path(_plan_file(tmp_path, plan))
    assert [d.code for d in info.value.diagnostics] == ["input-type-mismatch"]


def test_plan_not_json_is_a_parse_error(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_bytes(b'{"version": 1, "version": 1}')
    with pytest.raises(ParseError) as info:
        load_plan_path(path)
    assert info.value.exit_code == 2 and str(path) in str(info.value)


def test_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    for fn in (compile_path, load_plan_path, load_any):
        with pytest.raises(UsageError) as info:
            fn(tmp_path / "nope.toml")
        assert info.value.exit_code == 2 and "no such file" in str(info.value)


def test_malformed_toml_names_line_and_column(write_pack: WritePack) -> None:
    path = write_pack('[workflow]\nname = "w"\nbad = = 1\n')
    with pytest.raises(ParseError) as info:
        compile_path(path)
    assert str(info.value).startswith(f"{path}:3:")
    assert info.value.exit_code == 2
    assert "\n" not in str(info.value)


def test_not_utf8_is_a_parse_error(tmp_path: Path) -> None:
    path = tmp_path / "pack.toml"
    path.write_bytes(b'[workflow]\nname = "\xff"\n')
    with pytest.raises(ParseError):
        compile_path(path)


@pytest.mark.parametrize(
    "extra",
    [
        "timeout = 1.5",
        "timeout = 3",
        '[workflow.params.f]\ntype = "number"\ndefault = 0.1',
        '[workflow.params.o]\ntype = "object"\ndefault = { "\ue000" = 1, "\U0001f600" = 2, "z" = 3 }',
        '[workflow.params.o]\ntype = "any"\ndefault = [{ a = [1e300] }]',
    ],
)
def test_fast_canonical_path_equals_rfc8785(write_pack: WritePack, extra: str) -> None:
    text = manifest(3) + ("\n" + extra + "\n" if extra.startswith("timeout") else "")
    if extra.startswith("["):
        text = text.replace("[[workflow.task]]", extra + "\n\n[[workflow.task]]", 1)
    compiled = compile_path(write_pack(text))
    assert compiled.data == canon.dumps(compiled.plan)


def test_plan_without_edition_is_missing_key_not_edition_none() -> None:
    # used to read "unsupported edition None; this engine supports editions 1, 2, 3"
    with pytest.raises(ValidationFailed) as info:
        load_plan_bytes(b'{"version": 2}', "plan.json")
    (d,) = info.value.diagnostics
    assert (d.code, d.message) == ("missing-key", "plan has no edition")
    assert d.text().startswith("plan.json:$: error:")


@pytest.mark.parametrize(
    ("value", "shown"),
    [("true", "true"), ('"3"', '"3"'), ("1979-05-27", "1979-05-27"), ("3.5", "3.5")],
)
def test_refused_edition_is_shown_as_written(tmp_path: Path, value: str, shown: str) -> None:
    # used Python's repr: "unsupported edition True", "'3'", "datetime.date(1979, 5, 27)"
    path = tmp_path / "pack.toml"
    path.write_text(f'edition = {value}\n[workflow]\nname = "x"\n')
    with pytest.raises(UnsupportedVersion) as info:
        compile_path(path)
    assert info.value.message.startswith(f"unsupported edition {shown}; ")


def test_edition_4_compiles_to_version_3_and_round_trips(
    write_pack: WritePack, tmp_path: Path
) -> None:
    """Edition 4 is the gate for the control-flow, fan-out, cache and loop keys: its
    plans say version 3, which an engine that knows only 1 and 2 refuses whole."""
    plan = compile_path(write_pack(manifest(4))).plan
    assert (plan["version"], plan["edition"]) == (3, 4)
    assert load_plan_path(_plan_file(tmp_path, plan)).plan == plan
    plan["version"] = 2
    with pytest.raises(ValidationFailed):
        load_plan_path(_plan_file(tmp_path, plan))

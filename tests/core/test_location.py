"""Errors carry a structured Location; ``where`` is its one formatted text."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from crucible.compile import load_plan_bytes
from crucible.compile.commands import validate_one
from crucible.core import canon, ndjson
from crucible.core.errors import CrucibleError, InputRefused, Location, ParseError, format_where


def test_location_formats_in_one_place() -> None:
    assert Location("a.toml", 3, 1).where() == "a.toml:3:1" == format_where("a.toml", 3, 1)
    assert Location("p.json", path="$.tasks[0]").where() == "p.json:$.tasks[0]"
    assert Location(path="$.x").where() == "$.x"
    assert Location().where() == "" and not Location()
    assert Location("f", 2).in_file("g") == Location("g", 2)


def test_error_carries_location_and_where_stays_a_formatted_property() -> None:
    exc = InputRefused("bad", location=Location("a.toml", 3, 1))
    assert exc.location == Location("a.toml", 3, 1)
    assert exc.where == "a.toml:3:1" and str(exc) == "a.toml:3:1: bad"
    legacy = InputRefused("bad", where="plan:$.tasks")  # callers not yet migrated
    assert legacy.where == "plan:$.tasks" and str(legacy) == "plan:$.tasks: bad"
    legacy.where = "p.json"
    assert legacy.location == Location("p.json") and str(legacy) == "p.json: bad"
    assert CrucibleError("x").where is None and str(CrucibleError("x")) == "x"


def test_name_source_fills_in_the_file_a_library_did_not_know() -> None:
    exc = ParseError("bad", location=Location(path="$.a"))
    exc.name_source("plan.json")
    assert exc.location == Location("plan.json", path="$.a")
    placeholder = ParseError("bad", location=Location("plan", path="$.b"))
    placeholder.name_source("p.json", placeholder="plan")
    assert placeholder.where == "p.json:$.b"
    known = ParseError("bad", location=Location("other.json", 2))
    known.name_source("p.json", placeholder="plan")
    assert known.where == "other.json:2"


def test_library_errors_are_structured() -> None:
    with pytest.raises(ndjson.NdjsonError) as nd:
        list(ndjson.iter_lines(io.BytesIO(b'{"a":1}\n[]\n'), name="log.ndjson"))
    assert nd.value.location == Location("log.ndjson", 2)
    with pytest.raises(canon.CanonError) as c:
        canon.dumps({"a": [float("nan")]})
    assert c.value.location.path is not None and c.value.location.path.startswith("$")
    with pytest.raises(CrucibleError) as v:
        load_plan_bytes(b'{"version": 99, "edition": 3}', "p.json")
    assert v.value.location == Location("p.json", path="$.version")


def test_validate_reports_an_error_location_without_parsing_text(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[workflow\n")
    analysis, code = validate_one(bad, None)
    (d,) = analysis.diagnostics
    assert code == 2 and d.location.file == str(bad) and d.location.line == 1
    plan = tmp_path / "p.json"
    plan.write_text('{"version": 99, "edition": 3}')
    analysis, code = validate_one(plan, None)
    (d,) = analysis.diagnostics
    assert code == 1 and d.location == Location(str(plan), path="$.version")


def test_no_where_parsing_and_no_type_name_tests_left() -> None:
    tools = Path(__file__).resolve().parents[2] / "tools"
    commands = (tools / "compile" / "commands.py").read_text()
    assert "re.match" not in commands and "\nimport re\n" not in commands
    assert "PacifyFlushWrapper" not in (tools / "core" / "cli.py").read_text()


def test_where_json_path_in_validate_json(tmp_path: Path) -> None:
    plan = tmp_path / "p.json"
    plan.write_text('{"version": 99, "edition": 3}')
    exe = Path(sys.executable).parent / "crucible-validate"
    proc = subprocess.run([exe, "--json", str(plan)], capture_output=True, text=True)
    assert proc.returncode == 1
    record = canon.loads(proc.stdout)
    assert record["file"] == str(plan) and record["path"] == "$.version"


def test_start_failed_carries_its_exit_code() -> None:
    from crucible.core.errors import StartFailed

    assert StartFailed("cannot start 'nope'", usage=True).exit_code == 2
    assert StartFailed("cannot start 'x': EIO", usage=False).exit_code == 3

    class CannotStart(StartFailed):  # as ledger's runner can declare it
        pass

    exc = CannotStart("cannot start 'nope'", usage=True)
    assert isinstance(exc, CrucibleError) and exc.usage and exc.code == "cannot-start"

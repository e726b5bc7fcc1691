"""docs/schemas/ledger-record.json describes what the library writes.

jsonschema is not a dependency, so a small validator for exactly the keywords the
schema uses checks real lines against it; an unknown keyword fails the test, so
the schema cannot grow beyond what is checked here.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from crucible.ledger import Ledger, Outcome
from crucible.ledger.commands import StepRunOptions, run_run

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "docs" / "schemas" / "ledger-record.json"
ANNOTATIONS = {"$schema", "$id", "title", "description", "$defs", "contentEncoding"}
TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "boolean": bool,
}


def errors(value: Any, schema: dict[str, Any], root: dict[str, Any], path: str = "$") -> list[str]:
    out: list[str] = []
    for keyword, arg in schema.items():
        if keyword in ANNOTATIONS or keyword in {"properties", "additionalProperties"}:
            continue
        if keyword == "$ref":
            target = root
            for part in arg.removeprefix("#/").split("/"):
                target = target[part]
            out += errors(value, target, root, path)
        elif keyword == "type":
            ok = isinstance(value, TYPES[arg]) and not (
                arg == "integer" and isinstance(value, bool)
            )
            out += [] if ok else [f"{path}: not {arg}"]
        elif keyword == "required":
            out += [
                f"{path}: missing {k}" for k in arg if isinstance(value, dict) and k not in value
            ]
        elif keyword == "const":
            out += [] if value == arg else [f"{path}: not {arg!r}"]
        elif keyword == "enum":
            out += [] if value in arg else [f"{path}: not in {arg}"]
        elif keyword == "pattern":
            ok = isinstance(value, str) and re.search(arg, value) is not None
            out += [] if ok else [f"{path}: does not match {arg}"]
        elif keyword == "minLength":
            out += [] if isinstance(value, str) and len(value) >= arg else [f"{path}: too short"]
        elif keyword in ("minimum", "maximum"):
            ok = value >= arg if keyword == "minimum" else value <= arg
            out += [] if ok else [f"{path}: out of range"]
        elif keyword == "minItems":
            out += [] if len(value) >= arg else [f"{path}: too few items"]
        elif keyword == "items":
            for i, item in enumerate(value):
                out += errors(item, arg, root, f"{path}[{i}]")
        elif keyword == "propertyNames":
            for name in value:
                out += errors(name, arg, root, f"{path}.{name}(name)")
        elif keyword == "allOf":
            for sub in arg:
                out += errors(value, sub, root, path)
        elif keyword == "if":  # then applies where if holds (a command step's key)
            if not errors(value, arg, root, path):
                out += errors(value, schema.get("then", {}), root, path)
        elif keyword == "then":
            continue
        elif keyword == "oneOf":
            passing = sum(1 for sub in arg if not errors(value, sub, root, path))
            out += [] if passing == 1 else [f"{path}: {passing} of oneOf match"]
        else:
            raise AssertionError(f"schema keyword {keyword!r} is not checked by this test")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for name, item in value.items():
            if name in props:
                out += errors(item, props[name], root, f"{path}.{name}")
            elif schema.get("additionalProperties") is False:
                out.append(f"{path}: unexpected {name}")
            elif isinstance(schema.get("additionalProperties"), dict):
                out += errors(item, schema["additionalProperties"], root, f"{path}.{name}")
    return out


@pytest.fixture
def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    assert loaded["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    return loaded


def test_written_lines_match_the_schema(
    ledger_dir: Path, schema: dict[str, Any], tmp_path: Path
) -> None:
    import io

    with Ledger(ledger_dir) as ledger:
        ledger.record("s", "plain", Outcome.ok({"any": [1, "json", None]}))
        ledger.record("s", "failed", Outcome.failed("compile error"))
    keyfile = tmp_path / "k"
    keyfile.write_bytes(b"x")
    for code in ("print('hi')", "import sys; sys.stdout.buffer.write(b'\\xff'); sys.exit(3)"):
        options = StepRunOptions(
            str(ledger_dir), "s", ("A=1",), (str(keyfile),), (3,), (sys.executable, "-c", code)
        )
        run_run(options, io.BytesIO(), io.TextIOWrapper(io.BytesIO()), warn=lambda _m: None)
    lines = (ledger_dir / "steps.jsonl").read_bytes().splitlines()
    assert len(lines) == 4
    for line in lines:
        assert errors(json.loads(line), schema, schema) == []
    for line in lines[2:]:
        record = json.loads(line)["r"]
        assert errors(record["key"], schema["$defs"]["commandKey"], schema) == []
        assert errors(record["value"], schema["$defs"]["commandValue"], schema) == []


@pytest.mark.parametrize(
    "mutate",
    [
        lambda line: line.update(c="XYZ"),
        lambda line: line["r"].update(v=2),
        lambda line: line["r"].update(status="maybe"),
        lambda line: line["r"].update(scope=""),
        lambda line: line["r"].pop("value"),
        lambda line: line.update(extra=1),
    ],
)
def test_schema_refuses_what_readers_refuse(
    ledger_dir: Path, schema: dict[str, Any], mutate: Any
) -> None:
    with Ledger(ledger_dir) as ledger:
        ledger.record("s", "x", Outcome.ok(1))
    line = json.loads((ledger_dir / "steps.jsonl").read_bytes())
    mutate(line)
    assert errors(line, schema, schema) != []

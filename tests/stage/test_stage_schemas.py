"""The records and indexes stage writes match docs/schemas (draft 2020-12).

Without jsonschema installed, a structural check (members known to the schema,
required members present) still runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from crucible.stage import StateDir
from tests.stage.stageplans import plan, settle, task

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"


def _schema(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((SCHEMAS / name).read_text())
    return schema


def _structural(value: dict[str, Any], schema: dict[str, Any], root: dict[str, Any]) -> None:
    if "$ref" in schema:
        schema = root["$defs"][schema["$ref"].split("/")[-1]]
    props = schema.get("properties", {})
    assert set(schema.get("required", [])) <= set(value), (schema.get("required"), value)
    assert set(value) <= set(props), set(value) - set(props)
    for k, v in value.items():
        sub = props[k]
        if "$ref" in sub:
            sub = root["$defs"][sub["$ref"].split("/")[-1]]
        if isinstance(v, dict) and "properties" in sub:
            _structural(v, sub, root)
        if isinstance(v, list) and isinstance(sub.get("items"), dict):
            items = sub["items"]
            for x in v:
                if isinstance(x, dict):
                    _structural(x, items, root)


def _check(value: dict[str, Any], name: str) -> None:
    schema = _schema(name)
    _structural(value, schema, schema)
    try:
        import jsonschema
    except ImportError:
        return
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(value)


def _records_and_index(state: Path, ws: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    p = plan(
        task("src", emits={"xs": "array", "blob": "string"}, emits_files=["f"]),
        task("m", needs=["src"], map="src.xs", emits={"v": "integer"}),
        task("s"),
        task(
            "c",
            needs=["src", "m", "s"],
            join="settled",
            inputs={"xs": "src.xs", "vs": "m.v"},
            epilogue=True,
        ),
        version=2,
    )
    recs = [
        settle(
            p,
            state,
            "src",
            {"xs": [1, 2], "blob": "x" * 50, "u": 1},
            files={"f": b"f"},
            emit_cap=10,
        )
    ]
    # the cap failed src; settle it again under a larger cap so m can map
    recs.append(settle(p, state, "src", {"xs": [1, 2], "blob": "x", "u": 1}, files={"f": b"f"}))
    recs.append(settle(p, state, "m", {"v": 1}, key="0"))
    recs.append(settle(p, state, "m", {"v": "bad"}, key="1", exit_code=2))
    recs.append(StateDir(p, state).settle_fold("m", ["0", "1"]))
    recs.append(StateDir(p, state).record_settled("s", status="skipped", note="n", extra={"a": 1}))
    staged = StateDir(p, state).stage_inputs("c", ws)
    assert staged.index is not None
    return recs, staged.index


def test_records_match_schema(state: Path, ws: Path) -> None:
    recs, _ = _records_and_index(state, ws)
    assert recs[0]["over_cap"]  # the measured failure is among them
    for rec in recs:
        _check(rec, "result-record.json")


def test_index_matches_schema(state: Path, ws: Path) -> None:
    _, index = _records_and_index(state, ws)
    assert any(e["fold"] for e in index["inputs"])
    _check(index, "inputs-index.json")


def test_schema_rejects_a_wrong_record() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    bad = {
        "format": "crucible.result/1",
        "task": "t",
        "status": "done",
        "note": "",
        "retryable": False,
    }
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(_schema("result-record.json")).validate(bad)

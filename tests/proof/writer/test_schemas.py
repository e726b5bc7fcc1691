"""The JSON Schemas in docs/schemas/ describe what the writer really writes.

jsonschema is not a dependency, so a small validator for the draft 2020-12 subset the
schemas use lives here; it is itself tested against counterexamples.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crucible.core import canon
from tests.proof.writer.prove_helpers import read_tree

REPO = Path(__file__).resolve().parents[3]
SCHEMAS = REPO / "docs" / "schemas"
VECTORS = REPO / "tests" / "vectors" / "proof"
_TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "null": type(None),
    "boolean": bool,
}


def valid(value: Any, schema: dict[str, Any], root: dict[str, Any]) -> bool:
    if "$ref" in schema:
        return valid(value, root["$defs"][schema["$ref"].split("/")[-1]], root)
    if "oneOf" in schema and sum(valid(value, s, root) for s in schema["oneOf"]) != 1:
        return False
    if "const" in schema and not (
        value == schema["const"] and type(value) is type(schema["const"])
    ):
        return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    t = schema.get("type")
    if t == "integer":
        if type(value) is not int:
            return False
    elif t is not None and type(value) is not _TYPES[t]:
        return False
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            return False
        if not schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", 1 << 60):
            return False
    if type(value) is int and not (
        schema.get("minimum", -(1 << 60)) <= value <= schema.get("maximum", 1 << 60)
    ):
        return False
    if isinstance(value, list):
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", 1 << 60):
            return False
        if schema.get("uniqueItems") and len({canon.dumps(v) for v in value}) != len(value):
            return False
        if "items" in schema and not all(valid(v, schema["items"], root) for v in value):
            return False
    if isinstance(value, dict):
        props = schema.get("properties", {})
        if any(r not in value for r in schema.get("required", [])):
            return False
        for k, v in value.items():
            if k in props:
                if not valid(v, props[k], root):
                    return False
            elif schema.get("additionalProperties") is False or (
                isinstance(schema.get("additionalProperties"), dict)
                and not valid(v, schema["additionalProperties"], root)
            ):
                return False
            if "propertyNames" in schema and not valid(k, schema["propertyNames"], root):
                return False
    return True


def schema(name: str) -> dict[str, Any]:
    return canon.loads((SCHEMAS / name).read_bytes())  # type: ignore[no-any-return]


def schema_for(rel: str) -> str | None:
    table = [
        (r"^workflow\.json$", "workflow.json"),
        (r"^frozen/[^/]+\.json$", "frozen-stage.json"),
        (r"^execution\.json$", "execution.json"),
        (r"^sets/[^/]+\.json$", "set.json"),
        (r"^selections/[^/]+/\d+\.json$", "selection.json"),
        (r"^instances/(?!r/)[^/]+/case\.json$", "case.json"),
        (r"\.payload\.json$", "payload.json"),
        (r"\.envelope\.json$", "envelope.json"),
        (r"^admission-proof\.json$", "admission-proof.json"),
        (r"^partial\.json$", "partial.json"),
    ]
    return next((s for pattern, s in table if re.search(pattern, rel)), None)


def test_every_schema_is_draft_2020_12() -> None:
    for path in SCHEMAS.glob("*.json"):
        doc = canon.loads(path.read_bytes())
        assert doc["$schema"] == "https://json-schema.org/draft/2020-12/schema", path


@pytest.mark.parametrize(
    "case",
    sorted(p.name for p in VECTORS.iterdir() if p.is_dir() and not p.name.startswith("mut-")),
)
def test_vector_files_match_their_schemas(case: str) -> None:
    files = read_tree(VECTORS / case / "bundle")
    checked = 0
    for rel, data in files.items():
        name = schema_for(rel)
        if name is None:
            continue
        s = schema(name)
        assert valid(canon.loads(data), s, s), f"{case}/{rel} does not match {name}"
        checked += 1
    assert checked >= 8
    op_schema = schema("operation.json")
    for line in (VECTORS / case / "operations.ndjson").read_bytes().splitlines():
        assert valid(canon.loads(line), op_schema, op_schema), line
    custody = VECTORS / case / "bundle.custody" / "custody.json"
    if custody.exists():
        s = schema("custody.json")
        assert valid(canon.loads(custody.read_bytes()), s, s)


def test_validator_rejects_counterexamples() -> None:
    s = schema("execution.json")
    good = canon.loads((VECTORS / "complete" / "bundle" / "execution.json").read_bytes())
    assert valid(good, s, s)
    mutations: tuple[Callable[[Any], object], ...] = (
        lambda e: e.update(extra=1),
        lambda e: e.update(executionVersion=1),
        lambda e: e["instances"][0].update(state="done"),
        lambda e: e.update(admissionProofDigest="sha256:XYZ"),
        lambda e: e.pop("frozen"),
    )
    for mutate in mutations:
        bad = canon.loads(canon.dumps(good))
        mutate(bad)
        assert not valid(bad, s, s)
    op = schema("operation.json")
    assert not valid(
        {"op": "retry", "instance": "../x", "actor": "a", "at": "2026-01-01T00:00:00Z"}, op, op
    )
    assert valid({"op": "recover"}, op, op)

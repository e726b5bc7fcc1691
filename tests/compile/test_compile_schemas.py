"""The JSON Schemas in docs/schemas/ agree with the code and accept what compile writes."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from crucible.compile import compile_path
from crucible.compile._editions import PLAN_TASK_KEYS, TYPES, known_task_keys

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "docs" / "schemas"
MANIFESTS = sorted(
    [*REPO.glob("examples/*/pack.toml"), *REPO.glob("tests/compile/packs/*/pack.toml")]
)


def schema(name: str) -> dict[str, Any]:
    return json.loads((SCHEMAS / name).read_text())  # type: ignore[no-any-return]


def test_schema_keys_match_the_code() -> None:
    manifest = schema("manifest.json")
    for edition in (1, 2, 3, 4):
        props = set(manifest["$defs"][f"task{edition}"]["properties"])
        assert props == known_task_keys(edition)
    for version, editions in ((1, (1, 2)), (2, (3,)), (3, (4,))):
        plan = schema(f"plan-v{version}.json")
        assert plan["properties"]["version"] == {"const": version}
        for edition in editions:
            props = set(plan["$defs"][f"task{edition}"]["properties"])
            assert props == known_task_keys(edition) & PLAN_TASK_KEYS[version]
        assert plan["$defs"]["param"]["properties"]["type"]["enum"] == list(TYPES)


@pytest.fixture(scope="module")
def validator() -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    return jsonschema.Draft202012Validator


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.parent.name for p in MANIFESTS])
def test_every_pack_matches_the_schemas(validator: Any, path: Path) -> None:
    validator(schema("manifest.json")).validate(tomllib.loads(path.read_text()))
    plan = compile_path(path).plan
    validator(schema(f"plan-v{plan['version']}.json")).validate(plan)


@pytest.mark.parametrize(
    "doc",
    [
        {"workflow": {"name": "w", "task": [{"name": "a", "run": "x", "colour": 1}]}},
        {
            "edition": 2,
            "workflow": {"name": "w", "task": [{"name": "a", "run": "x", "inputs": {}}]},
        },
        {"workflow": {"name": "w", "task": [{"name": "a", "run": "x", "env": []}]}},
        {"edition": 5, "workflow": {"name": "w", "task": [{"name": "a", "run": "x"}]}},
        {"workflow": {"name": "w", "task": [{"name": "../a", "run": "x"}]}},
        {"workflow": {"name": "w", "task": [{"name": "params", "run": "x"}]}},
        {"workflow": {"name": "w", "task": [{"name": "a", "kind": "agent", "run": "x"}]}},
        {"workflow": {"name": "w", "task": [{"name": "a"}]}},
        {"workflow": {"source": "p.star", "name": "w"}},
        {"workflow": {"source": "../p.star"}},
        {"extra": 1, "workflow": {"source": "p.star"}},
    ],
)
def test_manifest_schema_refuses(validator: Any, doc: dict[str, Any]) -> None:
    assert not validator(schema("manifest.json")).is_valid(doc)


def test_plan_schema_refuses(validator: Any) -> None:
    plan = compile_path(REPO / "tests/compile/packs/v2-inputs/pack.toml").plan
    v2 = validator(schema("plan-v2.json"))
    v1 = validator(schema("plan-v1.json"))
    assert v2.is_valid(plan) and not v1.is_valid(plan)
    as_v1 = {**plan, "version": 1, "edition": 2}
    assert not v1.is_valid(as_v1)  # inputs are not a v1 member
    for task in as_v1["tasks"]:
        task.pop("inputs", None)
    assert v1.is_valid(as_v1)
    assert not v1.is_valid({**as_v1, "edition": 3})
    assert not v1.is_valid({**as_v1, "extra": 1})

"""The session log's vocabulary (crucible.run.session.events) is the schema's:
the same kinds, members, required members and JSON types; each constructor
builds an event the schema accepts; the report's reader checks with the same
table."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from crucible.run.report import _state
from crucible.run.session import events

SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "docs" / "schemas" / "session-event.json").read_text()
)
BRANCHES = {b["if"]["properties"]["event"]["const"]: b["then"] for b in SCHEMA["allOf"]}
CONSTRUCTORS = {kind: getattr(events, kind) for kind in events.KINDS}


def _json_types(spec: dict[str, Any]) -> set[str]:
    """The JSON types a member's schema admits."""
    if "type" in spec:
        t = spec["type"]
        return set(t) if isinstance(t, list) else {t}
    values = [spec["const"]] if "const" in spec else spec["enum"]
    names = {bool: "boolean", int: "integer", float: "number", str: "string"}
    return {names[type(v)] for v in values}


def test_the_kinds_are_the_schemas() -> None:
    assert set(events.KINDS) == set(SCHEMA["properties"]["event"]["enum"]) == set(BRANCHES)


@pytest.mark.parametrize("kind", events.KINDS)
def test_members_required_and_types_are_the_schemas(kind: str) -> None:
    branch = BRANCHES[kind]
    assert set(events.MEMBERS[kind]) == set(branch["properties"])
    assert set(events.REQUIRED[kind]) == set(branch.get("required", ()))
    for name, types in events.MEMBERS[kind].items():
        assert set(types) == _json_types(branch["properties"][name]), name


@pytest.mark.parametrize("kind", events.KINDS)
def test_each_constructor_takes_its_members(kind: str) -> None:
    params = set(inspect.signature(CONSTRUCTORS[kind]).parameters) - {"measured"}
    assert params <= set(events.MEMBERS[kind])
    assert set(events.REQUIRED[kind]) <= params


SAMPLES: dict[str, dict[str, Any]] = {
    "plan_admitted": {
        "plan_version": 3, "edition": 4, "workflow": "w", "digest": "sha256:" + "0" * 64,
        "resume": False, "jobs": 2, "emit_cap": 1024,
        "tasks": [{"name": "a", "kind": "command", "needs": [], "inputs": {}}],
    },
    "task_started": {"task": "a", "key": "k", "attempt": 1, "pid": 42, "workspace": "work/a"},
    "task_finished": {
        "task": "a", "status": "failed", "note": "exit 1", "attempt": 1, "exit_code": 1,
        "duration": 0.5, "retry": True,
        "measured": {"output_bytes": 3, "cpu_user_s": None, "max_rss_kib": 100, "cached": True},
    },
    "run_finished": {
        "status": "passed", "duration": 1.0, "max_rss_kib": 10,
        "counts": {"tasks": 1, "units": 1, "passed": 1, "failed": 0, "skipped": 0},
    },
    "shutdown": {"reason": "signal", "signal": "SIGINT", "exit_code": 130},
    "revision_started": {"revision": 1},
    "revision_finished": {
        "revision": 1, "score": 0.5, "verdict": "improved", "kept": True, "reason": "first",
        "duration_ms": 12,
    },
    "loop_finished": {
        "stop_reason": "target", "revisions": 1, "kept_revision": 1, "best_score": 0.5,
    },
    "temp_freed": {"task": "a", "files": 2, "bytes": 10},
}  # fmt: skip


@pytest.mark.parametrize("kind", events.KINDS)
def test_each_constructor_builds_what_the_schema_accepts(kind: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    built = CONSTRUCTORS[kind](**SAMPLES[kind])
    assert built.kind == kind
    line = {"event": kind, "session": 1, "time": "2026-01-01T00:00:00.000Z"}
    line.update({k: v for k, v in built.members.items() if v is not None})
    jsonschema.validate(line, SCHEMA)


def test_task_finished_refuses_a_member_the_schema_does_not_have() -> None:
    with pytest.raises(ValueError, match="no member 'exit'"):
        events.task_finished(task="a", status="passed", note=None, measured={"exit": 0})


def test_the_report_checks_with_the_writers_table() -> None:
    for kind, checked in _state._OPTIONAL.items():
        for name, types in checked.items():
            assert events.MEMBERS[kind].get(name, types) == types, (kind, name)

"""The walker behind the end-of-session schema check (tests/schemas/plugin.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.schemas import plugin, walker


def state_dir(root: Path) -> Path:
    state = root / "state"
    (state / "results" / "m").mkdir(parents=True)
    plan = {
        "version": 1,
        "edition": 1,
        "workflow": {"name": "w", "params": {}},
        "tasks": [
            {
                "name": "a",
                "kind": "command",
                "needs": [],
                "join": "all",
                "emits": {},
                "emits_files": [],
                "retries": 0,
                "epilogue": False,
                "run": "true",
            }
        ],
    }
    (state / "plan.json").write_text(json.dumps(plan))
    (state / "params.json").write_text("{}")
    event = {"event": "shutdown", "session": 1, "time": "2026-12-01T00:00:00.000Z"}
    event |= {"reason": "completed", "exit_code": 0}
    # a torn last line is what a crash leaves: readers skip it, so does the walker
    (state / "session.jsonl").write_text(json.dumps(event) + "\n" + '{"event": "tas')
    record = {"format": "crucible.result/1", "task": "a", "status": "passed", "note": ""}
    (state / "results" / "a.json").write_text(json.dumps(record | {"retryable": False}))
    (state / "results" / "m" / "k.json").write_text(json.dumps(record | {"retryable": False}))
    (state / "results" / "@tmp-1.json").write_text("not json: a temporary is not checked")
    return state


def messages(root: Path) -> list[str]:
    return [p.message for p in walker.check_tree([root])[1]]


def test_a_sound_state_dir_has_no_problem(tmp_path: Path) -> None:
    state = state_dir(tmp_path)
    kinds = sorted(str(f.schema) for f in walker.walk(tmp_path))
    assert kinds == [
        "params.json",
        "plan",
        "result-record.json",
        "result-record.json",
        "session-event.json",
    ]
    assert messages(tmp_path) == []
    assert walker.classify(state / "results" / "a.json") is not None


def test_a_file_off_its_schema_is_named(tmp_path: Path) -> None:
    state = state_dir(tmp_path)
    (state / "results" / "m" / "k.json").write_text('{"format": "crucible.result/1"}')
    (state / "params.json").write_text('{"bad name": 1}')
    problems = walker.check_tree([tmp_path])[1]
    assert sorted(p.path.name for p in problems) == ["k.json", "params.json"]
    assert any("'task' is a required property" in p.message for p in problems)
    shutil.rmtree(state)  # not for the end-of-session walk to find again


def test_an_unknown_state_file_is_a_problem_until_it_has_a_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = state_dir(tmp_path)
    (state / "novel.json").write_text("{}")
    assert messages(tmp_path) == ["a state file no schema names"]
    (state / "novel.json").unlink()
    (state / "loop.json").write_text("{}")
    monkeypatch.setattr(walker, "PENDING", {"loop.json": "no-such-schema.json"})
    assert messages(tmp_path) == []  # allowed, by name, while its schema is not written
    monkeypatch.setattr(walker, "PENDING", {"loop.json": "instances.json"})
    assert len(messages(tmp_path)) == 1  # once it exists, it is checked
    shutil.rmtree(state)


def test_the_plugin_leaves_out_only_the_tests_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plugin, "EXEMPT", {"tests/x/test_fuzz.py::": "corrupts state on purpose"})
    assert plugin.exempt_reason("tests/x/test_fuzz.py::test_one[3]") == "corrupts state on purpose"
    assert plugin.exempt_reason("tests/x/test_other.py::test_one") is None
    monkeypatch.setattr(plugin, "_owners", {str(tmp_path / "test_one0"): "tests/a.py::test_one"})
    assert (
        plugin.owner_of(tmp_path / "test_one0" / "s" / "plan.json", tmp_path)
        == "tests/a.py::test_one"
    )
    assert plugin.owner_of(tmp_path / "big-passed0" / "f", tmp_path) == "fixture:big-passed0"
    assert plugin.exempt_reason("fixture:big-passed0") is None  # the patched EXEMPT


def test_every_exemption_names_a_test_that_exists() -> None:
    """An entry outliving its test would hide the next test of that name."""
    repo = Path(__file__).resolve().parents[2]
    for owner in plugin.EXEMPT:
        if owner.startswith("fixture:"):
            continue
        path, _, name = owner.partition("::")
        text = (repo / path).read_text()
        assert f"def {name}" in text, owner


def test_a_kept_stdout_is_checked_by_its_name(tmp_path: Path) -> None:
    golden = Path(__file__).resolve().parents[1] / "cli/golden/probe.json"
    kept = tmp_path / "prove-probe.stdout.json"
    kept.write_bytes(golden.read_bytes())
    assert [str(f.schema) for f in walker.walk(tmp_path)] == ["prove-probe.json"]
    assert messages(tmp_path) == []
    kept.write_text('{"probeVersion": 1}')
    assert len(messages(tmp_path)) == 1
    kept.unlink()
    (tmp_path / "no-such-output.stdout.json").write_text("{}")
    assert messages(tmp_path) == ["a kept stdout no schema names (no-such-output.json)"]
    (tmp_path / "no-such-output.stdout.json").unlink()

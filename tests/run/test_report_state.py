"""``report`` on damaged, hand-edited and hostile state (issue 12 items 18, 19):
every state file is read through its schema, a bad value is one ``file:line:
message`` line and exit 2 (never 70, never a hang), in every output mode."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crucible.core import canon
from tests.run.dispatchtests import DISPATCH

REPO = Path(__file__).resolve().parents[2]
HELLO = REPO / "examples" / "hello" / "pack.toml"
MODES: list[tuple[str, ...]] = [(), ("--json",), ("--html", "{tmp}/t.html")]


@pytest.fixture(scope="module")
def hello_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    state = tmp_path_factory.mktemp("hello") / "s"
    done = subprocess.run(
        [DISPATCH, str(HELLO), "--state", str(state)], capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return state


@pytest.fixture
def state(hello_state: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "s"
    shutil.copytree(hello_state, copy, symlinks=True)
    return copy


def report(state: Path, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DISPATCH, "report", str(state), *argv], capture_output=True, text=True, timeout=timeout
    )


def _lines(state: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (state / "session.jsonl").read_bytes().splitlines()]


def _write_lines(state: Path, lines: list[dict[str, Any]]) -> None:
    (state / "session.jsonl").write_bytes(b"".join(canon.dumps(x) + b"\n" for x in lines))


def _first(lines: list[dict[str, Any]], kind: str) -> int:
    return next(i for i, x in enumerate(lines) if x["event"] == kind)


def _event_damage(name: str) -> Callable[[list[dict[str, Any]]], int]:
    """Damage one line in place; return its 0-based index."""

    def damage(lines: list[dict[str, Any]]) -> int:
        i = _first(lines, "task_finished")
        if name == "time":
            lines[i]["time"] = "garbage"
        elif name == "date":
            lines[i]["time"] = "2026-13-45T99:00:00.000Z"
        elif name == "duration":
            lines[i]["duration"] = "x"
        elif name == "key":
            lines[i]["key"] = 5
        elif name == "session":
            del lines[i]["session"]
        elif name == "status":
            lines[i]["status"] = 7
        elif name == "attempt":
            i = _first(lines, "task_started")
            lines[i]["attempt"] = "one"
        elif name == "task":
            i = _first(lines, "task_started")
            lines[i]["task"] = None
        return i

    return damage


EVENT_DAMAGE = ["time", "date", "duration", "key", "session", "status", "attempt", "task"]


def _assert_refused(done: subprocess.CompletedProcess[str], where: str, tmp: Path) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert where in lines[0], lines[0]
    assert done.stdout == ""
    assert not (tmp / "t.html").exists()


@pytest.mark.parametrize("mode", MODES, ids=["table", "json", "html"])
@pytest.mark.parametrize("damage", EVENT_DAMAGE)
def test_damaged_session_line_is_one_line_exit_2(
    state: Path, tmp_path: Path, damage: str, mode: tuple[str, ...]
) -> None:
    lines = _lines(state)
    index = _event_damage(damage)(lines)
    _write_lines(state, lines)
    done = report(state, *(a.format(tmp=tmp_path) for a in mode))
    _assert_refused(done, f"session.jsonl:{index + 1}: ", tmp_path)


def _record_damage(name: str, record: dict[str, Any]) -> str:
    if name == "note-int":
        record["note"] = 5
        return "$.note"
    if name == "no-note":
        del record["note"]
        return "'note'"
    if name == "status":
        record["status"] = "bogus"
        return "$.status"
    if name == "format":
        record["format"] = "other/9"
        return "$.format"
    if name == "log":
        record["log"] = ["x"]
        return "$.log"
    if name == "stderr-tail":
        record["stderr_tail"] = 3
        return "$.stderr_tail"
    if name == "task":
        record["task"] = "shout"
        return "not 'greet'"
    raise AssertionError(name)


RECORD_DAMAGE = ["note-int", "no-note", "status", "format", "log", "stderr-tail", "task"]


@pytest.mark.parametrize("mode", MODES, ids=["table", "json", "html"])
@pytest.mark.parametrize("damage", RECORD_DAMAGE)
def test_damaged_result_record_is_one_line_exit_2(
    state: Path, tmp_path: Path, damage: str, mode: tuple[str, ...]
) -> None:
    path = state / "results" / "greet.json"
    record = json.loads(path.read_bytes())
    needle = _record_damage(damage, record)
    path.write_bytes(canon.dumps(record))
    done = report(state, *(a.format(tmp=tmp_path) for a in mode))
    _assert_refused(done, "results/greet.json", tmp_path)
    assert needle in done.stderr


@pytest.mark.parametrize(
    ("name", "content", "where"),
    [
        ("session.jsonl", b'{"event": "plan_admitted"\n{}\n', "session.jsonl:1: "),
        ("session.jsonl", b"[1, 2]\n", "session.jsonl:1: "),
        ("plan.json", b"{not json", "plan.json: "),
        ("plan.json", b'{"tasks": 5}', "plan.json: "),
        # the plan model's refusals, located by their JSON path
        ("plan.json", b'{"version": 2, "tasks": [{"name": 3}]}', "plan.json:$.tasks[0].name: "),
        ("plan.json", b'{"tasks": []}', "plan.json:$.version: "),
        (
            "plan.json",
            b'{"version": 3, "tasks": [{"name": "a", "kind": "command", "resources": {"cpus": "2"}}]}',
            "plan.json:$.tasks[0].resources.cpus: ",
        ),
        ("results/greet.json", b"\xff\xfe", "greet.json: "),
    ],
)
def test_unparseable_state_files(
    state: Path, tmp_path: Path, name: str, content: bytes, where: str
) -> None:
    (state / name).write_bytes(content)
    for mode in MODES:
        _assert_refused(report(state, *(a.format(tmp=tmp_path) for a in mode)), where, tmp_path)


def test_a_torn_last_line_is_ignored(state: Path) -> None:
    with (state / "session.jsonl").open("ab") as f:
        f.write(b'{"event": "task_started", "sess')
    done = report(state)
    assert done.returncode == 0, done.stderr


def test_unknown_event_kinds_are_skipped(state: Path) -> None:
    lines = _lines(state)
    lines.insert(1, {"event": "revision_started", "session": 1, "time": lines[0]["time"]})
    _write_lines(state, lines)
    assert report(state).returncode == 0


@pytest.mark.parametrize("name", ["session.jsonl", "results/greet.json", "plan.json"])
def test_a_fifo_is_refused_without_waiting(state: Path, tmp_path: Path, name: str) -> None:
    path = state / name
    path.unlink()
    os.mkfifo(path)
    done = report(state, timeout=20)
    _assert_refused(done, name, tmp_path)
    assert "not a regular file (a FIFO)" in done.stderr


@pytest.mark.parametrize("name", ["session.jsonl", "results/greet.json", "plan.json"])
def test_a_symlink_is_not_followed(state: Path, tmp_path: Path, name: str) -> None:
    path = state / name
    outside = tmp_path / "outside"
    outside.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(outside)
    done = report(state)
    _assert_refused(done, name, tmp_path)
    assert "symlink" in done.stderr


def test_a_directory_in_place_of_the_log(state: Path, tmp_path: Path) -> None:
    (state / "session.jsonl").unlink()
    (state / "session.jsonl").mkdir()
    done = report(state)
    _assert_refused(done, "session.jsonl", tmp_path)
    assert "a directory" in done.stderr


# -- the hand-written checks agree with the schemas ---------------------------------


def _schema(name: str) -> Any:
    return json.loads((REPO / "docs" / "schemas" / name).read_text())


@pytest.mark.parametrize("damage", [d for d in EVENT_DAMAGE if d != "date"])
def test_event_checks_refuse_what_the_schema_refuses(hello_state: Path, damage: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = _schema("session-event.json")
    lines = _lines(hello_state)
    for line in lines:  # the real run's events pass both
        jsonschema.validate(line, schema)
    index = _event_damage(damage)(lines)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(lines[index], schema)


@pytest.mark.parametrize("damage", [d for d in RECORD_DAMAGE if d != "task"])
def test_record_checks_refuse_what_the_schema_refuses(hello_state: Path, damage: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = _schema("result-record.json")
    record = json.loads((hello_state / "results" / "greet.json").read_bytes())
    jsonschema.validate(record, schema)
    _record_damage(damage, record)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(record, schema)

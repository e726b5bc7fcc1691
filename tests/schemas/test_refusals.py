"""Each schema refuses a sample of what its tool refuses (issue 11 item 10).

A table: the schema, a sample made from a sound document by one change, and
the tool that must refuse the same sample (compile/validate a manifest, load a
plan, the report's reading of a session event or a result record, the ledger's
record check, dispatch's params file). The sound documents are checked first,
by both the schema and the tool, so a refusal is the change's doing.
"""

from __future__ import annotations

import copy
import json
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from crucible.core import canon
from crucible.core.errors import CrucibleError
from tests.schemas.walker import first_error

LONG = "n" * 251  # one byte over the 250-byte identifier rule (core.contract.IDENT_MAX_BYTES)
TASK_LONG = "n" * 250  # one byte over the 249-byte task-name rule (core.contract.NAME_MAX_BYTES)

# -- sound documents ----------------------------------------------------------------


def manifest() -> dict[str, Any]:
    return {
        "edition": 4,
        "workflow": {
            "name": "w",
            "params": {"size": {"type": "integer", "default": 2}},
            "task": [
                {
                    "name": "a",
                    "run": ["true", "x"],
                    "emits": {"n": "integer"},
                    "emits_files": ["out/*.txt"],
                },
                {"name": "b", "kind": "agent", "prompt": "say hi", "needs": ["a"]},
            ],
        },
    }


def _toml_value(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: the same escapes for what we use
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    assert isinstance(value, dict)
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"


def to_toml(doc: dict[str, Any]) -> str:
    """The few shapes :func:`manifest` has, as TOML text."""
    lines = [f"edition = {doc['edition']}", "[workflow]"]
    workflow = doc["workflow"]
    for key, value in workflow.items():
        if key not in ("params", "task"):
            lines.append(f"{json.dumps(key)} = {_toml_value(value)}")
    for name, spec in workflow.get("params", {}).items():
        lines.append(f"[workflow.params.{json.dumps(name)}]")
        lines.extend(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in spec.items())
    for task in workflow["task"]:
        lines.append("[[workflow.task]]")
        lines.extend(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in task.items())
    return "\n".join(lines) + "\n"


def plan(edition: int) -> dict[str, Any]:
    from crucible.compile import compile_bytes

    doc = manifest()
    doc["edition"] = edition
    if edition < 4:
        del doc["workflow"]["task"][1]  # keep to keys every edition knows
    compiled = compile_bytes(to_toml(doc).encode(), "pack.toml", Path("."))
    return copy.deepcopy(compiled.plan)


def event() -> dict[str, Any]:
    return {
        "event": "task_finished",
        "session": 1,
        "time": "2026-12-01T00:00:00.000Z",
        "task": "a",
        "attempt": 1,
        "status": "passed",
        "note": "exited with status 0",
        "duration": 0.5,
    }


def record() -> dict[str, Any]:
    return {
        "format": "crucible.result/1",
        "task": "a",
        "status": "passed",
        "note": "exited with status 0",
        "retryable": False,
    }


def ledger_record() -> dict[str, Any]:
    at = "2026-12-01T00:00:00Z"
    return {"v": 1, "scope": "s", "step": "x", "status": "ok", "value": 1, "at": at}


# -- the tools' refusals --------------------------------------------------------------


def compile_refuses(doc: dict[str, Any], tmp: Path) -> str:
    """crucible-compile / validate: the diagnostic codes of the manifest."""
    from crucible.compile import ValidationFailed, compile_bytes

    try:
        compile_bytes(to_toml(doc).encode(), "pack.toml", tmp)
    except ValidationFailed as exc:
        return ",".join(sorted({d.code for d in exc.diagnostics}))
    return ""


def plan_refuses(doc: dict[str, Any], tmp: Path) -> str:
    """Every tool that loads a plan (dispatch, stage, validate PLAN)."""
    from crucible.compile import ValidationFailed, load_plan_bytes

    try:
        load_plan_bytes(canon.dumps(doc), "plan.json")
    except ValidationFailed as exc:
        return ",".join(sorted({d.code for d in exc.diagnostics}))
    return ""


def report_refuses_event(doc: dict[str, Any], tmp: Path) -> str:
    """crucible-dispatch report's reading of one session-log line."""
    from crucible.run.report._state import _check_event

    try:
        _check_event(doc, "session.jsonl:1")
    except CrucibleError as exc:
        return exc.message
    return ""


def report_refuses_record(doc: dict[str, Any], tmp: Path) -> str:
    """crucible-dispatch report's reading of results/a.json."""
    from crucible.run.report._state import load_record

    (tmp / "results").mkdir(exist_ok=True)
    (tmp / "results" / "a.json").write_bytes(json.dumps(doc).encode())
    try:
        load_record(tmp, "a", None)
    except CrucibleError as exc:
        return exc.message
    return ""


def ledger_refuses(doc: dict[str, Any], tmp: Path) -> str:
    """crucible-ledger verify (and every reader): the record check."""
    from crucible.ledger._record import check_record

    return check_record(doc) or ""


def params_refuse(doc: Any, tmp: Path) -> str:
    """crucible-dispatch --params FILE / STATE/params.json on resume."""
    from crucible.run.session._params import read_params_file

    path = tmp / "params.json"
    path.write_bytes(json.dumps(doc).encode())
    try:
        read_params_file(str(path))
    except CrucibleError as exc:
        return exc.message
    return ""


# -- the table ------------------------------------------------------------------------

Tool = Callable[[Any, Path], str]


@dataclass(frozen=True)
class Case:
    id: str
    schema: str | Callable[[Any], str]
    sound: Callable[[], Any]
    change: Callable[[Any], None]
    tool: Tool
    refusal: str  # what the tool's refusal says (a code or a part of the message)


def _task(n: int, **changes: Any) -> Callable[[Any], None]:
    def change(doc: Any) -> None:
        doc["workflow"]["task"][n].update(changes)

    return change


def _plan_task(n: int, **changes: Any) -> Callable[[Any], None]:
    def change(doc: Any) -> None:
        doc["tasks"][n].update(changes)

    return change


def _set(**changes: Any) -> Callable[[Any], None]:
    return lambda doc: doc.update(changes)


def _drop(key: str) -> Callable[[Any], None]:
    return lambda doc: doc.pop(key)


def _workflow(**changes: Any) -> Callable[[Any], None]:
    return lambda doc: doc["workflow"].update(changes)


def _param(name: str) -> Callable[[Any], None]:
    return lambda doc: doc["workflow"].update({"params": {name: {"type": "integer"}}})


def _plan_schema(doc: Any) -> str:
    return f"plan-v{doc['version']}.json"


def _manifest(cid: str, change: Callable[[Any], None], code: str) -> Case:
    return Case(cid, "manifest.json", manifest, change, compile_refuses, code)


def _plan(version: int, cid: str, change: Callable[[Any], None], code: str) -> Case:
    edition = {1: 2, 2: 3, 3: 4}[version]
    return Case(
        f"plan-v{version}-{cid}", _plan_schema, partial(plan, edition), change, plan_refuses, code
    )


def _event(cid: str, change: Callable[[Any], None], what: str) -> Case:
    return Case(cid, "session-event.json", event, change, report_refuses_event, what)


def _record(cid: str, change: Callable[[Any], None], what: str) -> Case:
    return Case(cid, "result-record.json", record, change, report_refuses_record, what)


def _ledger(cid: str, change: Callable[[Any], None], what: str) -> Case:
    return Case(
        cid, "ledger-record.json#/$defs/record", ledger_record, change, ledger_refuses, what
    )


_PLAN_CHANGES: list[tuple[str, Callable[[Any], None], str]] = [
    ("name-250-bytes", _plan_task(0, name=TASK_LONG), "name-too-long"),
    ("run-nul", _plan_task(0, run=["a\x00"]), "bad-value"),
    ("run-program-empty", _plan_task(0, run=[""]), "bad-value"),
    ("files-backslash", _plan_task(0, emits_files=["a\\b"]), "bad-path"),
    ("emits-name-251", _plan_task(0, emits={LONG: "any"}), "bad-name"),
    ("workflow-name-blank", _workflow(name=" "), "bad-value"),
    ("unknown-member", _plan_task(0, colour="red"), "unknown-key"),
]

CASES = [
    # manifest.json, as compile and validate refuse
    _manifest("name-250-bytes", _task(0, name=TASK_LONG), "name-too-long"),
    _manifest("run-nul", _task(0, run=["true", "a\x00b"]), "bad-value"),
    _manifest("run-nul-shell", _task(0, run="echo \x00"), "bad-value"),
    _manifest("run-program-empty", _task(0, run=["", "x"]), "bad-value"),
    _manifest("run-blank", _task(0, run="  "), "bad-value"),
    _manifest("files-backslash", _task(0, emits_files=["a\\b"]), "bad-path"),
    _manifest("files-dotdot", _task(0, emits_files=["a/../../b"]), "bad-path"),
    _manifest("files-nul", _task(0, emits_files=["a\x00"]), "bad-path"),
    _manifest("files-absolute", _task(0, emits_files=["/etc"]), "bad-path"),
    _manifest("emits-name-251", _task(0, emits={LONG: "string"}), "bad-name"),
    _manifest("prompt-blank", _task(1, prompt=" \t "), "bad-value"),
    _manifest("workflow-name-blank", _workflow(name="   "), "bad-value"),
    _manifest("param-name-251", _param(LONG), "bad-name"),
    _manifest("unknown-key", _task(0, colour="red"), "unknown-key"),
    # plans of each IR version, as every tool that loads one refuses
    *(_plan(v, cid, change, code) for v in (1, 2, 3) for cid, change, code in _PLAN_CHANGES),
    _plan(3, "prompt-blank", _plan_task(1, prompt=" "), "bad-value"),
    # the session log, as the report reads it
    _event("event-session-0", _set(session=0), "session"),
    _event("event-time", _set(time="2026-12-01T00:00:00Z"), "time"),
    _event("event-attempt-0", _set(attempt=0), "attempt"),
    _event("event-no-task", _drop("task"), "task"),
    _event("event-duration", _set(duration=-1), "duration"),
    _event("event-note-type", _set(note=3), "note"),
    # result records, as the report reads them
    _record("record-no-note", _drop("note"), "note"),
    _record("record-status", _set(status="ok"), "status"),
    _record("record-format", _set(format="x/2"), "format"),
    _record("record-retryable", _set(retryable="no"), "retryable"),
    # ledger lines' records, as verify checks them
    _ledger("ledger-v2", _set(v=2), "version"),
    _ledger("ledger-scope-empty", _set(scope=""), "scope"),
    _ledger("ledger-status", _set(status="maybe"), "status"),
    _ledger("ledger-no-value", _drop("value"), "value"),
    _ledger("ledger-at", _set(at=1), "at"),
]


def _schema_of(case: Case, doc: Any) -> str:
    return case.schema(doc) if callable(case.schema) else case.schema


def _schema_error(schema: str, doc: Any) -> str | None:
    if "#" not in schema:
        return first_error(schema, doc)
    # a $def of a schema: validate the value in place
    name, pointer = schema.split("#", 1)
    assert pointer == "/$defs/record" and name == "ledger-record.json"
    return first_error(name, {"c": "0" * 16, "r": doc})


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_schema_refuses_what_the_tool_refuses(case: Case, tmp_path: Path) -> None:
    sound = case.sound()
    assert _schema_error(_schema_of(case, sound), sound) is None
    assert case.tool(copy.deepcopy(sound), tmp_path) == "", "the tool refuses the sound sample"
    bad = copy.deepcopy(sound)
    case.change(bad)
    refusal = case.tool(copy.deepcopy(bad), tmp_path)
    assert refusal, "the tool accepts the changed sample"
    assert case.refusal in refusal
    assert _schema_error(_schema_of(case, sound), bad) is not None, (
        f"{_schema_of(case, sound)} accepts what the tool refuses ({refusal})"
    )


def test_params_file_that_is_not_an_object(tmp_path: Path) -> None:
    # dispatch refuses a params file that is no object; so does the schema
    assert "JSON object" in params_refuse([1], tmp_path)
    assert first_error("params.json", [1]) is not None


def test_the_sample_manifests_are_toml() -> None:
    assert tomllib.loads(to_toml(manifest())) == manifest()


# -- prove probe --json: an output no tool reads back ---------------------------------
# The pairing is with the writer instead: tests/cli/test_prove_probe_cli.py holds
# that what `crucible-prove probe --json` prints is the golden object, byte for byte;
# each sample below is that object with one change the writer cannot make.


def probe_report() -> dict[str, Any]:
    golden = Path(__file__).resolve().parents[1] / "cli/golden/probe.json"
    return json.loads(golden.read_bytes())  # type: ignore[no-any-return]


def _at(*keys: str, value: Any = None, drop: bool = False) -> Callable[[Any], None]:
    def change(doc: Any) -> None:
        for key in keys[:-1]:
            doc = doc[key]
        if drop:
            del doc[keys[-1]]
        else:
            doc[keys[-1]] = value

    return change


PROBE_CHANGES: list[tuple[str, Callable[[Any], None]]] = [
    ("probe-version-2", _at("probeVersion", value=2)),
    ("probe-unknown-member", _at("colour", value="red")),
    ("probe-unknown-nested", _at("oneOutput", "below", "colour", value=1)),
    ("probe-no-two-stage", _at("twoStageIds", drop=True)),
    ("probe-no-fits", _at("twoStageIds", "long", "fits", drop=True)),
    ("probe-bytes-zero", _at("oneOutput", "acceptance", "bytes", value=0)),
    ("probe-bytes-string", _at("oneOutput", "maxBytes", value="3255")),
    ("probe-outcome", _at("oneOutput", "atLimit", value="fits")),
    ("probe-id-129", _at("twoStageIds", "long", "idLength", value=129)),
    ("probe-size-extra", _at("twoStageIds", "short", "acceptance", "digest", value="x")),
]


@pytest.mark.parametrize("change", [c for _, c in PROBE_CHANGES], ids=[i for i, _ in PROBE_CHANGES])
def test_the_probe_schema_refuses_what_the_writer_cannot_print(
    change: Callable[[Any], None],
) -> None:
    sound = probe_report()
    assert first_error("prove-probe.json", sound) is None
    change(sound)
    assert first_error("prove-probe.json", sound) is not None

"""Find the files crucible wrote under a directory and validate each by its schema.

The test suite's plugin (tests/schemas/plugin.py) runs :func:`check_tree` over
pytest's temporary directories at the end of a session, so every state dir,
result record, session log, inputs index and ledger a test made the tools
write is checked against docs/schemas/ (issue 11 item 10), and so is a
command's stdout a test keeps as ``<schema stem>.stdout.json``. A file is known by
where it sits (docs/spec/inputs.md §1, run.md "State directory", ledger.md),
never by its content.

A JSON file directly in a state dir that no entry here names is a problem, not
skipped: a new state file gets a schema (and a line in :func:`classify`) or an
entry in :data:`PENDING` saying whose schema it waits for.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "docs" / "schemas"

#: files in a state dir (beside plan.json) and their schemas
STATE_FILES: dict[str, str] = {
    "plan.json": "plan",  # by its version: plan-v1/2/3.json
    "params.json": "params.json",
    "session.jsonl": "session-event.json",
    "outputs.json": "outputs.json",
    "environ.json": "run-environ.json",  # what --reuse keys an earlier run with
    "workflow.json": "workflow.json",  # an accounted run's workflow record (export.md §6)
}
#: state files whose schema another change of this session brings: allowed
#: unchecked only while docs/schemas/<schema> does not exist
PENDING: dict[str, str] = {
    "loop.json": "loop.json",  # the scored loop (issue 18)
}
#: other names a state dir holds that are not JSON documents of ours
STATE_OTHER: frozenset[str] = frozenset({"lock", "events.jsonl"})

#: a command's stdout a test keeps as ``<schema stem>.stdout.json`` (e.g.
#: ``prove-probe.stdout.json``) is checked against ``docs/schemas/<schema stem>.json``:
#: outputs the tools print, not files they write, join the walk this way
STDOUT_SUFFIX = ".stdout.json"

#: a line of NDJSON files, by schema name
NDJSON: frozenset[str] = frozenset({"session-event.json", "ledger-record.json", "result-line.json"})


@dataclass(frozen=True)
class Found:
    """One file and the schema it must match (None: allowed unchecked, ``why``)."""

    path: Path
    schema: str | None
    why: str = ""


@dataclass(frozen=True)
class Problem:
    path: Path
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


@cache
def _is_state_dir(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, "plan.json")) and os.path.isfile(
        os.path.join(directory, "session.jsonl")
    )


def classify(path: Path) -> Found | None:
    """The schema of a file the tools write, or None for a file that is not one."""
    schema = _classify(str(path.parent), path.name)
    if schema is None:
        return None
    return Found(path, *schema)


def _classify(parent: str, name: str) -> tuple[str | None, str] | None:
    """(schema, why) by where the file sits: paths as strings, since the walk
    meets every file the suite left."""
    if not name.endswith((".json", ".jsonl")) and name != "outcome":
        return None
    up, parent_name = os.path.split(parent)
    if name == "steps.jsonl":
        return "ledger-record.json", ""
    if name == "@publish.json":
        return "publish-manifest.json", ""
    if parent_name == "@values" and os.path.basename(up) == "inputs":
        if name == "index.json":
            return "inputs-index.json", ""
        return ("outcome.json", "") if name == "outcome" else None
    if name == "@inputs.json" and parent_name == "inputs":
        return "inputs-v1.json", ""
    if name.startswith(("@", ".")):
        return None  # temporaries
    if name.endswith(".jsonl") and parent_name == "results" and _is_state_dir(up):
        return "result-line.json", ""  # results/<task>.jsonl: packed keyed records
    if name.endswith(STDOUT_SUFFIX):
        schema = name[: -len(STDOUT_SUFFIX)] + ".json"
        if not (SCHEMAS / schema).is_file():
            return "", f"a kept stdout no schema names ({schema})"
        return schema, ""
    if name.endswith(".json"):
        # results/<task>.json (and results/<task>/<key>.json, the layout before issue 14)
        if parent_name == "results" and _is_state_dir(up):
            return "result-record.json", ""
        up2, up_name = os.path.split(up)
        if up_name == "results" and _is_state_dir(up2):
            return "result-record.json", ""
        if parent_name == "instances" and _is_state_dir(up):
            return "instances.json", ""
        if name == "usage.json" and parent_name == "proof" and _is_state_dir(up):
            return "accounting-usage.json", ""  # an accounted run's (export.md §6)
    if _is_state_dir(parent):
        if name in STATE_FILES:
            return STATE_FILES[name], ""
        if name in PENDING:
            if not (SCHEMAS / PENDING[name]).exists():
                return None, f"its schema {PENDING[name]} is not written yet"
            return PENDING[name], ""
        if name not in STATE_OTHER:
            return "", "a state file no schema names"
    return None


def walk(root: Path) -> Iterator[Found]:
    """Every file under ``root`` that :func:`classify` knows, without following links."""
    stack = [str(root)]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = list(it)
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    kind = _classify(directory, entry.name)
                    if kind is not None:
                        yield Found(Path(entry.path), *kind)
            except OSError:  # gone, or a test's unreadable corner
                continue


@cache
def _schema(name: str) -> dict[str, Any]:
    return json.loads((SCHEMAS / name).read_text())  # type: ignore[no-any-return]


@cache
def _registry() -> Any:
    """Every schema by its ``$id``, so one may ``$ref`` another by file name."""
    from referencing import Registry
    from referencing.jsonschema import DRAFT202012

    resources = []
    for path in sorted(SCHEMAS.glob("*.json")):
        schema = _schema(path.name)
        resources.append((schema["$id"], DRAFT202012.create_resource(schema)))
    return Registry().with_resources(resources)


@cache
def validator(name: str) -> Any:
    """A Draft 2020-12 validator (python-jsonschema) for ``docs/schemas/<name>``,
    the schema checked against its metaschema first."""
    from jsonschema import Draft202012Validator

    schema = _schema(name)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, registry=_registry())


@cache
def _fast(name: str) -> Any:
    """The same schema in jsonschema-rs: about 400 times faster, so the suite's
    tens of thousands of files cost seconds. python-jsonschema words the errors
    and checks every refusal (the two must agree)."""
    import jsonschema_rs

    registry = jsonschema_rs.Registry(
        [(s["$id"], s) for s in (_schema(p.name) for p in sorted(SCHEMAS.glob("*.json")))]
    )
    return jsonschema_rs.Draft202012Validator(_schema(name), registry=registry)


def first_error(schema: str, value: object) -> str | None:
    """The headline error of ``value`` against ``schema``, or None when it matches."""
    from jsonschema.exceptions import best_match

    validator(schema)  # checks the schema itself, once
    if _fast(schema).is_valid(value):
        return None
    error = best_match(validator(schema).iter_errors(value))
    if error is None:
        return "jsonschema-rs refuses what python-jsonschema accepts"
    return f"{error.json_path}: {error.message}"


def _documents(found: Found, data: bytes) -> Iterator[tuple[str, str, object]]:
    """(where, schema, value) for each document of a file: one for JSON, one per
    line for NDJSON (a torn last line is skipped, as every reader of ours does)."""
    assert found.schema
    if found.schema not in NDJSON:
        yield "", found.schema, orjson.loads(data)
        return
    lines = data.split(b"\n")
    if lines and lines[-1] != b"":
        lines[-1] = b""  # unterminated: torn, or its newline was not yet written
    for number, line in enumerate(lines, 1):
        if line.strip():
            yield f":{number}", found.schema, orjson.loads(line)


def cache_value(line: object) -> object | None:
    """The value of a ledger line the task cache wrote for a passed unit (scope
    ``dispatch``, step ``unit:sha256:…``, status ``ok``: docs/spec/cache.md), else None."""
    record = line.get("r") if isinstance(line, dict) else None
    if not isinstance(record, dict) or record.get("scope") != "dispatch":
        return None
    step = record.get("step")
    if not isinstance(step, str) or not step.startswith("unit:sha256:"):
        return None
    return record.get("value") if record.get("status") == "ok" else None


def check_file(found: Found) -> list[Problem]:
    if found.schema is None:
        return []
    if found.schema == "":
        return [Problem(found.path, found.why)]
    try:
        data = found.path.read_bytes()
    except OSError as exc:
        return [Problem(found.path, f"unreadable: {exc.strerror}")]
    problems: list[Problem] = []
    try:
        for where, schema, value in _documents(found, data):
            if schema == "plan":
                version = value.get("version") if isinstance(value, dict) else None
                if version not in (1, 2, 3):
                    problems.append(Problem(found.path, f"no plan version 1-3: {version!r}"))
                    continue
                schema = f"plan-v{version}.json"
            if (error := first_error(schema, value)) is not None:
                problems.append(Problem(found.path, f"{schema}{where}: {error}"))
                if len(problems) >= 3:
                    break
            # -- the task cache's ledger values (the ledger's schema knows no scope)
            elif (
                schema == "ledger-record.json"
                and (cached := cache_value(value)) is not None
                and (error := first_error("cache-value.json", cached)) is not None
            ):
                problems.append(Problem(found.path, f"cache-value.json{where}: {error}"))
            # -- end task cache
    except (ValueError, UnicodeDecodeError) as exc:
        problems.append(Problem(found.path, f"not JSON: {exc}"))
    return problems


def check_tree(roots: Iterable[Path]) -> tuple[int, list[Problem]]:
    """(files checked, problems) over every known file under ``roots``."""
    checked = 0
    problems: list[Problem] = []
    for root in roots:
        for found in walk(root):
            checked += 1
            problems.extend(check_file(found))
    return checked, problems

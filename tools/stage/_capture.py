"""Producer side: read a task's result object, check and cap its declared fields,
capture its emits_files, write its settled record (docs/spec/inputs.md, "Capture").
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from crucible.core import canon
from crucible.core.contract import EMIT_CAP_DEFAULT
from crucible.core.errors import InputRefused, OperationalError
from crucible.core.fdio import read_file
from crucible.stage._files import FILES_RUN_MAX, CaptureRefused, capture_files, check_pattern
from crucible.stage._fsio import TMP_PREFIX, remove_tree, swap_in_dir
from crucible.stage._inputs import instance_item, utf16_order
from crucible.stage._layout import StateLayout
from crucible.stage._plan import view
from crucible.stage._records import RESULT_FORMAT, _extra, check_key, write_record

__all__ = ["EMIT_CAP_DEFAULT", "capture", "json_type", "type_ok"]


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def type_ok(value: Any, declared: str) -> bool:
    actual = json_type(value)
    if declared == "any":
        return True
    if declared == "number":
        return actual in ("integer", "number")
    return actual == declared


def _read_output(
    path: Path, declares_emits: bool, name: str | None = None
) -> tuple[dict[str, Any] | None, str | None]:
    """(result object, None) or (None, why it is not one); ``name`` shows the file."""
    shown = str(path) if name is None else name
    try:
        data = read_file(path)
    except FileNotFoundError:
        if not declares_emits:
            return {}, None
        return None, f"no result file at {shown} (the task writes its result to CRUCIBLE_OUTPUT)"
    except OSError as exc:
        return None, f"cannot read result file {shown}: {exc.strerror}"
    if not data.strip() and not declares_emits:
        return {}, None
    try:
        value = canon.loads(data)
    except canon.CanonError as exc:
        return None, f"result file {shown} is not valid JSON: {exc.message}"
    if not isinstance(value, dict):
        return None, f"result in {shown} is a JSON {json_type(value)}, not an object"
    return value, None


def capture(
    plan: Any,
    state: Path,
    task: str,
    workspace: Path,
    *,
    output_file: Path,
    exit_code: int,
    key: str | None = None,
    attempt: int = 1,
    emit_cap: int = EMIT_CAP_DEFAULT,
    extra: dict[str, Any] | None = None,
    files_max: int = FILES_RUN_MAX,
    output_name: str | None = None,
) -> dict[str, Any]:
    """Settle one attempt of ``task`` (or of its instance ``key``) and return its record.

    The attempt passes when it exited 0, wrote a JSON object carrying every
    declared emits field with its declared type, no declared field is over
    ``emit_cap`` (IR v2 only), and its emits_files could be captured. Plan and
    state problems raise (nothing written); a task's own faults settle as
    ``failed`` with a note. ``output_name`` names the result file in notes (e.g.
    ``<stdin>`` for a spooled copy) instead of ``output_file``.
    """
    pv = view(plan)
    t = pv.task(task)
    check_key(plan, task, key)
    if type(exit_code) is not int:
        raise InputRefused(f"exit code must be an integer, not {exit_code!r}")
    if type(emit_cap) is not int or emit_cap < 0:
        raise InputRefused(f"the emit cap must be a non-negative integer, not {emit_cap!r}")
    for i, pattern in enumerate(t.emits_files):
        check_pattern(pattern, f"plan:task {task}:emits_files[{i}]")
    ex = _extra(extra)
    state = Path(state)
    if key is not None:
        instance_item(plan, state, task, key)  # the key must be one of the map's items
    workspace = Path(workspace).absolute()
    if not workspace.is_dir():
        raise InputRefused("workspace does not exist", where=str(workspace))

    problems: list[str] = []
    measured = False  # a failure a retry would only repeat
    if exit_code != 0:
        problems.append(f"exited with status {exit_code}")
    output, why = _read_output(Path(output_file), bool(t.emits), output_name)
    if why is not None and (exit_code == 0 or os.path.exists(output_file)):
        problems.append(why)

    sizes: dict[str, int] = {}
    over_cap: list[dict[str, Any]] = []
    capped = pv.version == 2
    if output is not None:
        for fld in utf16_order(t.emits):
            if fld not in output:
                if exit_code == 0:
                    problems.append(f"declared field {fld!r} is missing")
                continue
            value = output[fld]
            try:
                size = len(canon.dumps(value))
            except canon.CanonError as exc:
                problems.append(f"declared field {fld!r} has no canonical JSON form: {exc.message}")
                del output[fld]
                measured = True
                continue
            sizes[fld] = size
            if exit_code == 0 and not type_ok(value, t.emits[fld]):
                problems.append(
                    f"declared field {fld!r} is a JSON {json_type(value)}, not {t.emits[fld]}"
                )
            if capped and size > emit_cap:
                over_cap.append({"field": fld, "size": size, "cap": emit_cap})
        for over in over_cap:
            # An oversized declared field never reaches a consumer or a record.
            del output[over["field"]]
        if over_cap:
            measured = True
            detail = ", ".join(f"{o['field']!r} is {o['size']} bytes" for o in over_cap)
            problems.insert(
                0 if exit_code == 0 else 1,
                f"over the emit cap: declared field {detail} of canonical JSON, over the cap of "
                f"{emit_cap} bytes; write large data to a file declared in emits_files instead",
            )
        try:
            canon.dumps(output)
        except canon.CanonError as exc:
            problems.append(f"result has no canonical JSON form: {exc.message}")
            output = None
            measured = True

    files: list[dict[str, Any]] = []
    files_captured = False
    if t.emits_files:
        layout = StateLayout(state)
        target = layout.files_dir(task, key)
        parent = target.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}capture-", dir=parent))
        except OSError as exc:
            raise OperationalError(
                f"cannot capture files: {exc.strerror}", where=str(parent)
            ) from None
        try:
            got = capture_files(
                workspace,
                t.emits_files,
                tmp,
                budget=files_max,
                require_literals=not problems,
            )
        except CaptureRefused as refusal:
            remove_tree(tmp)
            remove_tree(target)  # never leave an earlier attempt's files beside this record
            problems.append(refusal.note)
            measured = measured or not refusal.retryable
        except BaseException:
            remove_tree(tmp)
            raise
        else:
            swap_in_dir(tmp, target)
            files = got.files
            files_captured = True

    status = "failed" if problems else "passed"
    record: dict[str, Any] = {"format": RESULT_FORMAT, "task": task}
    if key is not None:
        record["key"] = key
    record.update(
        status=status,
        note="; ".join(problems),
        retryable=bool(problems) and not measured,
        attempt=attempt,
        exit_code=exit_code,
        emit_cap=emit_cap if capped else None,
        emit_sizes=sizes,
        files=files,
        files_captured=files_captured,
    )
    if output is not None:
        record["output"] = output
    if over_cap:
        record["over_cap"] = over_cap
    if ex is not None:
        record["extra"] = ex
    return write_record(state, record)

"""Producer side: read a task's result object, check and cap its declared fields,
capture its emits_files, write its settled record (docs/spec/inputs.md, "Capture").
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from crucible.core import canon
from crucible.core.contract import EMIT_CAP_DEFAULT, EMIT_CAP_MAX, emit_cap_problem, json_type
from crucible.core.errors import InputRefused, OperationalError
from crucible.core.fsio import NotRegular, open_regular, remove_tree
from crucible.stage._files import (
    FILES_RUN_MAX,
    CaptureRefused,
    _inside,
    capture_files,
    check_pattern,
)
from crucible.stage._fsio import TMP_PREFIX, swap_in_dir
from crucible.stage._inputs import check_inputs, instance_item, utf16_order
from crucible.stage._layout import StateLayout
from crucible.stage._loop import revision_of
from crucible.stage._plan import PlanView, in_plan
from crucible.stage._records import RESULT_FORMAT, check_key, checked_extra, write_record
from crucible.stage._store import as_path

__all__ = [
    "EMIT_CAP_DEFAULT",
    "EMIT_CAP_MAX",
    "EXIT_CODE_MAX",
    "EXIT_CODE_MIN",
    "RESULT_FILE_MAX",
    "capture",
    "emit_cap_problem",
    "json_type",
    "type_ok",
]

#: An exit status as dispatch records it: 0–255, or minus the signal number;
#: the range of a C int bounds what any caller can mean (our choice).
EXIT_CODE_MIN = -(2**31)
EXIT_CODE_MAX = 2**31 - 1


def type_ok(value: Any, declared: str) -> bool:
    actual = json_type(value)
    if declared == "any":
        return True
    if declared == "number":
        return actual in ("integer", "number")
    return actual == declared


#: Bound on a result file (our choice): declared fields are capped far below
#: it; a bigger file fails the attempt as measured instead of filling memory.
RESULT_FILE_MAX = 64 * 1024 * 1024


class _Output:
    """What reading the result file gave: the object, or why there is none and
    whether a retry could help."""

    def __init__(
        self, value: dict[str, Any] | None, why: str | None = None, *, measured: bool = False
    ) -> None:
        self.value = value
        self.why = why
        self.measured = measured


def _open_output(path: Path, workspace: Path) -> tuple[int, int]:
    """(fd, size) of the result file. A symlink is followed only when it resolves
    inside the workspace, as for emits_files; the file must be regular (a FIFO
    or device is never opened for reading, never waited on)."""
    if os.path.islink(path):
        real = os.path.realpath(path)
        root = os.path.realpath(workspace)
        if not _inside(real, root):
            raise NotRegular(f"is a symlink to {real!r}, outside the workspace; refused")
        fd, st = open_regular(real)
    else:
        fd, st = open_regular(path)
    return fd, st.st_size


def _read_output(
    path: Path, workspace: Path, declares_emits: bool, name: str | None = None
) -> _Output:
    """The result object, or why there is none; ``name`` shows the file."""
    shown = str(path) if name is None else name
    try:
        fd, size = _open_output(path, workspace)
    except FileNotFoundError:
        if not declares_emits:
            return _Output({})
        return _Output(
            None, f"no result file at {shown} (the task writes its result to CRUCIBLE_OUTPUT)"
        )
    except NotRegular as exc:
        return _Output(None, f"result file {shown} {exc.why}", measured=True)
    except OSError as exc:
        return _Output(None, f"cannot read result file {shown}: {exc.strerror}")
    try:
        if size > RESULT_FILE_MAX:
            raise OverflowError
        data = _read_sized(fd, size, RESULT_FILE_MAX)
    except OverflowError:
        return _Output(
            None,
            f"result file {shown} holds more than {RESULT_FILE_MAX} bytes, the bound on a "
            "result file; write large data to a file declared in emits_files instead",
            measured=True,
        )
    except OSError as exc:
        return _Output(None, f"cannot read result file {shown}: {exc.strerror}")
    finally:
        os.close(fd)
    if not data.strip() and not declares_emits:
        return _Output({})
    if data == b"{}":  # what most tasks without fields write: canon.loads' answer, at once
        return _Output({})
    try:
        value = canon.loads(data)
    except canon.CanonError as exc:
        what = "holds JSON crucible does not accept" if exc.valid_json else "is not valid JSON"
        return _Output(None, f"result file {shown} {what}: {exc.message}")
    if not isinstance(value, dict):
        return _Output(None, f"result in {shown} is a JSON {json_type(value)}, not an object")
    return _Output(value)


def _read_sized(fd: int, size: int, limit: int) -> bytes:
    """What ``read_at_most(fd, limit)`` returns, for a file whose fstat said
    ``size``: the first read asks for size + 1 bytes and the next ones for at
    most 64 KiB, so a small result (nearly all) costs two small reads, not a
    buffer of 1 MiB per read (an mmap and a munmap each). A file that grew
    meanwhile is read on, never past the bound (OverflowError)."""
    chunks: list[bytes] = []
    total = 0
    want = min(size, limit) + 1
    while True:
        chunk = os.read(fd, want)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise OverflowError
        want = min(1 << 16, limit + 1 - total)


class _Fields:
    """What checking the declared fields of a result object found."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.measured = False  # a failure a retry would only repeat
        self.sizes: dict[str, int] = {}
        self.over_cap: list[dict[str, Any]] = []


def _check_request(
    pv: PlanView, state: Path, task: str, workspace: Path, key: str | None, exit_code: int,
    emit_cap: int,
) -> Path:  # fmt: skip
    """Refuse a capture the caller got wrong (plan/state problems: nothing is
    written); returns the workspace as an absolute path."""
    t = pv.task(task)
    check_key(pv, task, key)
    if type(exit_code) is not int or not EXIT_CODE_MIN <= exit_code <= EXIT_CODE_MAX:
        raise InputRefused(
            f"exit code must be an integer from {EXIT_CODE_MIN} to {EXIT_CODE_MAX}, "
            f"not {exit_code!r}",
            where="exit_code",
        )
    if type(emit_cap) is not int or not 1 <= emit_cap <= EMIT_CAP_MAX:
        raise InputRefused(emit_cap_problem(repr(emit_cap)), where="emit_cap")
    for i, pattern in enumerate(t.emits_files):
        check_pattern(pattern, in_plan(f"task {task}:emits_files[{i}]"))
    if key is not None and revision_of(key) is None:
        instance_item(pv, state, task, key)  # the key must be one of the map's items
    workspace = as_path(workspace).absolute()
    if not workspace.is_dir():
        raise InputRefused("workspace does not exist", where=str(workspace))
    return workspace


def _check_fields(
    emits: dict[str, str], output: dict[str, Any], exit_code: int, emit_cap: int, capped: bool,
    found: _Fields,
) -> dict[str, Any] | None:  # fmt: skip
    """Check and cap the declared fields of ``output`` (in place: an oversized
    field never reaches a consumer or a record); returns it, or None when it
    has no canonical form."""
    problems = found.problems
    for fld in utf16_order(emits):
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
            found.measured = True
            continue
        found.sizes[fld] = size
        if exit_code == 0 and not type_ok(value, emits[fld]):
            problems.append(
                f"declared field {fld!r} is a JSON {json_type(value)}, not {emits[fld]}"
            )
        if capped and size > emit_cap:
            found.over_cap.append({"field": fld, "size": size, "cap": emit_cap})
    for over in found.over_cap:
        del output[over["field"]]
    if found.over_cap:
        found.measured = True
        detail = ", ".join(f"{o['field']!r} is {o['size']} bytes" for o in found.over_cap)
        problems.insert(
            0 if exit_code == 0 else 1,
            f"over the emit cap: declared field {detail} of canonical JSON, over the cap of "
            f"{emit_cap} bytes; write large data to a file declared in emits_files instead",
        )
    try:
        canon.dumps(output)
    except canon.CanonError as exc:
        problems.append(f"result has no canonical JSON form: {exc.message}")
        found.measured = True
        return None
    return output


def _capture_files(
    state: Path, task: str, key: str | None, workspace: Path, patterns: tuple[str, ...],
    files_max: int, found: _Fields, empty_workspace: bool = False,
) -> tuple[list[dict[str, Any]], bool]:  # fmt: skip
    """Capture the task's emits_files into ``files/<task>[/<key>]`` (swapped in
    whole); returns (the files, whether they were captured). ``empty_workspace``
    (a passing attempt whose workspace is not kept): files are captured by hard
    link where safe, and their workspace names removed once the capture
    passed — the state then holds their bytes once (4, "One copy")."""
    link = empty_workspace and not found.problems
    target = StateLayout(state).files_dir(task, key)
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        import tempfile  # lazy: tempfile loads shutil, random, bz2 and lzma (~3 ms of start-up)

        tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}capture-", dir=parent))
    except OSError as exc:
        raise OperationalError(f"cannot capture files: {exc.strerror}", where=str(parent)) from None
    try:
        got = capture_files(
            workspace, patterns, tmp, budget=files_max, require_literals=not found.problems,
            link=link,
        )  # fmt: skip
    except CaptureRefused as refusal:
        remove_tree(tmp)
        remove_tree(target)  # never leave an earlier attempt's files beside this record
        found.problems.append(refusal.note)
        found.measured = found.measured or not refusal.retryable
        return [], False
    except BaseException:
        remove_tree(tmp)
        raise
    swap_in_dir(tmp, target)
    if got.moved and not found.problems:
        _empty(workspace, got.moved)
    return got.files, True


def _empty(workspace: Path, moved: list[Any]) -> None:
    """Unlink the workspace names of files captured by link (each only while
    it still names the captured inode), then the directories that left empty,
    up to the workspace."""
    parents: set[str] = set()
    root = os.path.realpath(workspace)  # the moved paths are resolved ones
    for m in moved:
        try:
            st = os.lstat(m.path)
            if (st.st_dev, st.st_ino) == (m.dev, m.ino):
                os.unlink(m.path)
                parents.add(os.path.dirname(m.path))
        except OSError:
            continue
    for d in sorted(parents, key=len, reverse=True):
        while d.startswith(root + "/"):
            try:
                os.rmdir(d)
            except OSError:
                break
            d = os.path.dirname(d)


def _build_record(
    task: str, key: str | None, found: _Fields, output: dict[str, Any] | None, *,
    attempt: int, exit_code: int, emit_cap: int | None, files: list[dict[str, Any]],
    files_captured: bool, extra: dict[str, Any] | None,
) -> dict[str, Any]:  # fmt: skip
    problems = found.problems
    record: dict[str, Any] = {"format": RESULT_FORMAT, "task": task}
    if key is not None:
        record["key"] = key
    record["status"] = "failed" if problems else "passed"
    record["note"] = "; ".join(problems)
    record["retryable"] = bool(problems) and not found.measured
    record |= {"attempt": attempt, "exit_code": exit_code, "emit_cap": emit_cap}
    record |= {"emit_sizes": found.sizes, "files": files, "files_captured": files_captured}
    if output is not None:
        record["output"] = output
    if found.over_cap:
        record["over_cap"] = found.over_cap
    if extra is not None:
        record["extra"] = extra
    return record


def capture(
    pv: PlanView,
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
    held_notes: list[str] | None = None,
    write: bool = True,
    empty_workspace: bool = False,
) -> dict[str, Any]:
    """Settle one attempt of ``task`` (or of its instance ``key``) and return its record.

    The attempt passes when it exited 0, wrote a JSON object carrying every
    declared emits field with its declared type, no declared field is over
    ``emit_cap`` (IR v2 only), and its emits_files could be captured. Plan and
    state problems raise (nothing written); a task's own faults settle as
    ``failed`` with a note. ``output_name`` names the result file in notes (e.g.
    ``<stdin>`` for a spooled copy) instead of ``output_file``. ``held_notes``:
    what :func:`check_inputs` found when the caller checked the task's staged
    files before giving its slot back (they are not checked again). ``write``
    False: the record is built, not written (dispatch amends it in memory and
    writes it once, crucible.stage.write_result). ``empty_workspace``: the
    caller will not keep the workspace of a passed attempt (dispatch without
    --keep-workspaces): its captured files move into the store by hard link
    where safe and leave the workspace (docs/spec/inputs.md 4, "One copy").
    """
    t = pv.task(task)
    state = as_path(state)
    workspace = _check_request(pv, state, task, workspace, key, exit_code, emit_cap)
    ex = checked_extra(extra)

    found = _Fields()
    if exit_code != 0:
        found.problems.append(f"exited with status {exit_code}")
    read = _read_output(as_path(output_file), workspace, bool(t.emits), output_name)
    output = read.value
    if read.why is not None and (exit_code == 0 or os.path.lexists(output_file)):
        found.problems.append(read.why)
        found.measured = found.measured or read.measured
    capped = pv.version >= 2
    if output is not None:
        output = _check_fields(t.emits, output, exit_code, emit_cap, capped, found)

    # What this task was handed must be what every other consumer sees (3.4).
    tampering = (
        list(held_notes)
        if held_notes is not None
        else check_inputs(pv, state, task, workspace, key=key)
    )
    if tampering:
        found.problems.extend(tampering)
        found.measured = True

    files: list[dict[str, Any]] = []
    files_captured = False
    if t.emits_files:
        files, files_captured = _capture_files(
            state, task, key, workspace, t.emits_files, files_max, found,
            empty_workspace and exit_code == 0,
        )  # fmt: skip
    record = _build_record(
        task, key, found, output, attempt=attempt, exit_code=exit_code,
        emit_cap=emit_cap if capped else None, files=files, files_captured=files_captured,
        extra=ex,
    )  # fmt: skip
    return write_record(state, record) if write else record

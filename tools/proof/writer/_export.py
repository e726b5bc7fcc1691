"""``crucible-prove --state STATE --out BUNDLE``: the export of an accounted run.

The dispatcher of an accounted pack keeps, beside its own state, the three inputs of
``prove``: ``STATE/workflow.json``, ``STATE/operations.ndjson`` and the received
artifacts the log names under ``STATE/proof/artifacts/``. The export replays that log
with the same engine (so the bundle is the one ``--workflow/--operations/--artifacts``
would write) into a fresh directory, swapped in atomically. A run whose last session
ended by itself is closed by a ``finish`` with no files; any other exports partial
(admission-proof.md §9, §11).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from crucible.core.errors import InputRefused, OperationalError, UsageError
from crucible.core.structs import dataclass
from crucible.proof.writer._bundle import custody_dir
from crucible.proof.writer._prove import ProveOptions, ProveResult, prove

__all__ = [
    "STATE_ARTIFACTS",
    "STATE_LOCK",
    "STATE_OPERATIONS",
    "STATE_PLAN",
    "STATE_SESSION",
    "STATE_WORKFLOW",
    "ExportOptions",
    "export",
]

#: what claims a directory as a run's state dir (docs/spec/run.md, "State directory")
STATE_PLAN = "plan.json"
#: the dispatcher's lock: held (exclusive) while a dispatcher runs on the state dir
STATE_LOCK = "lock"
#: an accounted run's inputs of ``prove`` (docs/spec/admission-proof.md §11)
STATE_WORKFLOW = "workflow.json"
STATE_OPERATIONS = "operations.ndjson"
STATE_ARTIFACTS = "proof/artifacts"
#: the session log whose last line says whether the last session ended (run.md)
STATE_SESSION = "session.jsonl"
#: how much of the session log's tail is read to find its last line
_TAIL = 1 << 16


@dataclass(frozen=True)
class ExportOptions:
    state: Path
    out: Path
    check_candidates: bool = False
    #: fsync every file before the swap (tests of logic may turn it off)
    durable: bool = True


def export(options: ExportOptions) -> ProveResult:
    """Write the bundle of the run in ``options.state`` to ``options.out``.

    Usage errors (exit 2): STATE not a directory, ``--out`` existing and not an empty
    directory. Refusals (exit 1): STATE not a run, a run that kept no accounting, a
    dispatcher still running on it; then whatever ``prove`` refuses in the log."""
    state, out = options.state, options.out
    _check_state(state)
    _check_out(out)
    if _inside(out, state):
        raise UsageError(
            "--out: inside the run's state directory; an export is written outside it",
            where=str(out),
        )
    workflow = state / STATE_WORKFLOW
    operations = state / STATE_OPERATIONS
    with _quiet_state(state):
        return prove(
            ProveOptions(
                workflow=workflow,
                operations=operations,
                artifacts=state / STATE_ARTIFACTS,
                out=out,
                check_candidates=options.check_candidates,
                durable=options.durable,
                keep_decisions=False,
                ended=run_ended(state),
                complete_lines_only=True,
            )
        )


def run_ended(state: Path) -> bool:
    """Whether the run's last session ended by itself: the last line of its session
    log is ``shutdown`` with reason ``completed`` (a signal, an error or no shutdown
    at all — a crash, a running dispatcher — is no end)."""
    try:
        with open(state / STATE_SESSION, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - _TAIL))
            tail = f.read()
    except OSError:
        return False
    lines = tail.rstrip(b"\n").rsplit(b"\n", 1)
    try:
        last = json.loads(lines[-1])
    except ValueError:
        return False  # a torn last line: that session did not end cleanly
    return (
        isinstance(last, dict)
        and last.get("event") == "shutdown"
        and last.get("reason") == "completed"
    )


def _check_state(state: Path) -> None:
    where = str(state)
    if state.is_symlink() or not state.is_dir():
        problem = "no such directory" if not state.exists() else "not a directory"
        if state.is_symlink():
            problem = "a symbolic link (name the state directory itself)"
        raise UsageError(f"--state: {problem}", where=where)
    if not (state / STATE_PLAN).is_file():
        raise InputRefused(f"not a run's state directory (no {STATE_PLAN})", where=where)
    if not (state / STATE_OPERATIONS).is_file():
        raise InputRefused(
            f"an unaccounted run: no {STATE_OPERATIONS} (its pack declares no "
            "[workflow.limits], so there is no proof to export)",
            where=where,
        )
    if not (state / STATE_WORKFLOW).is_file():
        raise InputRefused(f"an accounted run without {STATE_WORKFLOW}", where=where)
    artifacts = state / STATE_ARTIFACTS
    if not artifacts.is_dir() or artifacts.is_symlink():
        raise InputRefused(
            f"an accounted run without its {STATE_ARTIFACTS}/ directory", where=where
        )


def _inside(path: Path, directory: Path) -> bool:
    """Whether ``path`` (existing or not) would be ``directory`` or below it."""
    base = directory.resolve()
    target = path.parent.resolve() / path.name
    return target == base or base in target.parents


def _check_out(out: Path) -> None:
    """``--out`` (and its custody sibling, admission-proof.md §9) must not exist or be an
    empty directory: an export never replaces."""
    _check_new(out, "--out")
    _check_new(custody_dir(out), "--out's custody folder")


def _check_new(out: Path, what: str) -> None:
    where = str(out)
    if out.is_symlink():
        raise UsageError(f"{what}: a symbolic link; name a new directory", where=where)
    if not out.exists():
        if not out.parent.is_dir():
            raise UsageError(f"{what}: its parent is not a directory", where=where)
        return
    if not out.is_dir():
        raise UsageError(f"{what}: exists and is not a directory", where=where)
    try:
        with os.scandir(out) as entries:
            nonempty = next(entries, None) is not None
    except OSError as exc:
        raise OperationalError(f"{what}: cannot list: {exc.strerror}", where=where) from None
    if nonempty:
        raise UsageError(
            f"{what}: exists and is not empty (an export never replaces a directory; "
            "name a new one or remove it)",
            where=where,
        )


@contextlib.contextmanager
def _quiet_state(state: Path) -> Iterator[None]:
    """Hold a shared lock on STATE/lock while reading: refused (exit 1) while a
    dispatcher holds it, and no dispatcher starts on the dir mid-export."""
    try:
        fd = os.open(state / STATE_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        yield  # no dispatcher ever ran here with a lock: nothing to wait for
        return
    except OSError as exc:
        raise InputRefused(f"cannot open {STATE_LOCK}: {exc.strerror}", where=str(state)) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise OperationalError(
                    f"cannot lock {STATE_LOCK}: {exc.strerror}", where=str(state)
                ) from None
            raise InputRefused(
                "a dispatcher is running on this state directory; export once it has "
                "ended (or been interrupted)",
                where=str(state),
            ) from None
        yield
    finally:
        os.close(fd)

"""The session log's vocabulary: one typed constructor per event kind.

Every event the dispatcher writes to ``STATE/session.jsonl`` is built here
(docs/spec/run.md, "Session log"; docs/schemas/session-event.json), and the
report's reader (:mod:`crucible.run.report._state`) checks the members it
reads against the same table, :data:`MEMBERS`. tests/run/test_session_events.py
holds the table to the schema. A member whose value is None is left out of
the line (:meth:`crucible.run.session._log.SessionLog.emit`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crucible.core.structs import dataclass

__all__ = [
    "KINDS",
    "MEMBERS",
    "REQUIRED",
    "SessionEvent",
    "loop_finished",
    "plan_admitted",
    "revision_finished",
    "revision_started",
    "run_finished",
    "shutdown",
    "task_finished",
    "task_started",
    "temp_freed",
]

_STR, _INT, _NUM, _BOOL = ("string",), ("integer",), ("number",), ("boolean",)
_INT_OR_NULL, _NUM_OR_NULL = ("integer", "null"), ("number", "null")

#: per event kind, each member it may carry and the JSON types it may take
#: (besides ``event``, ``session`` and ``time``, which every event has)
MEMBERS: dict[str, dict[str, tuple[str, ...]]] = {
    "plan_admitted": {
        "plan_version": _INT, "edition": _INT, "workflow": _STR, "digest": _STR,
        "resume": _BOOL, "jobs": _INT, "emit_cap": _INT, "tasks": ("array",),
    },
    "task_started": {
        "task": _STR, "key": _STR, "attempt": _INT, "pid": _INT, "workspace": _STR,
        "item": _STR, "worker": _STR,
    },
    "task_finished": {
        "task": _STR, "key": _STR, "attempt": _INT, "status": _STR, "note": _STR,
        "exit_code": _INT, "duration": _NUM, "output_bytes": _INT, "files_bytes": _INT,
        "log_error": _STR, "cache_miss": _STR, "retry": _BOOL, "instances": _INT,
        "tolerated": _BOOL, "cached": _BOOL, "cache_key": _STR,
        # what the attempt cost (crucible.run.executors._usage.USAGE_FIELDS)
        "cpu_user_s": _NUM_OR_NULL, "cpu_sys_s": _NUM_OR_NULL, "max_rss_kib": _INT_OR_NULL,
        "spawner_rss_kib": _INT_OR_NULL, "read_bytes": _INT_OR_NULL,
        "write_bytes": _INT_OR_NULL, "vol_ctxt": _INT_OR_NULL, "inv_ctxt": _INT_OR_NULL,
    },
    "run_finished": {
        "status": _STR, "counts": ("object",), "duration": _NUM, "max_rss_kib": _INT,
        "worker_max_rss_kib": _INT,
    },
    "shutdown": {"reason": _STR, "signal": _STR, "exit_code": _INT, "note": _STR},
    "revision_started": {"revision": _INT},
    "revision_finished": {
        "revision": _INT, "score": _NUM, "verdict": _STR, "kept": _BOOL, "reason": _STR,
        "duration_ms": _INT,
    },
    "loop_finished": {
        "stop_reason": _STR, "revisions": _INT, "kept_revision": _INT, "best_score": _NUM,
    },
    "temp_freed": {"task": _STR, "files": _INT, "bytes": _INT},
}  # fmt: skip

#: per event kind, the members it always carries
REQUIRED: dict[str, tuple[str, ...]] = {
    "plan_admitted": (
        "plan_version", "edition", "workflow", "digest", "resume", "jobs", "emit_cap", "tasks",
    ),
    "task_started": ("task", "attempt", "pid", "workspace"),
    "task_finished": ("task", "status", "note"),
    "run_finished": ("status", "counts", "duration", "max_rss_kib"),
    "shutdown": ("reason", "exit_code"),
    "revision_started": ("revision",),
    "revision_finished": ("revision", "verdict", "kept", "reason", "duration_ms"),
    "loop_finished": ("revisions",),
    "temp_freed": ("task", "files", "bytes"),
}  # fmt: skip

KINDS: tuple[str, ...] = tuple(MEMBERS)

#: task_finished members an attempt's worker measured (handed on as they came)
_MEASURED = frozenset(MEMBERS["task_finished"]) - {
    "task", "key", "attempt", "status", "note", "exit_code", "duration", "instances",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class SessionEvent:
    """One event, before the log stamps it with ``session`` and ``time``."""

    kind: str
    members: dict[str, Any]


def plan_admitted(
    *, plan_version: int, edition: int, workflow: str, digest: str, resume: bool, jobs: int,
    emit_cap: int, tasks: list[dict[str, Any]],
) -> SessionEvent:  # fmt: skip
    """The session's first event: the plan it runs and how."""
    return SessionEvent("plan_admitted", {
        "plan_version": plan_version, "edition": edition, "workflow": workflow,
        "digest": digest, "resume": resume, "jobs": jobs, "emit_cap": emit_cap, "tasks": tasks,
    })  # fmt: skip


def task_started(
    *, task: str, key: str | None, attempt: int, pid: int, workspace: str,
    item: str | None = None, worker: str | None = None,
) -> SessionEvent:  # fmt: skip
    """An attempt's task process started (``worker``: a Dask executor's)."""
    return SessionEvent("task_started", {
        "task": task, "key": key, "attempt": attempt, "pid": pid, "workspace": workspace,
        "item": item, "worker": worker,
    })  # fmt: skip


def task_finished(
    *, task: str, status: str, note: str | None, key: str | None = None,
    attempt: int | None = None, exit_code: int | None = None, duration: float | None = None,
    instances: int | None = None, retry: bool | None = None, tolerated: bool | None = None,
    measured: Mapping[str, Any] | None = None,
) -> SessionEvent:  # fmt: skip
    """A unit settled, was retried (``retry``) or interrupted, or a task settled
    without running (no ``attempt``); ``instances``: a mapped task's aggregate.
    ``measured``: what its worker measured (sizes, log error, cache, usage)."""
    members: dict[str, Any] = {
        "task": task, "key": key, "attempt": attempt, "status": status, "note": note,
        "exit_code": exit_code, "duration": duration, "instances": instances,
        "retry": retry, "tolerated": tolerated,
    }  # fmt: skip
    if measured:
        unknown = measured.keys() - _MEASURED
        if unknown:
            raise ValueError(f"task_finished has no member {sorted(unknown)[0]!r}")
        members.update(measured)
    return SessionEvent("task_finished", members)


def run_finished(
    *, status: str, counts: dict[str, int], duration: float, max_rss_kib: int,
    worker_max_rss_kib: int | None = None,
) -> SessionEvent:  # fmt: skip
    """The dispatcher's loop ended: the run's status and counts."""
    return SessionEvent("run_finished", {
        "status": status, "counts": counts, "duration": duration, "max_rss_kib": max_rss_kib,
        "worker_max_rss_kib": worker_max_rss_kib,
    })  # fmt: skip


def shutdown(
    *, reason: str, exit_code: int, signal: str | None = None, note: str | None = None
) -> SessionEvent:
    """The last event of every session: completed, signal or error."""
    return SessionEvent(
        "shutdown", {"reason": reason, "exit_code": exit_code, "signal": signal, "note": note}
    )


def revision_started(*, revision: int) -> SessionEvent:
    """A scored loop's revision starts (docs/spec/loop.md)."""
    return SessionEvent("revision_started", {"revision": revision})


def revision_finished(
    *, revision: int, score: float | None, verdict: str, kept: bool, reason: str,
    duration_ms: int,
) -> SessionEvent:  # fmt: skip
    """A scored loop's revision settled: its score, verdict and whether it is kept."""
    return SessionEvent("revision_finished", {
        "revision": revision, "score": score, "verdict": verdict, "kept": kept,
        "reason": reason, "duration_ms": duration_ms,
    })  # fmt: skip


def loop_finished(
    *, stop_reason: str | None, revisions: int, kept_revision: int | None,
    best_score: float | None,
) -> SessionEvent:  # fmt: skip
    """A scored loop stopped: why, after how many revisions, which one it kept."""
    return SessionEvent("loop_finished", {
        "stop_reason": stop_reason, "revisions": revisions, "kept_revision": kept_revision,
        "best_score": best_score,
    })  # fmt: skip


def temp_freed(*, task: str, files: int, bytes: int) -> SessionEvent:
    """A producer's temporary files were freed (docs/spec/run.md, "Temporary files")."""
    return SessionEvent("temp_freed", {"task": task, "files": files, "bytes": bytes})

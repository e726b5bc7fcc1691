"""What the engine's parts share: a unit and its attempt, the counts the
progress line and ``run_finished`` show, a run's outcome, and the statuses."""

from __future__ import annotations

import time
from typing import Any

from crucible.core.structs import dataclass, field

__all__ = [
    "FAILED",
    "FAILURES_SHOWN",
    "INTERRUPTED",
    "PASSED",
    "SKIPPED",
    "Counts",
    "Finished",
    "RunOutcome",
    "Unit",
]

PASSED, FAILED, SKIPPED, INTERRUPTED = "passed", "failed", "skipped", "interrupted"
#: failed units the run's last line names
FAILURES_SHOWN = 3


@dataclass
class Counts:
    """What the progress display and ``run_finished`` show, in units (a task, or
    one instance of a mapped task)."""

    total: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    #: failed units whose failure the run ignores (on_failure / allow_exit)
    tolerated: int = 0
    running: int = 0
    started_at: float = field(default_factory=time.monotonic)

    @property
    def settled(self) -> int:
        return self.passed + self.failed + self.skipped


@dataclass(frozen=True)
class RunOutcome:
    status: str
    exit_code: int
    counts: dict[str, int]
    digest: str
    duration: float
    #: the first failed units: (``task`` or ``task[key]``, log path relative to
    #: STATE or None), at most FAILURES_SHOWN
    failures: tuple[tuple[str, str | None], ...] = ()
    #: a session that ran nothing says why (``--resume`` with nothing left)
    message: str | None = None
    #: --dry-run: one entry per unit (task, key?, action, reason)
    plan_lines: tuple[dict[str, Any], ...] = ()


class Unit:
    """One runnable thing: a task, or one instance of a mapped task, and its attempt."""

    __slots__ = (
        "attempt",
        "first_start",
        "index",
        "key",
        "last_env",
        "name",
        "pid",
        "staged_env",
    )

    def __init__(self, name: str, key: str | None, index: int = -1) -> None:
        self.name = name
        self.key = key
        #: an instance's position in its task's instance order (-1: not known)
        self.index = index
        self.attempt = 1
        #: what staging returned on the first attempt (retries keep it)
        self.staged_env: dict[str, str] | None = None
        #: the task process of the current attempt, once started
        self.pid: int | None = None
        #: when the first attempt started (monotonic), for a task's ``deadline``
        self.first_start: float | None = None
        #: CRUCIBLE_LAST_EXIT / CRUCIBLE_LAST_REASON of the previous attempt
        self.last_env: dict[str, str] | None = None


@dataclass
class Finished:
    """What the scheduling thread needs to settle an attempt once capture ran."""

    unit: Unit
    code: int
    duration: float
    stop_reason: str | None
    #: event fields the worker measured: output_bytes, files_bytes, log_error
    fields: dict[str, Any]
    #: capture's verdict, as the worker summarised it (None: nothing captured)
    record: dict[str, Any] | None = None
    #: the unit's log (relative to STATE) and output tail, for a failure's note
    log: str | None = None
    tail: str = ""

    @property
    def passed(self) -> bool:
        return self.code == 0 and self.record is not None and self.record.get("status") == PASSED

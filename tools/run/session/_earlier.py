"""What a resume needs of the earlier sessions in ``STATE/session.jsonl``.

A resume asks four things of the log: which units were ever started (kept
records aside, a started unit without one is "unsettled" in a dry run), which
started units never finished and may still run (their process groups:
crucible.run.session._leftovers), how many sessions there were (the next one's
number), and how the last run ended (a scored loop's verdict). The log is read
line by line and folded into exactly that: a million-instance log is ~0.5 GB,
its unit events kept as dicts were ~0.7 KiB each in memory (issue 33); folded,
a started unit costs its key in a per-task set.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from crucible.core import ndjson
from crucible.core.errors import Location, OperationalError
from crucible.core.structs import dataclass, field

__all__ = ["EarlierSessions", "StartedUnits", "read_earlier"]

#: a unit: (task, instance key or None)
Unit = tuple[str, "str | None"]


class StartedUnits:
    """The (task, key) of every unit an earlier session started, held as one set
    of keys per task (a task's name is stored once, not once per instance)."""

    __slots__ = ("_by_task",)

    def __init__(self) -> None:
        self._by_task: dict[str, set[str | None]] = {}

    def add(self, task: str, key: str | None) -> None:
        keys = self._by_task.get(task)
        if keys is None:
            keys = self._by_task[task] = set()
        keys.add(key)

    def __contains__(self, unit: object) -> bool:
        if not isinstance(unit, tuple) or len(unit) != 2:
            return False
        keys = self._by_task.get(unit[0])
        return keys is not None and unit[1] in keys

    def tasks(self) -> set[str]:
        """The tasks with at least one started unit."""
        return set(self._by_task)

    def __iter__(self) -> Iterator[Unit]:
        for task, keys in self._by_task.items():
            for key in keys:
                yield task, key

    def __len__(self) -> int:
        return sum(len(keys) for keys in self._by_task.values())


@dataclass
class EarlierSessions:
    """The earlier sessions of a state dir, as a resume reads them."""

    #: how many sessions the log holds (its ``plan_admitted`` events)
    sessions: int = 0
    started: StartedUnits = field(default_factory=StartedUnits)
    #: units started with a process group (``pid``) and never finished since,
    #: in the order they started: what a killed run may have left running
    unfinished: dict[Unit, int] = field(default_factory=dict)
    #: the last ``run_finished`` event, whole; None when no run finished
    last_run_finished: dict[str, Any] | None = None


def read_earlier(path: Path) -> EarlierSessions:
    """Fold the session log at ``path`` (none: no earlier session). A torn last
    line (a crash mid-write, before its fsync) is left out; any other line
    that is not a JSON object is an NdjsonError naming ``file:line``."""
    earlier = EarlierSessions()
    try:
        f = path.open("rb", buffering=1 << 20)
    except FileNotFoundError:
        return earlier
    except OSError as exc:
        raise OperationalError(
            f"cannot read session log: {exc.strerror}", where=str(path)
        ) from None
    started, unfinished = earlier.started, earlier.unfinished
    loads = orjson.loads
    with f:
        try:
            for number, raw in enumerate(f, start=1):
                if not raw.endswith(b"\n"):
                    break
                if not raw.strip():
                    continue
                try:
                    event = loads(raw)
                except orjson.JSONDecodeError as exc:
                    raise ndjson.NdjsonError(
                        f"invalid JSON: {exc}", location=Location(str(path), number)
                    ) from None
                if not isinstance(event, dict):
                    raise ndjson.NdjsonError(
                        "line is not a JSON object", location=Location(str(path), number)
                    )
                _fold(earlier, started, unfinished, event)
        except OSError as exc:
            raise OperationalError(
                f"cannot read session log: {exc.strerror}", where=str(path)
            ) from None
    return earlier


def _fold(
    earlier: EarlierSessions,
    started: StartedUnits,
    unfinished: dict[Unit, int],
    event: dict[str, Any],
) -> None:
    kind = event.get("event")
    if kind == "task_started" or kind == "task_finished":
        task, key = event.get("task"), event.get("key")
        if type(task) is not str or not (key is None or type(key) is str):
            return  # not a unit this run can name (a hand-edited log)
        if kind == "task_finished":
            unfinished.pop((task, key), None)
            return
        started.add(task, key)
        pid = event.get("pid")
        if type(pid) is int:  # a later attempt's group replaces an earlier one's
            unfinished[(task, key)] = pid
    elif kind == "plan_admitted":
        earlier.sessions += 1
    elif kind == "run_finished":
        earlier.last_run_finished = event

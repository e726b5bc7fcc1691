"""What a session runs, and why: resume, ``--retry-failed``, ``--target``, ``--dry-run``.

:func:`select` reads the state (result records, the session log's starts) and
decides, without writing anything, which tasks are kept from earlier sessions,
which run again, and which are not selected; :func:`apply` then removes the
records of what runs again (``--retry-failed``). A dry run prints the decision
(:func:`dry_run_lines`) and stops there (docs/spec/run.md, "Resume" and
"Selecting what runs").
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Container, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from crucible.core.errors import CrucibleError
from crucible.core.plan import Ref, Task
from crucible.core.structs import dataclass, field
from crucible.run.engine._graph import TaskGraph
from crucible.run.engine._temps import freed_marker, rerun_for_freed

if TYPE_CHECKING:  # built by the run (crucible.run.session._runner)
    from crucible.run.session._earlier import StartedUnits
    from crucible.stage import StateDir

__all__ = ["Selection", "apply", "dry_run_lines", "select"]

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
NOT_SELECTED = "not_selected"
#: a dry run's reason for a unit an earlier session started and did not settle
UNSETTLED = "unsettled (started in an earlier session, no result)"


@dataclass
class Selection:
    #: task -> its record, for records kept from earlier sessions
    kept: dict[str, dict[str, Any]]
    #: tasks whose records are removed so they run again (--retry-failed)
    rerun: set[str]
    #: mapped tasks that rerun only their failed and skipped instances
    partial: set[str]
    #: tasks this session may run (targets and their ancestors); None: all
    selected: set[str] | None
    #: task -> why it runs, is kept or is not selected (for --dry-run)
    reasons: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: (task, key) of every unit an earlier session started (for --dry-run)
    started: Container[tuple[str, str | None]] = ()

    def to_run(self, graph: TaskGraph) -> list[str]:
        return [
            n
            for n in graph.order
            if n not in self.kept and (self.selected is None or n in self.selected)
        ]


def _closure(start: Iterable[str], edges: dict[str, tuple[str, ...]]) -> set[str]:
    seen = set(start)
    todo = deque(seen)
    while todo:
        for nxt in edges[todo.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _records(sd: StateDir, graph: TaskGraph) -> dict[str, dict[str, Any]]:
    records: dict[str, dict[str, Any]] = {}
    if not graph.order or not sd.layout.results_root.is_dir():
        return records
    for name in graph.order:
        record = sd.load_result(name)
        if record is not None:
            records[name] = record
    return records


def select(
    sd: StateDir,
    graph: TaskGraph,
    *,
    retry_failed: bool,
    targets: tuple[str, ...],
    started: StartedUnits | None = None,
    fresh: bool = False,
) -> Selection:
    """``started``: the units the earlier sessions started (their log, folded);
    ``fresh``: a run that starts over (no record of the state dir counts)."""
    records = {} if fresh else _records(sd, graph)
    units_started: Container[tuple[str, str | None]] = started if started is not None else ()
    started_tasks = started.tasks() if started is not None else set()
    failed = {n for n, r in records.items() if r.get("status") in (FAILED, SKIPPED)}
    rerun: set[str] = set()
    if retry_failed and failed:
        rerun = _closure(failed, graph.consumers)
    # A failed mapped task that is not downstream of another rerun keeps its
    # passed instances and reruns the rest.
    downstream = _closure(failed, graph.consumers) - failed if rerun else set()
    partial = {n for n in rerun if graph.tasks[n].fans_out and n not in downstream}
    selected = _closure(targets, graph.waits_for) if targets else None
    kept = {n: r for n, r in records.items() if n not in rerun}
    # a producer whose temporaries were freed runs again before a dependant
    # that stages them (docs/spec/run.md, "Temporary files")
    again = rerun_for_freed(
        sd.state, graph.tasks, lambda c: c not in kept and (selected is None or c in selected)
    )
    for name in again:
        kept.pop(name, None)
        rerun.add(name)
    reasons: dict[str, tuple[str, str]] = {}
    for name in graph.order:
        if name in again:
            reasons[name] = ("run", again[name])
        elif name in kept:
            reasons[name] = ("keep", f"{kept[name].get('status')} in an earlier session")
        elif selected is not None and name not in selected:
            reasons[name] = ("not selected", "not a --target or an ancestor of one")
        elif name in failed and name in rerun:
            reasons[name] = ("run", f"{records[name].get('status')} before (--retry-failed)")
        elif name in rerun:
            reasons[name] = ("run", "downstream of a unit that runs again")
        elif name in started_tasks:
            reasons[name] = ("run", UNSETTLED)
        else:
            reasons[name] = ("run", "new")
    return Selection(kept, rerun, partial, selected, reasons, units_started)


def apply(sd: StateDir, graph: TaskGraph, selection: Selection) -> None:
    """Remove the records of what runs again: a rerun task's record and its
    instances' (a partly rerun mapped task keeps its passed instances)."""
    for name in selection.rerun:
        sd.remove_result(name)
        with contextlib.suppress(FileNotFoundError):  # its temporaries are made again
            os.unlink(freed_marker(sd.state, name))
        if graph.tasks[name].map is None:
            continue
        # its instances' records: one tombstone line each (a partly rerun task
        # keeps its passed ones)
        records = None
        if name in selection.partial:
            with contextlib.suppress(CrucibleError):  # a damaged file runs them all
                records = sd.load_all(name)
        if records is None:
            sd.remove_results(name, None)
        else:
            sd.remove_results(name, [k for k, r in records.items() if r.get("status") != PASSED])


def _instance_lines(
    sd: StateDir,
    name: str,
    selection: Selection,
    keys: list[str] | None = None,
) -> list[dict[str, Any]]:
    """A mapped task's instances, when its map source is already settled (or
    ``keys``: a static fan-out's, known before the run)."""
    if keys is None:
        try:
            keys = [key for key, _ in sd.map_items(name)]
        except CrucibleError:
            return []
    lines = []
    records: Mapping[str, dict[str, Any]] = {}
    with contextlib.suppress(CrucibleError):
        records = sd.load_all(name)
    for key in keys:
        record = records.get(key)
        status = None if record is None else record.get("status")
        if status is None and (name, key) in selection.started:
            action, why = "run", UNSETTLED
        elif status is None:
            action, why = "run", "new"
        elif name not in selection.rerun or (name in selection.partial and status == PASSED):
            action, why = "keep", f"{status} in an earlier session"
        elif name in selection.partial:
            action, why = "run", f"{status} before (--retry-failed)"
        else:
            action, why = "run", "downstream of a unit that runs again"
        lines.append({"task": name, "key": key, "action": action, "reason": why})
    return lines


def _static_keys(task: Task, params: Any, sd: StateDir) -> list[str] | None:
    """A static fan-out's instance keys (a matrix, a literal or param map), or
    None when it is not one or cannot expand (the run reports why)."""
    # lazy: run.engine._matrix is not loaded with this module; only _static_keys() needs it
    from crucible.run.engine._matrix import FanoutFailed, expand, is_static

    if params is None or not is_static(task):
        return None
    try:
        return [key for key, _ in expand(task, params, sd.state)]
    except (FanoutFailed, CrucibleError):
        return None


def dry_run_lines(
    sd: StateDir,
    graph: TaskGraph,
    selection: Selection,
    params: Any = None,
) -> list[dict[str, Any]]:
    """One entry per unit: ``task``, ``key``?, ``action`` (run, keep, not selected)
    and ``reason``. A static fan-out's instances are listed from ``params``;
    a mapped task's once its map source has settled; before that, the task's
    line says when they will be known."""
    lines: list[dict[str, Any]] = []
    for name in graph.order:
        action, why = selection.reasons[name]
        task = graph.tasks[name]
        source = task.map
        if action == "run":
            keys = _static_keys(task, params, sd)
            if keys:
                lines.extend(_instance_lines(sd, name, selection, keys))
                continue
            if keys is not None:
                why += "; no instances"
                if task.skips_when_empty:  # issue 32
                    why += ': settles skipped (on_empty = "skip")'
        if action == "run" and isinstance(source, Ref):
            instances = []
            if selection.reasons.get(source.producer, ("",))[0] == "keep":
                instances = _instance_lines(sd, name, selection)
            if instances:
                lines.extend(instances)
                continue
            why += f"; instances: one per item of {source.text} once it settles"
        elif action == "run" and task.fans_out:
            # a listed fan-out (count, list) or a matrix: its instances are known now
            instances = _instance_lines(sd, name, selection)
            if instances:
                lines.extend(instances)
                continue
        lines.append({"task": name, "action": action, "reason": why})
    return lines

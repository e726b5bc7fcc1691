"""A resume's last check that no earlier attempt still runs (issue 27 item 3).

The local executor's reaper kills a killed dispatcher's tasks and holds the
state lock until they are dead (crucible.run.executors._reaper, crucible.run.session._lock). Should
the reaper itself have been killed too (``kill -9 -1``, the OOM killer), a task
could still run when ``--resume`` starts its unit again. So a resume looks up
each unit the session log shows started (``task_started``, with its process
group ``pid``) and never finished: a process of that group whose environment
names a workspace of this state dir (``CRUCIBLE_WORKSPACE=STATE/work/…``: a
recycled pid is never mistaken for it) is that attempt, still running. Its group
gets SIGTERM, SIGKILL after the kill grace, and the resume starts nothing until
it is gone (docs/spec/run.md, "Orphans"). A resume after a clean stop finds no
such unit and costs nothing more than reading the log.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from crucible.core.errors import OperationalError
from crucible.run.executors._environ import workspace_marker

__all__ = ["stop_leftovers"]

#: how long a leftover group may take to die after its SIGKILL
_GONE_WITHIN = 5.0


def stop_leftovers(
    state: Path,
    unfinished: Mapping[tuple[str, str | None], int],
    grace: float,
    warn: Callable[[str], None] | None = None,
) -> None:
    """Stop what is left running of ``unfinished``: the units started (each
    with its process group) and never finished, as the earlier sessions' log
    says (crucible.run.session._earlier; see module doc)."""
    candidates = {
        pgid: unit for unit, pgid in unfinished.items() if pgid > 1 and _group_exists(pgid)
    }
    if not candidates:
        return
    # as this session spells the state dir, and as its real path
    markers = tuple(
        workspace_marker(spelling)
        for spelling in dict.fromkeys((str(state), os.path.realpath(state)))
    )
    ours = {pgid: unit for pgid, unit in candidates.items() if _runs_here(pgid, markers)}
    for pgid, (task, key) in ours.items():
        label = task if key is None else f"{task}[{key}]"
        if warn is not None:
            warn(
                f"--resume: {label!r}'s attempt of an earlier session still runs "
                f"(process group {pgid}); it is stopped before anything starts"
            )
        _stop(pgid, grace, markers)
        if _runs_here(pgid, markers):
            raise OperationalError(
                f"{label!r}'s attempt of an earlier session (process group {pgid}) "
                "would not die; resume once it is gone",
                where=str(state),
            )


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's group: never a task of ours
    return True


def _runs_here(pgid: int, markers: tuple[bytes, ...]) -> bool:
    """Whether a live process of group ``pgid`` carries one of ``markers`` in its
    environment (a zombie has none)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return False
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
            if int(fields[2]) != pgid:  # state, ppid, pgrp
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                if any(v.startswith(markers) for v in f.read().split(b"\0")):
                    return True
        except (OSError, IndexError, ValueError):
            continue
    return False


def _stop(pgid: int, grace: float, markers: tuple[bytes, ...]) -> None:
    """SIGTERM, then SIGKILL after ``grace``; wait until nothing of it runs (a
    zombie left for init to reap does not count: it has no environment)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, _GONE_WITHIN)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not _runs_here(pgid, markers):
                return
            time.sleep(0.05)

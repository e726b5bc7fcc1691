"""Workspace recycling (docs/spec/run.md, "State directory"; issue 14).

A keyed unit — a fan-out instance, a loop revision — that passed and whose
workspace holds nothing but the ``inputs/`` tree stage laid there gives its
workspace back: it is renamed (never deleted: a mass deletion is what this
journal-less ext4 does slowest) into its task's pool,
``STATE/work/<task>/@free-<pid>-<n>``. The next keyed unit of the same task
takes one by renaming it to its own ``work/<task>/<escaped key>`` — so its
``CRUCIBLE_WORKSPACE`` is today's path — and stage restages the tree there in
place (inputs.md 3.8). A task name never starts with ``@`` and an escaped key
never contains one, so a pool name collides with neither; a rename is atomic,
so two workers (or two threads of a Dask worker) never take the same one.

Each worker process knows the names it freed itself, and lists a task's
directory when it has none left (leftovers of a killed run, and workspaces
another worker freed, are reused that way; a bounded share of the time, see
``_take``), so taking one costs a rename, not a listing per unit. A failed unit, one whose task left
anything else in its workspace, an unkeyed unit and every unit under
``--keep-workspaces`` keep their workspace as before.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
import threading
import time
from pathlib import Path

__all__ = ["FREE_PREFIX", "WorkspacePool"]

#: a pool entry's name starts with this (stage's '@' namespace)
FREE_PREFIX = "@free-"
#: a process with no free workspace of a task left lists its pool again at
#: most this often (seconds), and at most once per RELIST_SHARE times the
#: last listing's duration
RELIST_AFTER = 0.005
RELIST_SHARE = 50
#: entries a recyclable workspace may hold: the staged tree (or nothing)
_RECYCLABLE: tuple[list[str], ...] = ([], ["inputs"])


class WorkspacePool:
    """One process's view of the per-task pools of free workspaces."""

    def __init__(self, *, keep: bool) -> None:
        self.keep = keep
        self._free: dict[Path, list[str]] = {}
        #: when each pool may be listed again (monotonic)
        self._listed: dict[Path, float] = {}
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)

    def acquire(self, key: str | None, workspace: Path) -> bool:
        """Rename a free workspace of the same task to ``workspace``; True when
        one was taken (stage it in place), False when there is none or
        ``workspace`` already exists (a retry, a resumed unit: staged as before)."""
        if self.keep or key is None or os.path.lexists(workspace):
            return False
        pool = workspace.parent
        while (name := self._take(pool)) is not None:
            try:
                os.rename(pool / name, workspace)
            except FileNotFoundError:
                continue  # taken by another worker
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                    return False  # the workspace appeared meanwhile
                continue
            return True
        return False

    def _take(self, pool: Path) -> str | None:
        with self._lock:
            free = self._free.setdefault(pool, [])
            if not free:
                # Listed at the first need, and again when this process has none
                # left: a unit staged by one worker and started by another (a
                # pipelined worker's handback, run.md) frees its workspace into
                # the other's list. Listing again waits RELIST_SHARE times as
                # long as the last listing took (at least RELIST_AFTER), so a
                # task whose units all keep their workspaces (all failed: a
                # miss per unit, a directory that grows) spends at most ~2 %
                # of the time listing it.
                now = time.monotonic()
                allowed = self._listed.get(pool)
                if allowed is None or now >= allowed:
                    with contextlib.suppress(OSError):
                        free.extend(n for n in os.listdir(pool) if n.startswith(FREE_PREFIX))
                    took = time.monotonic() - now
                    self._listed[pool] = now + max(RELIST_AFTER, RELIST_SHARE * took)
            return free.pop() if free else None

    def release(self, key: str | None, workspace: Path) -> bool:
        """After a passed attempt: give ``workspace`` to its task's pool when it
        holds only what stage laid there; True when it was."""
        if self.keep or key is None or not recyclable(workspace):
            return False
        pool = workspace.parent
        for _ in range(16):
            name = f"{FREE_PREFIX}{os.getpid()}-{next(self._numbers)}"
            try:
                os.rename(workspace, pool / name)
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    continue  # a leftover of an earlier process with our pid
                return False
            with self._lock:
                self._free.setdefault(pool, []).append(name)
            return True
        return False


def recyclable(workspace: Path) -> bool:
    """A real directory holding nothing, or only a real ``inputs`` directory."""
    try:
        if not stat.S_ISDIR(os.lstat(workspace).st_mode):
            return False
        names = sorted(os.listdir(workspace))
        if names not in _RECYCLABLE:
            return False
        return not names or stat.S_ISDIR(os.lstat(workspace / "inputs").st_mode)
    except OSError:
        return False

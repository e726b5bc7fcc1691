"""One dispatcher per state directory: an exclusive ``flock`` on ``STATE/lock``.

The lock is taken before anything in the state dir is read for admission and
held until the session's last event is durable. ``flock`` belongs to the open
file description, which the forked workers share: a dispatcher killed outright
keeps its state locked until its last worker (which kills its task) is gone.
The descriptor is close-on-exec, so no task holds it. The holder writes its pid
into the file, so a second dispatcher is refused naming it
(docs/spec/run.md, "State directory"). Its path is ``StateLayout.lock_path``.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from crucible.core.errors import InputRefused, OperationalError, UsageError
from crucible.core.fdio import write_all

__all__ = ["REAPER_WAIT", "StateLock"]

#: how long a dispatcher waits for a lock held by the reaper of a killed
#: dispatcher's tasks (it sends SIGTERM, then SIGKILL after the kill grace)
REAPER_WAIT = 15.0


class StateLock:
    """The held lock of one state dir (:meth:`release` is idempotent)."""

    def __init__(self, state: Path) -> None:

        # lazy: stage is not loaded with this module; only __init__() needs it
        from crucible.stage import StateLayout

        self.path = StateLayout(state).lock_path
        try:
            # O_NOFOLLOW: a symlink planted as the lock is refused, never followed.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno == 40:  # ELOOP: a symlink
                raise UsageError(
                    "the lock is a symlink; links are not followed", where=str(self.path)
                ) from None
            raise OperationalError(
                f"cannot open the state lock: {exc.strerror}", where=str(self.path)
            ) from None
        try:
            _take(fd)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            if holder.isdigit() and not _alive(int(holder)):
                raise InputRefused(
                    f"the tasks of a dispatcher that is gone (pid {holder}) are still being "
                    f"stopped after {REAPER_WAIT:g} s; try again once they are",
                    where=str(state),
                ) from None
            raise InputRefused(
                f"another dispatcher (pid {holder}) is running on this state dir",
                where=str(state),
            ) from None
        except OSError as exc:
            os.close(fd)
            raise OperationalError(
                f"cannot lock the state dir: {exc.strerror}", where=str(self.path)
            ) from None
        try:
            os.ftruncate(fd, 0)
            write_all(fd, b"%d\n" % os.getpid())
        except OSError:
            pass  # the lock holds without the pid; a refusal then names none
        self._fd: int | None = fd

    def fileno(self) -> int:
        """The locked descriptor (the local executor's reaper holds it too)."""
        assert self._fd is not None
        return self._fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def _take(fd: int) -> None:
    """Take the lock, or raise BlockingIOError. A lock whose holder named in the
    file is gone is held by the reaper of a killed dispatcher's tasks
    (crucible.run.executors._reaper), which lets go once those tasks are dead: it is
    waited for, up to REAPER_WAIT, so a ``--resume`` never starts a unit whose
    previous attempt may still run."""
    # lazy: not loaded with this module; only _take() needs it
    import fcntl

    deadline: float | None = None
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            holder = _holder(fd)
            if not holder.isdigit() or _alive(int(holder)):
                raise
            now = time.monotonic()
            if deadline is None:
                deadline = now + REAPER_WAIT
            elif now >= deadline:
                raise
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (its parent has not reaped it yet) holds nothing
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2][:2] != b" Z"
    except OSError:
        return True


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"

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
from pathlib import Path

from crucible.core.errors import InputRefused, OperationalError, UsageError
from crucible.core.fdio import write_all

__all__ = ["StateLock"]


class StateLock:
    """The held lock of one state dir (:meth:`release` is idempotent)."""

    def __init__(self, state: Path) -> None:
        import fcntl

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
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
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

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"

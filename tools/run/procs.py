"""Task processes: each in its own session (so its own process group), killed as a group.

A task's leader is started with ``start_new_session``; everything it forks stays in
that group unless it calls ``setsid`` itself. Killing the group (``killpg``) reaches
grandchildren, which is what a timeout and an interrupt need. Exits are watched
through a pidfd, so the dispatcher's event loop can ``select`` on task exits, its
signal wake-up fd and the next deadline at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["TaskProcess", "kill_group", "spawn"]


@dataclass
class TaskProcess:
    """A running task leader: its pid (== its process group id) and a pidfd."""

    popen: subprocess.Popen[bytes]
    pidfd: int
    started: float
    deadline: float | None = None
    #: set when the dispatcher decided to stop it (timeout or interrupt)
    stop_reason: str | None = None
    kill_at: float | None = None
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def reap(self) -> int:
        """Collect the leader's exit status (it has exited: the pidfd was readable).

        Returns the exit code, or ``-signum`` for a leader killed by a signal, and
        kills whatever the leader left behind in its group: a task's processes do
        not outlive it."""
        # The leader is a zombie until waited for, so its pid (the group id) cannot
        # be reused yet: kill the group first, then reap.
        kill_group(self.pid, signal.SIGKILL)
        code = self.popen.wait()
        with contextlib.suppress(OSError):
            os.close(self.pidfd)
        return code


_resolved: dict[tuple[str, str | None], str | None] = {}


def _executable(argv0: str, path: str | None) -> str | None:
    """argv[0] resolved on ``path`` once per (name, PATH): exec'ing a bare name
    makes the child try every PATH entry in turn, a failed execve each."""
    if "/" in argv0:
        return None
    key = (argv0, path)
    if key not in _resolved:
        import shutil

        _resolved[key] = shutil.which(argv0, path=path if path is not None else os.defpath)
    return _resolved[key]


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    log_fd: int,
    started: float,
    deadline: float | None,
) -> TaskProcess:
    """Start ``argv`` in a new session with stdin from /dev/null and stdout+stderr
    appended to ``log_fd``. Raises OSError when the program cannot be started."""
    popen = subprocess.Popen(
        list(argv),
        executable=_executable(argv[0], env.get("PATH")),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=log_fd,
        stderr=log_fd,
        start_new_session=True,
    )
    try:
        pidfd = os.pidfd_open(popen.pid)
    except OSError:
        kill_group(popen.pid, signal.SIGKILL)
        popen.wait()
        raise
    return TaskProcess(popen=popen, pidfd=pidfd, started=started, deadline=deadline)


def kill_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; False when the group is gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True

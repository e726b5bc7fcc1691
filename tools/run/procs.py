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
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SpawnJob", "Spawner", "TaskProcess", "kill_group", "spawn"]


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


@dataclass
class SpawnJob:
    """One process to start: what :func:`spawn` needs, its log, and who asked."""

    owner: Any
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log_path: Path
    header: bytes
    timeout: float | None
    #: set by the spawner: the process, or why it could not start
    proc: TaskProcess | None = None
    error: Exception | None = None


class Spawner:
    """Starts task processes on one thread of its own.

    ``subprocess`` starts a child with ``vfork``: the calling thread waits until
    the child has exec'd, ~0.5 ms per task that the scheduling thread would
    otherwise spend blocked (CPython releases the GIL around ``vfork``). Finished
    jobs are queued and announced with a byte on :attr:`wake_fd`, which the
    dispatcher's ``select`` watches beside task exits. Start it only after every
    ``fork`` of the dispatcher (a forked child would not have this thread).
    """

    def __init__(self) -> None:
        import queue
        import threading

        self.wake_fd, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._jobs: queue.SimpleQueue[SpawnJob | None] = queue.SimpleQueue()
        self._done: deque[SpawnJob] = deque()
        self.in_flight = 0
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="spawner", daemon=True)
        self._thread.start()

    def submit(self, job: SpawnJob) -> None:
        self.in_flight += 1
        self._jobs.put(job)

    def finished(self) -> list[SpawnJob]:
        """Every job done since the last call (call when :attr:`wake_fd` is readable)."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self.wake_fd, 512):
                pass
        done: list[SpawnJob] = []
        while self._done:
            done.append(self._done.popleft())
        self.in_flight -= len(done)
        return done

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job.proc = self._start(job)
            except Exception as exc:  # handed to the dispatcher: never lost in a thread
                job.error = exc
            self._done.append(job)
            with contextlib.suppress(BlockingIOError):
                os.write(self._wake_w, b"s")

    @staticmethod
    def _start(job: SpawnJob) -> TaskProcess:
        try:  # a staging worker created it (creating an inode is slow on a busy disk)
            log_fd = os.open(job.log_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except FileNotFoundError:  # removed since: create it again
            log_fd = os.open(
                job.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644
            )
        try:
            os.write(log_fd, job.header)
            now = time.monotonic()
            return spawn(
                job.argv,
                env=job.env,
                cwd=job.cwd,
                log_fd=log_fd,
                started=now,
                deadline=None if job.timeout is None else now + job.timeout,
            )
        finally:
            os.close(log_fd)

    def close(self) -> list[SpawnJob]:
        """Stop the thread (after the jobs already queued); return jobs not yet
        collected, so the caller can stop what they started. Idempotent."""
        if self._closed:
            return []
        self._closed = True
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()
        left = self.finished()
        for fd in (self.wake_fd, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        return left

"""A reaper beside a process that starts tasks: kills their groups if it dies.

A task's process group is killed by the process that started it (its parent:
see :mod:`crucible.run.executors._unit`). A Dask worker that is SIGKILLed (or dies of
the OOM killer, or of its host's nanny) cannot: its running tasks would go on,
orphaned, while the dispatcher retries their units elsewhere. So each worker
process starts one reaper, a tiny interpreter in its own session (no signal
sent to the worker's group reaches it), reading a pipe whose only write end
the worker holds (close-on-exec: no task inherits it). The worker writes
``+PGID`` when a task starts and ``-PGID`` once it was reaped (and ``?PID``
before a start, ``=PID`` after it: see :meth:`Reaper.spawning`). When the pipe
reports end of file, the worker is gone, by exit or by death (the reaper sleeps
on that hang-up alone and reads the registrations every :data:`DRAIN_MS` and at
the end, so a task costs it no wake-up): the reaper sends
SIGTERM to every group still registered, SIGKILL to those left after the kill
grace, and exits. A worker that exits cleanly has nothing registered.

The local executor starts one reaper for the session's workers, before it
forks them (they inherit its pipe, and each registers the groups it starts:
:func:`crucible.run.executors._procs.watch_groups`); that reaper also holds the state
lock until it exits, so a ``--resume`` after a SIGKILL of the dispatcher's
whole process group waits until the killed run's tasks are gone.

The reaper runs ``python -I -S`` on the code in :data:`_CODE` (no crucible
import, nothing from the environment), so it starts in a few milliseconds and
needs nothing from the worker's ``sys.path``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Any

__all__ = ["Reaper"]

_CODE = r"""
import os, select, signal, sys, time
grace, drain = float(sys.argv[1]), int(sys.argv[2])
marker = os.fsencode(sys.argv[3]) if len(sys.argv) > 3 else b""
groups = set()
spawning = set()
buf = b""
os.set_blocking(0, False)
hangup = select.poll()
hangup.register(0, 0)
ended = False
while not ended:
    ended = bool(hangup.poll(drain))
    while True:
        try:
            chunk = os.read(0, 65536)
        except BlockingIOError:
            break
        if not chunk:
            ended = True
            break
        buf += chunk
    *lines, buf = buf.split(b"\n")
    for line in lines:
        if line[:1] == b"+":
            groups.add(int(line[1:]))
        elif line[:1] == b"-":
            groups.discard(int(line[1:]))
        elif line[:1] == b"?":
            spawning.add(line[1:])
        elif line[:1] == b"=":
            spawning.discard(line[1:])
def orphans():  # run.session._leftovers' scan, by session (it cannot import crucible)
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/" + entry + "/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
            if fields[3] != entry.encode():
                continue
            with open("/proc/" + entry + "/environ", "rb") as f:
                if any(v.startswith(marker) for v in f.read().split(b"\0")):
                    found.add(int(entry))
        except (OSError, IndexError):
            pass
    return found
if spawning and marker:
    groups |= orphans()
def send(sig):
    alive = set()
    for g in groups:
        try:
            os.killpg(g, sig)
            alive.add(g)
        except OSError:
            pass
    return alive
groups = send(signal.SIGTERM)
deadline = time.monotonic() + grace
while groups and time.monotonic() < deadline:
    time.sleep(0.05)
    groups = send(0)
send(signal.SIGKILL)
"""

#: how often (ms) the reaper reads what was registered. It sleeps on the pipe's
#: hang-up only (poll with no event asked: POLLHUP is always reported), not on
#: its data: a registration written to a reader blocked in read(2) wakes that
#: process, two wake-ups and context switches per task (measured: 2 of the 7.6
#: context switches a no-op task cost, and ~5 % of a 1,000-task run's CPU). The
#: pipe (64 KiB: ~4,000 tasks' registrations) is drained this often, and whole
#: at the hang-up, which is when the registrations are needed.
DRAIN_MS = 250


class Reaper:
    """The reaper of this process's tasks (started by :meth:`start`, or at the
    first :meth:`watch`). Start it before the first task: a task's group is
    covered from the moment its ``+PGID`` is written, and starting the reaper
    takes a few milliseconds a dying worker may not have."""

    def __init__(
        self, grace: float, hold_fds: tuple[int, ...] = (), marker: bytes | None = None
    ) -> None:
        self._grace = grace
        #: an environment entry's start that only this run's tasks have
        #: (crucible.run.executors._environ.workspace_marker): how the reaper finds a task
        #: whose start was under way when its starter died (:meth:`spawning`)
        self._marker = marker
        #: descriptors the reaper holds until it exits: the local executor's
        #: state lock, so no other dispatcher takes the state dir while a task
        #: of this one may still run (docs/spec/run.md, "Orphans")
        self._hold_fds = hold_fds
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._pid: int | None = None

    def _start(self) -> int:
        # posix_spawn, not subprocess: a plain run must not import subprocess
        # (its start-up budget), and the reaper needs nothing Popen adds
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        actions: list[tuple[Any, ...]] = [
            (os.POSIX_SPAWN_DUP2, read_end, 0),
            (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ]
        # each held descriptor at 3, 4, ...: dup2 leaves the copy open across exec
        actions += [(os.POSIX_SPAWN_DUP2, fd, 3 + i) for i, fd in enumerate(self._hold_fds)]
        try:
            self._pid = os.posix_spawn(
                sys.executable,
                [sys.executable, "-I", "-S", "-c", _CODE, str(self._grace), str(DRAIN_MS)]
                + ([self._marker] if self._marker else []),
                {},
                file_actions=actions,
                setsid=True,
            )
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        return write_end

    def start(self) -> None:
        with self._lock:
            if self._fd is None:
                self._fd = self._start()

    def _send(self, line: bytes) -> None:
        with self._lock:
            if self._fd is None:
                self._fd = self._start()
            with contextlib.suppress(OSError):  # a dead reaper never fails a task
                os.write(self._fd, line)

    def spawning(self) -> None:
        """This process is about to start a task. A task runs from its exec on,
        before :meth:`watch` can name its group: should this process die in
        between, the reaper looks for it by its environment (the marker) among
        the session leaders, once, at the hang-up."""
        self._send(b"?%d\n" % os.getpid())

    def watch(self, pgid: int) -> None:
        """A task group started: kill it should this process die."""
        self._send(b"+%d\n=%d\n" % (pgid, os.getpid()))

    def spawn_failed(self) -> None:
        """The start announced by :meth:`spawning` started nothing."""
        self._send(b"=%d\n" % os.getpid())

    def forget(self, pgid: int) -> None:
        """The task's group was killed and its leader reaped."""
        self._send(b"-%d\n" % pgid)

    @property
    def pid(self) -> int | None:
        return self._pid

    def close(self) -> None:
        """End the reaper (it kills what is still registered) and reap it."""
        with self._lock:
            fd, self._fd = self._fd, None
            pid, self._pid = self._pid, None
        if fd is not None:
            os.close(fd)
        if pid is not None:
            _reap(pid, self._grace + 5)


def _reap(pid: int, timeout: float) -> None:
    """Wait up to ``timeout`` seconds for the reaper to exit, and reap it."""
    # lazy: not loaded with this module; only _reap() needs it
    import select

    deadline = time.monotonic() + timeout
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            left = deadline - time.monotonic()
            if left <= 0:
                return  # left to init; it exits once it has killed what it holds
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                time.sleep(min(left, 0.01))
                continue
            try:
                select.select([pidfd], [], [], left)
            finally:
                os.close(pidfd)

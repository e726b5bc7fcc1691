"""Task processes: each in its own session (so its own process group), killed as a group.

A task's leader is started with ``posix_spawn`` and ``setsid``; everything it
forks stays in that group unless it calls ``setsid`` itself. Killing the group
(``killpg``) reaches grandchildren, which is what a timeout and an interrupt
need. Exits are watched through a pidfd, so the dispatcher's event loop can
``select`` on task exits, its signal wake-up fd and the next deadline at once.

Why ``posix_spawn`` and not ``subprocess``: it starts the child with one
``clone(CLONE_VM | CLONE_VFORK)`` and no Python in between, half of
``Popen``'s CPU per start (measured ~75 us against ~145 us), on the
dispatcher's own thread: no second thread, so no GIL hand-offs per task.
What ``Popen`` would do for us is done here by hand: the working directory
(the calling thread changes into it around the spawn: ``posix_spawn`` has no
chdir action before Python 3.13), stdin from ``/dev/null`` (an agent's:
its prompt file), every signal
back to its default and none blocked, and no inherited descriptors (every
descriptor the dispatcher holds is close-on-exec: :func:`close_inherited`).
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from crucible.core.fsio import which
from crucible.core.structs import dataclass
from crucible.run.executors._usage import self_peak_rss_kib

if TYPE_CHECKING:
    from crucible.run.executors._sandbox import SandboxSpec

__all__ = ["TaskProcess", "close_inherited", "kill_group", "spawn", "watch_groups"]

#: reset to SIG_DFL in the child, every one of them: an ignored signal stays
#: ignored across exec, and the worker that spawns a task ignores SIGINT and
#: SIGTERM (the dispatcher decides what they mean), Python ignores SIGPIPE and
#: SIGXFSZ, and the dispatcher may itself have been started with some ignored
#: (``nohup``, a CI runner). A task starts as make's and sh's children do: every
#: disposition default, nothing blocked. (glibc's own two real-time signals, 32
#: and 33, are left ignored by its posix_spawn and cannot be named here; every
#: program that uses them installs its handlers at start.) Measured: no
#: difference in the cost of a spawn against resetting two signals.
_DEFAULT_SIGNALS = tuple(
    s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)
)


class GroupWatcher(Protocol):
    """Who kills the started groups should their starter die (crucible.run.executors._reaper)."""

    def spawning(self) -> None: ...

    def watch(self, pgid: int) -> None: ...

    def spawn_failed(self) -> None: ...

    def forget(self, pgid: int) -> None: ...


#: this process's watcher: set by the local executor before it forks its
#: workers, which inherit it (their spawns register, their reaps forget)
_watcher: GroupWatcher | None = None


def watch_groups(watcher: GroupWatcher | None) -> None:
    """Register every group :func:`spawn` starts from now on with ``watcher``
    (None: stop), and forget it once :meth:`TaskProcess.reap` reaped it."""
    global _watcher
    _watcher = watcher


@dataclass
class TaskProcess:
    """A running task leader: its pid (== its process group id) and a pidfd."""

    pid: int
    pidfd: int
    started: float
    deadline: float | None = None
    #: set when the dispatcher decided to stop it (timeout or interrupt)
    stop_reason: str | None = None
    kill_at: float | None = None
    #: the spawner's peak RSS right after the spawn (crucible.run.executors._usage)
    spawner_rss_kib: int | None = None
    #: what the leader and the descendants waited for cost (``wait4``'s
    #: rusage), set by :meth:`reap`; None until then, or where it cannot be read
    usage: Any = None

    def reap(self) -> int:
        """Collect the leader's exit status (it has exited: the pidfd was readable).

        Returns the exit code, or ``-signum`` for a leader killed by a signal, and
        kills whatever the leader left behind in its group: a task's processes do
        not outlive it. ``wait4`` also hands back what the task cost
        (:attr:`usage`), for free: no second system call."""
        # The leader is a zombie until waited for, so its pid (the group id) cannot
        # be reused yet: kill the group first, then reap.
        kill_group(self.pid, signal.SIGKILL)
        while True:
            try:
                _, status, self.usage = os.wait4(self.pid, 0)
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries
                continue
        with contextlib.suppress(OSError):
            os.close(self.pidfd)
        if _watcher is not None:  # its group is dead: nothing left to kill
            _watcher.forget(self.pid)
        return os.waitstatus_to_exitcode(status)


_resolved: dict[tuple[str, str | None], str | None] = {}


def _executable(argv0: str, path: str | None) -> str:
    """argv[0] resolved on ``path`` once per (name, PATH): exec'ing a bare name
    makes the child try every PATH entry in turn, a failed execve each."""
    if "/" in argv0:
        return argv0
    key = (argv0, path)
    if key not in _resolved:
        _resolved[key] = which(argv0, path if path is not None else os.defpath)
    found = _resolved[key]
    if found is None:
        raise FileNotFoundError(2, "No such file or directory", argv0)
    return found


def close_inherited() -> None:
    """Mark every descriptor above stderr close-on-exec, so no task inherits one
    (what ``Popen(close_fds=True)`` does per start, done once here). Descriptors
    Python opens are close-on-exec already; this catches those the dispatcher
    inherited, such as a make jobserver's pipe."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: every descriptor up to the soft limit
        fds = list(range(3, min(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 65536)))
    for fd in fds:
        if fd > 2:
            with contextlib.suppress(OSError):
                os.set_inheritable(fd, False)


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    log_fd: int,
    started: float,
    deadline: float | None,
    stdin: str = os.devnull,
    stdout_fd: int | None = None,
    sandbox: SandboxSpec | None = None,
) -> TaskProcess:
    """Start ``argv`` in a new session in ``cwd``, with stdin opened read-only
    from ``stdin`` (an absolute path: /dev/null, or an agent's prompt file) and
    stdout+stderr on ``log_fd`` (stdout on ``stdout_fd`` when given: an
    agent's, see crucible.run.executors._agent_io). Raises OSError when the program cannot
    be started (ValueError for a NUL in argv or env: a bug of the caller).
    With ``sandbox``, the task starts sandboxed (crucible.run.executors._sandbox)."""
    watcher = _watcher
    if watcher is not None:  # the task runs before watch() can name it
        watcher.spawning()
    try:
        if sandbox is not None:
            # lazy: run.executors._sandbox is not loaded with this module; only spawn() needs it
            from crucible.run.executors._sandbox import sandboxed

            pid = sandboxed(
                sandbox,
                argv,
                str(cwd),
                lambda args: _posix_spawn(args, env, cwd, stdin, log_fd, stdout_fd),
            )
        else:
            pid = _posix_spawn(argv, env, cwd, stdin, log_fd, stdout_fd)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            kill_group(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise
    except BaseException:
        if watcher is not None:
            watcher.spawn_failed()
        raise
    if watcher is not None:
        watcher.watch(pid)
    return TaskProcess(
        pid=pid,
        pidfd=pidfd,
        started=started,
        deadline=deadline,
        spawner_rss_kib=self_peak_rss_kib(),
    )


def _posix_spawn(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path,
    stdin: str,
    log_fd: int,
    stdout_fd: int | None,
) -> int:
    executable = _executable(argv[0], env.get("PATH"))
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, stdin, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, log_fd if stdout_fd is None else stdout_fd, 1),
        (os.POSIX_SPAWN_DUP2, log_fd, 2),
    ]
    # O_PATH: coming back needs no read permission on the directory we left
    here = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.chdir(cwd)
        try:
            pid = os.posix_spawn(
                executable,
                list(argv),
                env,
                file_actions=actions,
                setsid=True,
                setsigdef=_DEFAULT_SIGNALS,
                setsigmask=(),
            )
        finally:
            os.fchdir(here)
    finally:
        os.close(here)
    return pid


def kill_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; False when the group is gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True

"""The reaper sleeps through registrations (tools/run/executors/_reaper.py):
a task's ``+PGID``/``-PGID`` costs it no wake-up, and what was registered is
still read, and killed, at the hang-up."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from crucible.run.executors._environ import workspace_marker
from crucible.run.executors._reaper import DRAIN_MS, Reaper


def _switches(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches")


def test_registrations_do_not_wake_the_reaper() -> None:
    reaper = Reaper(grace=1.0)
    reaper.start()
    pid = reaper.pid
    assert pid is not None
    try:
        time.sleep(0.2)  # its start-up done
        before = _switches(pid)
        started = time.monotonic()
        for n in range(500):  # no such groups: only the messages matter
            reaper.watch(4_000_000 + n)
            reaper.forget(4_000_000 + n)
            time.sleep(0.0005)
        elapsed = time.monotonic() - started
        woken = _switches(pid) - before
        # a reader blocked in read(2) would wake for (nearly) every message: ~1,000
        drains = elapsed * 1000 / DRAIN_MS
        assert woken <= drains + 10, (woken, drains)
    finally:
        reaper.close()


def test_a_registration_is_read_at_the_hang_up(tmp_path: Path) -> None:
    """Registered just before the hang-up (well inside one drain period): the
    group is still killed."""
    leader = os.fork()
    if leader == 0:  # a group of its own that would live for a minute
        os.setsid()
        time.sleep(60)
        os._exit(0)
    try:
        reaper = Reaper(grace=1.0)
        reaper.start()
        time.sleep(0.2)
        reaper.watch(leader)
        reaper.close()  # the hang-up: reads +leader, kills its group, exits
        _, status = os.waitpid(leader, 0)
        assert os.WIFSIGNALED(status)
        assert os.WTERMSIG(status) in (signal.SIGTERM, signal.SIGKILL)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(leader, signal.SIGKILL)


def _marked_leader(marker: bytes) -> int:
    """A session leader whose environment holds ``marker`` (as a task's holds
    CRUCIBLE_WORKSPACE), living for a minute unless killed."""
    name, _, value = os.fsdecode(marker).partition("=")
    return os.posix_spawn(
        "/bin/sleep", ["sleep", "60"], {**os.environ, name: value + "t"}, setsid=True
    )


def _killed_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.WIFSIGNALED(status)
        time.sleep(0.02)
    return False


def test_a_task_started_but_not_yet_registered_dies_with_its_starter(tmp_path: Path) -> None:
    """The starter died between the task's exec and its ``+PGID`` (the window
    a SIGKILL of the whole dispatcher group can hit): the reaper finds the task
    by its environment among the session leaders and kills its group. One
    whose start was settled (watched, or failed) is left to the registrations:
    a clean exit scans nothing."""
    marker = workspace_marker(tmp_path)
    in_flight = _marked_leader(marker)
    bystander = _marked_leader(workspace_marker(tmp_path / "other"))
    try:
        reaper = Reaper(grace=1.0, marker=marker)
        reaper.start()
        reaper.spawning()  # ... and its starter dies before watch()
        reaper.close()
        assert _killed_within(in_flight, 10), "the task outlived its starter"
        assert not _killed_within(bystander, 0.3), "another run's task was killed"
    finally:
        for pid in (in_flight, bystander):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def test_a_settled_start_leaves_no_scan(tmp_path: Path) -> None:
    marker = workspace_marker(tmp_path)
    leader = _marked_leader(marker)
    try:
        reaper = Reaper(grace=1.0, marker=marker)
        reaper.start()
        reaper.spawning()
        reaper.spawn_failed()  # what it found was not this start's
        reaper.close()
        assert not _killed_within(leader, 0.3)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(leader, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(leader, 0)

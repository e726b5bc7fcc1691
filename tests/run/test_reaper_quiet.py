"""The reaper sleeps through registrations (tools/run/executors/_reaper.py):
a task's ``+PGID``/``-PGID`` costs it no wake-up, and what was registered is
still read, and killed, at the hang-up."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

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

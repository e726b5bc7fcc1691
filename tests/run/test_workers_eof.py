"""A dispatch worker that dies mid-request after saying something (a task's
"started", with the pid of the group the dispatcher must then kill): the
dispatcher hears what it said before it hears the death. It used to raise at
the end of the pipe with the interim reply still unread in its buffer, and the
dead worker's task was left running (the flake of test_dispatch_cli's
test_a_worker_killed_mid_task_stops_the_run_and_its_task under load)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from crucible.core.errors import OperationalError
from crucible.run.workers import Channel, WorkerPool


def _says_started_then_dies(request: Any, channel: Channel) -> Any:
    channel.send({"pid": 4242})
    os._exit(9)  # as if SIGKILLed after its report


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_what_a_dead_worker_said_is_read_before_its_death_is_reported() -> None:
    pool = WorkerPool(1, _says_started_then_dies)
    try:
        (worker,) = pool.workers
        pool.submit(1, "unit")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _state(worker.pid) != "Z":
            time.sleep(0.01)
        assert _state(worker.pid) == "Z"  # gone; its reply and the pipe's end both wait
        (fd,) = pool.reply_fds
        replies = pool.read(fd)
        assert [(r.token, r.outcome, r.payload) for r in replies] == [(1, "interim", {"pid": 4242})]
        with pytest.raises(OperationalError, match="died mid-request"):
            pool.read(fd)
    finally:
        pool.close()

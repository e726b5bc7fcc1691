"""crucible.run.executors._workers.WorkerPool on its own: a lazy pool forks at its first
submit, and a worker that dies mid-request is reported only after the replies
it sent before dying."""

from __future__ import annotations

import os
import select
from typing import Any

import pytest

from crucible.core.errors import InputRefused, OperationalError
from crucible.run.executors._workers import Channel, WorkerPool


def _echo(request: Any, channel: Channel) -> Any:
    if request == "die after started":
        channel.send({"kind": "started", "pid": 4242})
        os._exit(9)
    if request == "refuse":
        raise InputRefused("refused here")
    if request == "crash":
        raise ValueError("a bug")
    return request


def _replies(pool: WorkerPool, fd: int) -> list[Any]:
    select.select([fd], [], [], 30)
    return pool.read(fd)


def test_a_lazy_pool_forks_at_its_first_submit() -> None:
    pool = WorkerPool(3, _echo, lazy=True)
    watched: list[int] = []
    try:
        pool.watch(watched.append)
        assert (pool.forked, pool.idle, pool.reply_fds, watched) == (0, 3, [], [])
        pool.submit(1, "hello")
        assert pool.forked == 3 and sorted(watched) == sorted(pool.reply_fds)
        fd = next(w.replies for w in pool.workers if w.in_flight)
        replies = _replies(pool, fd)
        assert [(r.token, r.outcome, r.payload) for r in replies] == [(1, "ok", "hello")]
    finally:
        pool.close()
    assert pool.peak_rss_kib > 0


def test_a_lazy_pool_never_started_forks_nothing_at_close() -> None:
    pool = WorkerPool(2, _echo, lazy=True)
    pool.close()
    assert pool.forked == 0 and pool.peak_rss_kib == 0
    with pytest.raises(OperationalError):
        pool.submit(1, "late")  # a closed pool forks no more
    assert pool.forked == 0


def test_a_worker_dying_mid_request_reports_what_it_sent_first() -> None:
    pool = WorkerPool(1, _echo)
    try:
        pool.submit(7, "die after started")
        fd = pool.reply_fds[0]
        os.waitid(os.P_PID, pool.workers[0].pid, os.WEXITED | os.WNOWAIT)  # gone, unreaped
        replies = _replies(pool, fd)
        assert [(r.token, r.outcome, r.payload) for r in replies] == [
            (7, "interim", {"kind": "started", "pid": 4242})
        ]
        with pytest.raises(OperationalError, match="died mid-request"):
            _replies(pool, fd)
    finally:
        pool.close()


def test_a_requests_error_and_bug_come_back_as_their_replies() -> None:
    """One of ours is an "error" with its message; anything else a "bug" with
    the traceback, and the worker serves on."""
    pool = WorkerPool(1, _echo)
    try:
        fd = pool.reply_fds[0]
        got = []
        for token, request in ((1, "refuse"), (2, "crash"), (3, "fine")):
            pool.submit(token, request)
            got += [(r.token, r.outcome, r.payload) for r in _replies(pool, fd)]
        assert got[0] == (1, "error", "refused here")
        assert got[1][:2] == (2, "bug") and "ValueError: a bug" in got[1][2]
        assert got[2] == (3, "ok", "fine")
    finally:
        pool.close()

"""Waiting for a task's leader to exit: its output copied to the log, its
timeout, the run's stop and kill requests, the dispatcher's hang-up, and (a
pipelined worker) the next request and the hand-back of what is staged."""

from __future__ import annotations

import select
import signal
import time

from crucible.compile import MAX_WAIT_S
from crucible.run.executors._agent_io import AgentStdout
from crucible.run.executors._pipelined import Pipeline
from crucible.run.executors._procs import TaskProcess, kill_group
from crucible.run.executors._slots import Slots
from crucible.run.executors._tasklog import LogSink
from crucible.run.executors._workers import Channel

__all__ = ["ANNOUNCE_AFTER", "wait_for_exit"]

#: how long a task runs before its start is reported on its own (wait_for_exit)
ANNOUNCE_AFTER = 0.002
#: the longest single poll (crucible.compile._durations.MAX_WAIT_S)
_MAX_WAIT_MS = int(MAX_WAIT_S * 1000)
_POLL_IN = select.POLLIN
_POLL_GONE = select.POLLHUP | select.POLLERR


def wait_for_exit(
    proc: TaskProcess,
    channel: Channel,
    out_r: int,
    sink: LogSink,
    agent_out: AgentStdout | None,
    *,
    slots: Slots,
    kill_grace: float,
) -> tuple[int, str | None, bool]:
    """Wait for the leader to exit, copying its output to the log and
    enforcing its timeout and the run's stop and kill requests. Returns
    (exit code, stop reason, dispatcher gone).

    The scheduling thread hears that the process started once it has run
    for ANNOUNCE_AFTER; one that exits sooner is announced by the final
    reply, which then carries its start too: a short task costs the
    scheduling thread one wake-up, not two."""
    requests_fd = channel.requests_fd
    announce_at: float | None = proc.started + ANNOUNCE_AFTER
    #: a pipelined worker's (serve): the next request is taken meanwhile
    pipe: Pipeline | None = getattr(channel, "pipeline", None)
    long_at = None if pipe is None else proc.started + pipe.after
    poller = select.poll()
    poller.register(proc.pidfd, _POLL_IN)
    poller.register(out_r, _POLL_IN)
    poller.register(slots.stop_r, _POLL_IN)
    poller.register(slots.kill_r, _POLL_IN)
    # POLLHUP only (the dispatcher is gone), unless a request is wanted
    poller.register(requests_fd, _POLL_IN if pipe is not None and pipe.watching() else 0)
    if agent_out is not None:
        poller.register(agent_out.fd, _POLL_IN)
    grace = kill_grace
    gone = False
    while True:
        now = time.monotonic()
        wake = proc.kill_at
        if proc.stop_reason is None and proc.deadline is not None:
            wake = proc.deadline if wake is None else min(wake, proc.deadline)
        if announce_at is not None:
            wake = announce_at if wake is None else min(wake, announce_at)
        if long_at is not None:
            wake = long_at if wake is None else min(wake, long_at)
        # at most MAX_WAIT_S: poll takes no more than 2^31−1 ms (a long timeout)
        timeout_ms = (
            None if wake is None else min(max(0, int((wake - now) * 1000) + 1), _MAX_WAIT_MS)
        )
        ready = dict(poller.poll(timeout_ms))
        if out_r in ready and not sink.drain(out_r):
            poller.unregister(out_r)  # every writer closed it
        if agent_out is not None and agent_out.fd in ready and not agent_out.drain(sink._write):
            poller.unregister(agent_out.fd)
        if proc.pidfd in ready:
            break
        if pipe is not None and requests_fd in ready and not ready[requests_fd] & _POLL_GONE:
            poller.modify(requests_fd, _POLL_IN if pipe.on_request() else 0)
        now = time.monotonic()
        if announce_at is not None and now >= announce_at:
            channel.send({"kind": "started", "pid": proc.pid})
            announce_at = None
        if pipe is not None and long_at is not None and now >= long_at:
            long_at = None  # it runs long: nothing waits behind it
            pipe.on_long()
            poller.modify(requests_fd, _POLL_IN)
        if slots.stop_r in ready:
            poller.unregister(slots.stop_r)
            if proc.stop_reason is None or proc.stop_reason == "timeout":
                proc.stop_reason = "interrupt"
                kill_group(proc.pid, signal.SIGTERM)
                proc.kill_at = now + grace
        if slots.kill_r in ready or (requests_fd in ready and ready[requests_fd] & _POLL_GONE):
            if requests_fd in ready:
                gone = True
                poller.unregister(requests_fd)
            if slots.kill_r in ready:
                poller.unregister(slots.kill_r)
            kill_group(proc.pid, signal.SIGKILL)
            proc.kill_at = None
            continue
        if proc.stop_reason is None and proc.deadline is not None and now >= proc.deadline:
            proc.stop_reason = "timeout"
            kill_group(proc.pid, signal.SIGTERM)
            proc.kill_at = now + grace
        elif proc.kill_at is not None and now >= proc.kill_at:
            kill_group(proc.pid, signal.SIGKILL)
            proc.kill_at = None
    code = proc.reap()
    # The group is dead (or dying of SIGKILL): what it wrote is in the pipe.
    # A process that left the group may still hold the pipe: take what is
    # there, never wait for it.
    sink.drain(out_r)
    if agent_out is not None:
        agent_out.drain(sink._write)
    return code, proc.stop_reason, gone

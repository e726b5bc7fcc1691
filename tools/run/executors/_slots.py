"""The task slots of a run's local workers: three pipes made before they fork.

- slot tokens: ``-j N`` bytes; a worker takes one before it starts a process
  and gives it back once the process was reaped, so at most N task processes
  run at once across every worker;
- stop: written once when the dispatcher received SIGINT/SIGTERM; nobody reads
  it, so it stays readable for every worker: start nothing new, terminate the
  running group, escalate to SIGKILL after the grace period;
- kill: written on a second signal: SIGKILL now.
"""

from __future__ import annotations

import contextlib
import os
import select

__all__ = ["Slots"]


class Slots:
    """The pipes shared by the scheduling thread and every worker (see module doc)."""

    def __init__(self, jobs: int) -> None:
        self.token_r, self.token_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.stop_r, self.stop_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.kill_r, self.kill_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        os.write(self.token_w, b"t" * jobs)
        #: a worker's epoll set for waiting on a token (built in the worker)
        self._waiter: select.epoll | None = None
        self._stop_poll: select.poll | None = None
        self._closed = False

    def stop(self) -> None:
        """Scheduling thread: start nothing new; terminate every running group."""
        with contextlib.suppress(BlockingIOError):
            os.write(self.stop_w, b"s")

    def kill(self) -> None:
        """Scheduling thread: SIGKILL every running group now."""
        with contextlib.suppress(BlockingIOError):
            os.write(self.kill_w, b"k")

    def acquire(self, requests_fd: int) -> bool:
        """Worker: wait for a slot token; False once the run is stopping (or the
        dispatcher is gone), and then no token is held."""
        if self._waiter is None:
            # EPOLLEXCLUSIVE: a released token wakes one waiting worker, not all.
            self._waiter = select.epoll()
            self._waiter.register(self.token_r, select.EPOLLIN | select.EPOLLEXCLUSIVE)
            self._waiter.register(self.stop_r, select.EPOLLIN)
            self._waiter.register(requests_fd, 0)  # EPOLLHUP only
        timeout = 0.0  # first look without waiting: usually a token is there
        while True:
            ready = dict(self._waiter.poll(timeout))
            if self.stop_r in ready or requests_fd in ready:
                return False
            try:
                if os.read(self.token_r, 1):
                    return True
            except BlockingIOError:  # none yet, or another worker took it
                timeout = -1

    def release(self) -> None:
        os.write(self.token_w, b"t")

    def stopping(self) -> bool:
        """Worker: whether the run is stopping (the stop pipe is readable)."""
        if self._stop_poll is None:
            self._stop_poll = select.poll()
            self._stop_poll.register(self.stop_r, select.POLLIN)
        return bool(self._stop_poll.poll(0))

    def close(self) -> None:
        """Idempotent: the dispatcher closes its slots at the end of run() and
        again in close(); a second os.close of the same numbers would close
        whatever another thread opened meanwhile (the session log's writer
        opens each record file it fsyncs)."""
        if self._closed:
            return
        self._closed = True
        for fd in (self.token_r, self.token_w, self.stop_r, self.stop_w, self.kill_r, self.kill_w):
            with contextlib.suppress(OSError):
                os.close(fd)

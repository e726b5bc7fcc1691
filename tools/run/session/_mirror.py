"""Streams the dispatcher copies to but must never wait on (issue 27 item 2).

The events mirror (``--events FILE|-``), ``--follow``'s lines and the warnings
go to a reader the run does not control: a FIFO whose reader stopped reading,
``--events - | sleep 30``, a ``2>&1 |`` nobody drains. A blocking ``write`` to a
full pipe waits for that reader forever, and with it the session log's writer
(the dispatcher then waits for durability) or a worker (which then stops
draining its task and never hears the stop): SIGINT and SIGTERM would not stop
the run. So these writes are bounded: :class:`BoundedOut` writes a pipe or a
FIFO through a descriptor of its own opened with ``O_NONBLOCK`` (reopened
through ``/proc/self/fd``: the flag then belongs to our open file description,
not to the one the shell shares with stdout or other processes), waits at most
``STALL`` seconds in ``poll`` for the reader to take the bytes, and says it
could not (:class:`Stalled`): the caller drops that stream with one warning
(docs/spec/run.md, "--events", "--follow"). A regular file or a terminal is
written as before (a file never waits on a reader).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import select
import stat
import time

__all__ = ["STALL", "BoundedOut", "Stalled", "follow_dropped", "follow_out"]

#: the longest a mirror (or --follow) may hold the run up on one write: a reader
#: that takes no bytes for this long cannot keep up, and is dropped
STALL = 2.0


class Stalled(OSError):
    """The reader took none of the bytes for :data:`STALL` seconds."""


class BoundedOut:
    """Writes to ``fd`` that wait at most ``stall`` seconds for its reader."""

    def __init__(self, fd: int, stall: float = STALL) -> None:
        self.stall = stall
        self.fd = fd
        self._own = False
        with contextlib.suppress(OSError):
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                # a description of our own: O_NONBLOCK on it changes nobody else's
                self.fd = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                self._own = True
        self._poll: select.poll | None = None

    @property
    def bounded(self) -> bool:
        """Whether writes are bounded (a pipe or FIFO; else they are plain)."""
        return self._own

    def write(self, data: bytes) -> None:
        """Write all of ``data``; raise :class:`Stalled` when the reader took
        nothing for ``stall`` seconds, OSError as ``os.write`` does."""
        view = memoryview(data)
        waited_since: float | None = None
        while view:
            try:
                n = os.write(self.fd, view)
            except BlockingIOError:
                n = 0
            if n:
                view = view[n:]
                waited_since = None
                continue
            now = time.monotonic()
            if waited_since is None:
                waited_since = now
            left = waited_since + self.stall - now
            if left <= 0:
                raise Stalled(11, f"its reader took nothing for {self.stall:g} s")
            if self._poll is None:
                self._poll = select.poll()
                self._poll.register(self.fd, select.POLLOUT)
            self._poll.poll(max(1, int(left * 1000)))

    def close(self) -> None:
        if self._own:
            self._own = False
            with contextlib.suppress(OSError):
                os.close(self.fd)


# -- --follow: every worker writes the tasks' lines to the shared stderr --------

#: one byte shared by the dispatcher and the workers it forks (a MAP_SHARED
#: mapping made at import, before any fork): set once stderr stalled, so the
#: stream is dropped by every process at once and the run warns once
_FOLLOW_DROPPED = mmap.mmap(-1, 1)
#: this process's bounded outs by descriptor, and the pid they were opened in
#: (a forked worker opens its own)
_outs: tuple[int, dict[int, BoundedOut]] = (-1, {})


def follow_dropped() -> bool:
    """Whether --follow's stream was dropped (stderr's reader stalled)."""
    return _FOLLOW_DROPPED[0] == 1


def follow_out(fd: int, lines: bytes) -> None:
    """Write --follow's ``lines`` to ``fd`` (stderr), unless the stream was
    dropped; drop it when its reader stalls. Never raises: a closed or stalled
    terminal never fails a task."""
    global _outs
    if _FOLLOW_DROPPED[0]:
        return
    if _outs[0] != os.getpid():
        _outs = (os.getpid(), {})
    out = _outs[1].get(fd)
    if out is None:
        out = _outs[1][fd] = BoundedOut(fd)
    try:
        for piece in _pieces(lines):
            out.write(piece)
    except Stalled:
        _FOLLOW_DROPPED[0] = 1
    except OSError:
        pass


def _pieces(lines: bytes, size: int = select.PIPE_BUF) -> list[bytes]:
    """``lines`` in runs of whole lines of at most ``size`` bytes where a line
    allows (a pipe's write of up to PIPE_BUF bytes is atomic: lines of
    concurrent workers never interleave within a line)."""
    if len(lines) <= size:
        return [lines]
    out: list[bytes] = []
    start = 0
    while start < len(lines):
        end = lines.rfind(b"\n", start, start + size) + 1
        if end <= start:  # one line over size: up to its end
            end = lines.find(b"\n", start) + 1 or len(lines)
        out.append(lines[start:end])
        start = end
    return out

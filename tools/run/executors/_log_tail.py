"""``--follow`` for units run elsewhere: tail their log files on the shared state.

Locally a worker copies its task's output to the dispatcher's stderr as it
reads the task's pipe (crucible.run.executors._tasklog's ``Follow``). A unit on a Dask
worker writes the same log file, ``STATE/logs/<task>[/<key>].log``, on the
filesystem every worker shares with the dispatcher (docs/run-on-a-cluster.md),
so the dispatcher tails those files: a thread reads what each unit in flight
appended since its last look, every INTERVAL seconds, and passes it through
the same ``Follow`` (whole lines, ``task[key] `` prefix). What an attempt
appends begins with its header line (``== crucible: attempt N …``), which is
the log's and not the task's output: it is skipped. A unit's end reads the
rest and flushes its last partial line, before the dispatcher hears of it.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from crucible.core.structs import dataclass, field
from crucible.run.executors._tasklog import Follow, follow_prefix

__all__ = ["INTERVAL", "LogTailer"]

#: how often the tailer looks at the logs of the units in flight (seconds)
INTERVAL = 0.2
#: at most this much of a log is read per look and unit
_CHUNK = 1 << 20


@dataclass
class _Tail:
    path: Path
    follow: Follow
    offset: int
    header_left: bool = True
    pending: bytes = field(default=b"")


class LogTailer:
    """Tails the logs of the units registered with :meth:`add` until :meth:`finish`."""

    def __init__(self, fd: int = 2, interval: float = INTERVAL) -> None:
        self._fd = fd
        self._interval = interval
        self._tails: dict[int, _Tail] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, token: int, path: Path, name: str, key: str | None) -> None:
        """A unit attempt was submitted: its output is what ``path`` gains from now."""
        try:
            offset = os.stat(path).st_size  # earlier attempts' output is not followed again
        except OSError:
            offset = 0
        tail = _Tail(path, Follow(follow_prefix(name, key), self._fd), offset)
        with self._lock:
            self._tails[token] = tail
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="crucible-log-tail", daemon=True
                )
                self._thread.start()

    def finish(self, token: int) -> None:
        """The unit ended: show the rest of its output and its last partial line."""
        with self._lock:
            tail = self._tails.pop(token, None)
            if tail is not None:
                self._read(tail, to_end=True)
                tail.follow.flush()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            for tail in self._tails.values():
                self._read(tail, to_end=True)
                tail.follow.flush()
            self._tails.clear()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            with self._lock:
                for tail in self._tails.values():
                    self._read(tail)

    @staticmethod
    def _read(tail: _Tail, *, to_end: bool = False) -> None:
        """Pass on what the log gained (nothing if it is not a regular file):
        at most _CHUNK bytes, or everything with ``to_end``."""
        try:
            fd = os.open(tail.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return  # not written yet (a quiet attempt writes no log)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return
            while True:
                data = os.pread(fd, _CHUNK, tail.offset)
                if not data:
                    return
                tail.offset += len(data)
                LogTailer._pass_on(tail, data)
                if not to_end:
                    return
        except OSError:
            return
        finally:
            os.close(fd)

    @staticmethod
    def _pass_on(tail: _Tail, data: bytes) -> None:
        if tail.header_left:  # the attempt's header line is the log's, not the task's
            data = tail.pending + data
            cut = data.find(b"\n")
            if cut < 0:
                tail.pending = data
                return
            data, tail.pending, tail.header_left = data[cut + 1 :], b"", False
        if data:
            tail.follow.feed(data)

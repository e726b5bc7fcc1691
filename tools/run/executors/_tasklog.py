"""An attempt's output: appended to its log after a header line, its tail kept
for a failure's note, and with ``--follow`` its lines passed to the
dispatcher's stderr."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from crucible.core.fdio import write_all
from crucible.run.engine._failures import TAIL_BYTES
from crucible.run.executors._unit_paths import UnitPaths
from crucible.run.session._mirror import follow_out

__all__ = ["FOLLOW_LINE_MAX", "Follow", "LogSink", "follow_prefix", "log_header"]


class LogSink:
    """An attempt's stdout+stderr, appended to ``logs/<task>[/<key>].log``.

    The file is opened (and created) at the attempt's first byte, which is
    preceded by the attempt's header line (task, key, attempt, start time,
    argv): an attempt that writes nothing leaves no trace, and a run of quiet
    tasks creates no log file at all (an inode per task less; see
    docs/spec/run.md). The last TAIL_BYTES of output are kept for a failure's
    note; with ``follow``, whole lines also go to the dispatcher's stderr."""

    def __init__(
        self,
        paths: UnitPaths,
        name: str,
        key: str | None,
        attempt: int,
        header: Callable[[], bytes],
        follow: Follow | None,
    ) -> None:
        self._paths = paths
        self._name = name
        self._key = key
        self._attempt = attempt
        self._header = header
        self._follow = follow
        self._fd: int | None = None
        self._path: Path | None = None
        #: why the log could not be written (the rest of the output was dropped)
        self.error: str | None = None
        #: the end of the attempt's output (for a failure's stderr tail)
        self.tail = b""

    @property
    def wrote(self) -> bool:
        return self._path is not None

    def drain(self, out_r: int) -> bool:
        """Copy what the pipe holds; False once every writer has closed it."""
        while True:
            try:
                data = os.read(out_r, 1 << 16)
            except BlockingIOError:
                return True
            if not data:
                return False
            self._write(data)

    def _write(self, data: bytes) -> None:
        self.tail = (self.tail + data)[-2 * TAIL_BYTES :]
        if self._follow is not None:
            self._follow.feed(data)
        if self.error is not None:
            return  # keep draining, so the task never blocks on a full pipe
        try:
            if self._fd is None:
                self._fd = self._open()
            write_all(self._fd, data)
        except OSError as exc:
            where = self._path or self._paths.state / "logs" / self._name
            self.error = (
                f"cannot write {where}: {exc.strerror or exc}; the rest of the output was dropped"
            )

    def _open(self) -> int:
        self._path = self._paths.log(self._name, self._key)
        fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            write_all(fd, self._header())
        except OSError:
            os.close(fd)
            raise
        return fd

    def close(self) -> None:
        if self._follow is not None:
            self._follow.flush()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


#: a --follow line longer than this is passed on in pieces of this size
FOLLOW_LINE_MAX = 4096


class Follow:
    """``--follow``: an attempt's output as whole lines prefixed ``task[key] ``,
    written to the dispatcher's stderr with one ``write`` per batch of whole
    lines, so lines of concurrent tasks never interleave within a line."""

    def __init__(self, prefix: bytes, fd: int = 2) -> None:
        self._prefix = prefix
        self._fd = fd
        self._partial = b""

    def feed(self, data: bytes) -> None:
        data = self._partial + data
        cut = data.rfind(b"\n") + 1
        whole, rest = data[:cut], data[cut:]
        while len(rest) > FOLLOW_LINE_MAX:  # a very long line: in pieces
            whole += rest[:FOLLOW_LINE_MAX] + b"\n"
            rest = rest[FOLLOW_LINE_MAX:]
        self._partial = rest
        if whole:
            self._emit(whole)

    def flush(self) -> None:
        if self._partial:
            self._emit(self._partial + b"\n")
            self._partial = b""

    def _emit(self, lines: bytes) -> None:
        out = b"".join(self._prefix + line + b"\n" for line in lines[:-1].split(b"\n"))
        # bounded: a stderr nobody reads drops the stream, never blocks the worker
        follow_out(self._fd, out)


def follow_prefix(name: str, key: str | None) -> bytes:
    """``task[key] ``, with control characters of a key escaped (it is printed
    on a terminal)."""
    label = name if key is None else f"{name}[{key}]"
    safe = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in label)
    return safe.encode("utf-8", "backslashreplace") + b" "


def log_header(name: str, key: str | None, attempt: int, argv: list[str], started: str) -> bytes:
    """The line that heads each attempt in a log: ``== crucible: attempt N``, then
    the task, key, start time and argv as JSON strings (one line whatever they hold)."""

    parts = [f"== crucible: attempt {attempt} task {json.dumps(name)}"]
    if key is not None:
        parts.append(f"key {json.dumps(key)}")
    parts.append(f"started {started} argv {json.dumps(argv)}")
    return (" ".join(parts) + "\n").encode("utf-8", "surrogatepass")

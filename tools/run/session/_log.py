"""The session log ``STATE/session.jsonl``: one canonical JSON event per line.

Events are buffered within one turn of the dispatcher's loop and handed to a
writer thread, which writes what is waiting with one ``write`` + ``fsync``
(group commit), at most one fsync per GROUP_COMMIT_WINDOW: every event is
fsync'd, in order, and the file is always a prefix of what was emitted. A
mirror stream (``--events FILE|-``) receives the same bytes right after they are
durable.

Result records ride the same commit: the workers write them without fsync and
the dispatcher hands their files to :meth:`SessionLog.sync`; the writer fsyncs
each file (and each directory that got a new name) once per batch, BEFORE the
batch's lines (a batch of many files: one ``syncfs`` of the state's
filesystem instead, :mod:`crucible.core.syncfs`), then says which batch is durable (``durable_seq``,
``on_durable``): the dispatcher wakes a settled unit's dependants only then
(docs/spec/run.md, "Session log").
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from crucible.core import ndjson
from crucible.core.errors import OperationalError
from crucible.core.fdio import write_all
from crucible.core.syncfs import FsSync
from crucible.run.session._mirror import BoundedOut
from crucible.run.session.events import SessionEvent

__all__ = [
    "EVENT_KINDS",
    "GROUP_COMMIT_WINDOW",
    "URGENT_COMMIT_WINDOW",
    "SessionLog",
    "now_text",
    "read_events",
]

#: Seconds between the starts of two fsyncs of the log: events emitted meanwhile
#: wait and share the next one. Bounds the log to ~200 fsyncs a second however
#: fast units settle (one per loop turn was ~2 per unit with short tasks), at
#: the price of an event becoming durable up to this much later (our choice).
GROUP_COMMIT_WINDOW = 0.005
#: ... except for a batch a unit's start waits for (``commit(urgent=True)``: the
#: record of a settled unit whose dependant becomes ready), which waits only
#: this long after the previous fsync began: the window was the floor of every
#: link of a chain (a 1,000-task chain of no-op tasks took 5.2 s, 7x make)
URGENT_COMMIT_WINDOW = 0.001

EVENT_KINDS = (
    "plan_admitted",
    "task_started",
    "task_finished",
    "run_finished",
    "shutdown",
)


#: the last second formatted by now_text, and its text up to the milliseconds
_second: tuple[int, str] = (-1, "")


#: one commit's batch: its lines, the files to make durable first, its number,
#: the items for ``on_batch_durable``, and whether a unit's start waits for it
_Batch = tuple[bytes, tuple[str, ...], int, list[Any], bool]


def now_text(t: float | None = None) -> str:
    """RFC 3339 UTC time with milliseconds, e.g. ``2026-11-30T07:55:24.123Z``.

    Every event carries one: the text of the second is formatted once per
    second (strftime was ~5 us of each of a cached rerun's 1,000 events), the
    milliseconds rounded as ``datetime.fromtimestamp`` rounds them."""
    global _second
    frac, whole = math.modf(time.time() if t is None else t)
    us = round(frac * 1e6)  # half to even, as fromtimestamp
    if us >= 1_000_000:
        whole, us = whole + 1, us - 1_000_000
    elif us < 0:
        whole, us = whole - 1, us + 1_000_000
    sec = int(whole)
    known = _second  # one read: another thread may replace it meanwhile
    if known[0] != sec:
        known = (sec, datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%dT%H:%M:%S."))
        _second = known
    return f"{known[1]}{us // 1000:03d}Z"


class SessionLog:
    """Append-only, fsync'd event log of one dispatcher session.

    :meth:`emit` queues an event; :meth:`commit` hands the queued batch to a
    writer thread, which writes it with one ``write`` and one ``fsync`` (group
    commit) and then copies it to the mirror. Batches are written in order, so
    the file is always a prefix of the events emitted. :meth:`close` waits until
    every event is durable: ``run_finished`` and ``shutdown`` are on disk before
    the dispatcher exits.
    """

    def __init__(
        self,
        path: Path,
        session: int,
        mirror: IO[bytes] | None = None,
        on_warning: Callable[[str], None] | None = None,
    ) -> None:
        # lazy: not loaded with this module; only __init__() needs it
        import queue
        import threading

        #: what the writer's timed take raises when nothing came (_gather)
        self._empty: type[Exception] = queue.Empty

        self.path = path
        self.session = session
        self.mirror = mirror
        #: the mirror's writes, bounded (crucible.run.session._mirror): a reader that
        #: stops reading drops the mirror instead of holding the log's writer
        self._mirror_out: BoundedOut | None = None
        if mirror is not None:
            with contextlib.suppress(AttributeError, OSError, ValueError):
                self._mirror_out = BoundedOut(mirror.fileno())
        self._on_warning = on_warning
        self._pending: list[bytes] = []
        #: record files (and directories) to fsync before the next batch's lines
        self._pending_sync: dict[str, None] = {}
        #: the last batch handed to the writer, and the last one on disk
        self._seq = 0
        self.durable_seq = 0
        #: called on the writer thread once a batch is durable (or the log failed)
        self.on_durable: Callable[[], None] | None = None
        #: items handed to :meth:`after_durable`, and what is called with those of
        #: a batch on the writer thread once that batch is durable (never when the
        #: log failed): the task cache's records of the units it settled
        self._pending_after: list[Any] = []
        self.on_batch_durable: Callable[[list[Any]], None] | None = None
        #: called by :meth:`close` once the writer thread has ended
        self.on_close: Callable[[], None] | None = None
        self._error: OperationalError | None = None
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise OperationalError(
                f"cannot open session log: {exc.strerror}", where=str(path)
            ) from None
        #: one syncfs for a batch of many record files (on the log's filesystem)
        self._fs = FsSync(self._fd, str(path.parent))
        self._batches: queue.SimpleQueue[_Batch | None] = queue.SimpleQueue()
        # Started at the first commit, so a dispatcher can fork its workers
        # while the process still has one thread.
        self._writer = threading.Thread(target=self._write_batches, name="session-log", daemon=True)

    def emit(self, what: SessionEvent) -> dict[str, Any]:
        """Queue one event (built by crucible.run.session.events); it is written
        at the next :meth:`commit`. Members that are None are left out."""
        event: dict[str, Any] = {"event": what.kind, "session": self.session, "time": now_text()}
        for k, v in what.members.items():
            if v is not None:
                event[k] = v
        self._pending.append(ndjson.dumps_line(event))
        return event

    def sync(self, paths: Iterable[str]) -> None:
        """fsync these files (or directories) before the next batch's lines."""
        for p in paths:
            self._pending_sync[p] = None

    def after_durable(self, item: Any) -> None:
        """Hand ``item`` to ``on_batch_durable`` once the next batch is durable."""
        self._pending_after.append(item)

    def commit(self, *, urgent: bool = False) -> int:
        """Hand every queued event (and file to fsync) to the writer, which makes
        them durable as one batch; returns the batch's number (the last one when
        nothing was queued): it is durable once ``durable_seq`` reaches it.
        ``urgent``: a unit's start waits for it (URGENT_COMMIT_WINDOW)."""
        if self._error is not None:
            raise self._error
        if self._pending or self._pending_sync or self._pending_after:
            if not self._writer.is_alive() and self._writer.ident is None:
                self._writer.start()
            self._seq += 1
            after, self._pending_after = self._pending_after, []
            self._batches.put(
                (b"".join(self._pending), tuple(self._pending_sync), self._seq, after, urgent)
            )
            self._pending.clear()
            self._pending_sync.clear()
        return self._seq

    def _write_batches(self) -> None:
        last_sync = -GROUP_COMMIT_WINDOW
        while True:
            first = self._batches.get()
            if first is None:
                return
            more = [first]
            stop = self._drain(more)
            if not stop:
                # Let the batches of the next few ms join this fsync (of the
                # next ms only, once a unit's start waits for one of them).
                stop = self._gather(more, last_sync)
            data = b"".join(b[0] for b in more)
            paths = dict.fromkeys(p for b in more for p in b[1])  # one fsync per file
            last_sync = time.monotonic()
            if self._error is None:
                try:
                    self._sync_records(list(paths))  # first: the log never says more
                    if data:
                        write_all(self._fd, data)
                        _fsync(self._fd)
                except OSError as exc:
                    what = "result record" if exc.filename else "session log"
                    self._error = OperationalError(
                        f"cannot write {what}: {exc.strerror}",
                        where=str(exc.filename or self.path),
                    )
                else:
                    self.durable_seq = more[-1][2]
                    if data:
                        self._mirror(data)
            if self.on_durable is not None:
                self.on_durable()
            after = [item for b in more for item in b[3]]
            if after and self._error is None and self.on_batch_durable is not None:
                # after the wake-up: the scheduling loop goes on meanwhile
                try:
                    self.on_batch_durable(after)
                except Exception as exc:  # never the writer's end: the log must go on
                    if self._on_warning is not None:
                        self._on_warning(f"after a durable batch: {type(exc).__name__}: {exc}")
            if stop:
                return

    def _sync_records(self, paths: list[str]) -> None:
        """Make the batch's record files and directories durable: one syncfs
        of the state's filesystem for many of them, else one fsync each."""
        if self._fs.covers(paths):
            _syncfs(self._fs)
            return
        for p in paths:
            _fsync_path(p)

    def _gather(self, into: list[_Batch], last_sync: float) -> bool:
        """Take the batches that arrive until the window since ``last_sync``
        ends (GROUP_COMMIT_WINDOW, or URGENT_COMMIT_WINDOW as soon as one of
        them is urgent); True when close() was among them."""
        while True:
            urgent = any(b[4] for b in into)
            window = URGENT_COMMIT_WINDOW if urgent else GROUP_COMMIT_WINDOW
            wait = last_sync + window - time.monotonic()
            if wait <= 0:
                return self._drain(into)
            try:
                nxt = self._batches.get(timeout=wait)
            except self._empty:
                return self._drain(into)
            if nxt is None:
                return True
            into.append(nxt)

    def _drain(self, into: list[_Batch]) -> bool:
        """Move every waiting batch into ``into``; True when close() was among them."""
        while not self._batches.empty():
            nxt = self._batches.get()
            if nxt is None:
                return True
            into.append(nxt)
        return False

    def _mirror(self, data: bytes) -> None:
        if self.mirror is None:
            return
        try:
            if self._mirror_out is not None:
                self._mirror_out.write(data)
                return
            view = memoryview(data)
            while view:  # an unbuffered stream may take part of it
                n = self.mirror.write(view)
                if n is None:
                    raise BlockingIOError(11, "the mirror would block")
                view = view[n:]
            self.mirror.flush()
        except (OSError, ValueError) as exc:
            # A broken mirror (a closed reader, a full device) must not stop the
            # run: it is dropped, and the log on disk stays complete.
            self.mirror = None
            self._close_mirror_out()
            if self._on_warning is not None and not isinstance(exc, BrokenPipeError):
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                self._on_warning(
                    f"--events: cannot write the events mirror ({why}); it is dropped, "
                    f"{self.path} stays complete"
                )

    def _close_mirror_out(self) -> None:
        if self._mirror_out is not None:
            self._mirror_out.close()
            self._mirror_out = None

    def close(self) -> None:
        """Write everything queued, wait until it is durable, close the file."""
        self.commit()
        if self._writer.ident is not None:
            self._batches.put(None)
            self._writer.join()
        if self.on_close is not None:
            self.on_close()
        self._close_mirror_out()
        os.close(self._fd)
        if self._error is not None:
            raise self._error


def _fsync(fd: int) -> None:
    """The log's fsync (a seam: tests count and order the calls)."""
    os.fsync(fd)


def _syncfs(fs: FsSync) -> None:
    """The batch's syncfs (a seam: tests count and order the calls)."""
    fs.sync()


def _fsync_path(path: str) -> None:
    """fsync a record file or a directory; one removed meanwhile (a retry's
    record) needs none. A failure raises OSError naming the path."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return
    try:
        _fsync(fd)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, path) from None
    finally:
        os.close(fd)


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every event of a session log. A torn last line (a crash mid-write, before
    its fsync) is ignored; any other bad line is reported as ``file:line``."""

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise OperationalError(
            f"cannot read session log: {exc.strerror}", where=str(path)
        ) from None
    complete = data[: data.rfind(b"\n") + 1]
    return [
        value for _, value in ndjson.iter_lines(io.BytesIO(complete), name=str(path), strict=False)
    ]

"""A small pool of forked worker processes that run units for the dispatcher.

A worker takes one unit at a time and carries it from staging to capture
(:mod:`crucible.run.executors._unit`): those are short bursts of Python around a few
fsyncs and a process start, which in threads would hand the GIL back and forth
with the scheduling thread (measured: ~180 futex calls per task), and on the
scheduling thread would make it wait for every ``vfork``'d child to exec. The
workers are forked from the dispatcher, so they share its loaded plan and
modules; requests and replies are small pickles over pipes, and the scheduling
thread reads replies in its one ``select``. A request may be answered by any
number of interim replies (:meth:`Channel.send`, e.g. "started") before its
final one.

A lazy pool (``lazy=True``, the dispatcher's) forks nothing until its first
:meth:`WorkerPool.submit`: a run whose units all hit the task cache never
needs a worker, and pays no fork and no reaping (docs/spec/cache.md). The
whole pool is forked at that first need, not one worker at a time, because a
fork should happen while the process has one thread: the dispatcher's first
``submit`` comes in the first turn of its loop, before that turn hands the
session log its first batch (the session writer thread starts there). Every
unit a local run submits later follows a reply of a worker of this pool, so
it is already forked by then. Should a first fork still come after the writer
started, it is safe on the interpreters we support: the writer thread only
waits on its queue, sleeps, and calls ``os.write``/``os.fsync`` on the log's
descriptor, and a worker never touches the session log, its queue, or the
standard streams (``_serve`` answers through pipes and leaves by ``os._exit``).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
from collections.abc import Callable
from typing import Any

from crucible.core.errors import CrucibleError, OperationalError
from crucible.core.fdio import write_all
from crucible.core.structs import dataclass, field

__all__ = ["Channel", "Inbox", "Reply", "WorkerPool"]

_HEADER = 4


@dataclass(frozen=True)
class Reply:
    token: int
    #: "ok" (payload is the handler's result), "error" (payload: the message of a
    #: CrucibleError), "bug" (payload: a traceback), or "interim" (payload: what
    #: the handler sent before its result; more replies follow)
    outcome: str
    payload: Any

    @property
    def final(self) -> bool:
        return self.outcome != "interim"


class Channel:
    """A worker's side of one request: interim replies, and the request pipe,
    which reports POLLHUP once the dispatcher is gone."""

    def __init__(self, token: int, requests_fd: int, replies_fd: int) -> None:
        self.token = token
        self.requests_fd = requests_fd
        self._replies_fd = replies_fd
        #: set by a pipelined worker's loop (crucible.run.executors._unit.UnitRunner.serve)
        self.pipeline: Any = None

    def send(self, payload: Any) -> None:
        write_all(self._replies_fd, _frame((self.token, "interim", payload)))


class _InboxChannel(Channel):
    """A pipelined worker's channel: its interim reply goes out after the
    replies it deferred (:meth:`Inbox.defer`)."""

    def __init__(self, token: int, inbox: Inbox) -> None:
        super().__init__(token, inbox.requests_fd, inbox.replies_fd)
        self._inbox = inbox

    def send(self, payload: Any) -> None:
        self._inbox.write(_frame((self.token, "interim", payload)))


class Inbox:
    """A worker's side of its pipes when it holds more than one request at a
    time (a pipelined pool, ``depth=2``): it takes requests when it wants them
    — the next one while its task runs — and answers each token itself."""

    def __init__(self, requests_fd: int, replies_fd: int) -> None:
        self.requests_fd = requests_fd
        self.replies_fd = replies_fd
        self._pending = bytearray()
        self._poll: select.poll | None = None
        #: framed final replies not sent yet (defer)
        self._deferred: list[bytes] = []
        #: the dispatcher closed the request pipe (nothing more will come)
        self.closed = False

    def take(self, *, block: bool) -> tuple[int, Any] | None:
        """The next whole request ``(token, request)``. With ``block=False``,
        one read at most and only when the pipe holds bytes: None while none
        is whole yet. None once the pipe is closed (``closed``)."""
        while True:
            body = _frame_body(self._pending)
            if body is not None:
                token, request = pickle.loads(body)
                return token, request
            if self.closed:
                return None
            if not block and not self._readable():
                return None
            chunk = os.read(self.requests_fd, 1 << 16)
            if not chunk:
                self.closed = True
                return None
            self._pending += chunk
            if not block and _frame_body(self._pending, peek=True) is None:
                return None

    def _readable(self) -> bool:
        if self._poll is None:
            self._poll = select.poll()
            self._poll.register(self.requests_fd, select.POLLIN)
        return bool(self._poll.poll(0))

    def buffered(self) -> bool:
        """A whole request is already read (poll would not say so)."""
        return _frame_body(self._pending, peek=True) is not None

    def channel(self, token: int) -> Channel:
        return _InboxChannel(token, self)

    def reply(self, token: int, payload: Any) -> None:
        """The final reply of ``token`` (the handler's result), after those deferred."""
        self.write(_frame((token, "ok", payload)))

    def defer(self, token: int, payload: Any) -> None:
        """A final reply nothing waits for: it goes out with the next reply or
        :meth:`flush` (one write, one wake-up of the dispatcher, for several)."""
        self._deferred.append(_frame((token, "ok", payload)))

    @property
    def deferred(self) -> int:
        return len(self._deferred)

    def flush(self) -> None:
        """Send the deferred replies."""
        if self._deferred:
            self.write(b"")

    def write(self, frame: bytes) -> None:
        """``frame`` after every deferred reply, in one write."""
        if self._deferred:
            self._deferred.append(frame)
            frame = b"".join(self._deferred)
            self._deferred.clear()
        write_all(self.replies_fd, frame)

    def fail(self, token: int, exc: BaseException) -> None:
        """The final reply of a token whose handling raised (as _serve_loop says it)."""
        self.write(_frame(_failure_reply(token, exc)))


def _failure_reply(token: int, exc: BaseException) -> tuple[int, str, str]:
    """The final reply of a request whose handling raised ``exc`` (called in its
    ``except``): "error" with the message of one of ours, else "bug" with the
    traceback."""
    if isinstance(exc, CrucibleError):
        return (token, "error", str(exc))
    import traceback  # a bug's report only (it loads linecache and textwrap)

    return (token, "bug", traceback.format_exc())


def _frame_body(pending: bytearray, *, peek: bool = False) -> bytes | None:
    """The body of the first whole frame in ``pending`` (removed from it unless
    ``peek``), or None when it is not whole yet."""
    if len(pending) < _HEADER:
        return None
    end = _HEADER + int.from_bytes(pending[:_HEADER], "little")
    if len(pending) < end:
        return None
    body = bytes(pending[_HEADER:end])
    if not peek:
        del pending[:end]
    return body


@dataclass
class _Worker:
    pid: int
    requests: int  # write end
    replies: int  # read end
    in_flight: int = 0
    buffer: bytearray = field(default_factory=bytearray)
    #: a pipelined worker's token whose task announced its start (runs long):
    #: no second request is queued behind it until its final reply
    long: int | None = None


def _frame(value: Any) -> bytes:
    body = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return len(body).to_bytes(_HEADER, "little") + body


def _next_request(fd: int, pending: bytearray) -> bytes | None:
    """The body of the next request framed on ``fd`` (None at end of file),
    reading as much as the pipe holds at a time; bytes past it stay in
    ``pending``."""
    while True:
        body = _frame_body(pending)
        if body is not None:
            return body
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return None
        pending += chunk


def _serve(
    handler: Callable[[Any, Channel], Any],
    requests: int,
    replies: int,
    inbox_loop: Callable[[Inbox], None] | None = None,
) -> None:
    """A worker's whole life: answer requests until the dispatcher closes the pipe."""
    # Ctrl-C (and a SIGTERM to the whole group) reaches every worker too; the
    # dispatcher decides what a signal means and tells the workers (see
    # crucible.run.executors._unit.Slots), and a worker finishes the request it holds.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # A lazy pool forks inside the dispatcher's loop, whose signal wake-up fd is
    # set: a signal sent to the group must not wake the dispatcher from here.
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)
    if inbox_loop is not None:
        inbox_loop(Inbox(requests, replies))
        return
    _serve_loop(handler, requests, replies)


def _serve_loop(handler: Callable[[Any, Channel], Any], requests: int, replies: int) -> None:
    # One read takes a whole request (header and body) where two were made:
    # whatever else arrived stays in ``pending`` for the next one.
    pending = bytearray()
    while True:
        body = _next_request(requests, pending)
        if body is None:
            return
        token, request = pickle.loads(body)
        try:
            reply = (token, "ok", handler(request, Channel(token, requests, replies)))
        except BaseException as exc:
            reply = _failure_reply(token, exc)
        try:
            data = _frame(reply)
        except Exception:
            # lazy: traceback costs start-up; only _serve_loop() needs it
            import traceback

            data = _frame((token, "bug", traceback.format_exc()))
        write_all(replies, data)


class WorkerPool:
    """``count`` forked workers running ``handler(request, channel)``; least-loaded
    dispatch. A ``lazy`` pool forks them at its first :meth:`submit` (see the
    module's docstring); :meth:`watch` names who is told each new reply fd.

    With ``inbox_loop`` the pool is *pipelined*: each worker runs
    ``inbox_loop(inbox)`` (:class:`Inbox`) and may hold four requests at
    once — one it carries out, the next ones it prepares meanwhile — except
    behind a request whose worker sent an interim reply (a task that runs
    long: see crucible.run.executors._unit.UnitRunner.serve)."""

    def __init__(
        self,
        count: int,
        handler: Callable[[Any, Channel], Any],
        *,
        lazy: bool = False,
        inbox_loop: Callable[[Inbox], None] | None = None,
        before_fork: Callable[[], None] | None = None,
    ) -> None:
        self.count = count
        #: called once, just before the first worker is forked (the local
        #: executor starts its reaper there: the workers inherit its pipe)
        self._before_fork = before_fork
        self._handler = handler
        self._inbox_loop = inbox_loop
        #: requests one worker may hold at once: a pipelined one, its running
        #: unit and the ones it stages ahead (crucible.run.executors._unit.AHEAD)
        self.depth = 1 if inbox_loop is None else 4
        self.workers: list[_Worker] = []
        self.by_fd: dict[int, _Worker] = {}
        #: the largest peak RSS of the reaped workers (0: no worker ran)
        self.peak_rss_kib = 0
        #: how many worker processes this pool forked (0 until its first submit)
        self.forked = 0
        self._started = False
        self._watch: Callable[[int], None] | None = None
        if not lazy:
            self.start()

    def watch(self, callback: Callable[[int], None]) -> None:
        """Call ``callback(fd)`` for every reply fd, now and as workers are forked."""
        self._watch = callback
        for w in self.workers:
            callback(w.replies)

    @property
    def started(self) -> bool:
        return self._started

    def start(self) -> None:
        """Fork the workers (once; a closed pool forks no more)."""
        if self._started:
            return
        self._started = True
        try:
            if self._before_fork is not None:
                self._before_fork()
            for _ in range(self.count):
                self._fork(self._handler)
        except BaseException:
            self.close()
            raise
        if self._watch is not None:
            for w in self.workers:
                self._watch(w.replies)

    def _fork(self, handler: Callable[[Any, Channel], Any]) -> None:
        req_r, req_w = os.pipe2(os.O_CLOEXEC)
        rep_r, rep_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:  # the worker
            code = 0
            try:
                for w in self.workers:  # not ours: let those workers see EOF
                    os.close(w.requests)
                    os.close(w.replies)
                os.close(req_w)
                os.close(rep_r)
                _serve(handler, req_r, rep_w, self._inbox_loop)
            except BaseException:
                code = 70
            finally:
                os._exit(code)  # never run the parent's atexit handlers or flush its buffers
        os.close(req_r)
        os.close(rep_w)
        os.set_blocking(rep_r, False)
        worker = _Worker(pid=pid, requests=req_w, replies=rep_r)
        self.forked += 1
        self.workers.append(worker)
        self.by_fd[rep_r] = worker

    @property
    def reply_fds(self) -> list[int]:
        return [w.replies for w in self.workers]

    @property
    def in_flight(self) -> int:
        return sum(w.in_flight for w in self.workers)

    @property
    def idle(self) -> int:
        """How many workers hold no request (a lazy pool not started yet: all)."""
        if not self._started:
            return self.count * self.depth
        return sum(self._room(w) for w in self.workers)

    def _room(self, w: _Worker) -> int:
        if w.long is not None:
            return 0  # behind a long task: nothing waits there
        return max(0, self.depth - w.in_flight)

    def submit(self, token: int, request: Any) -> None:
        self.start()
        if not self.workers:
            raise OperationalError("the staging workers are gone")
        # least loaded first; a second request only where it waits behind no
        # long task
        worker = min(self.workers, key=lambda w: (w.in_flight, w.long is not None))
        worker.in_flight += 1
        try:
            write_all(worker.requests, _frame((token, request)))
        except OSError as exc:
            raise OperationalError(f"a staging worker is gone: {exc.strerror}") from None

    def read(self, fd: int) -> list[Reply]:
        """Every complete reply waiting on ``fd`` (a worker's reply pipe). A worker
        gone mid-request raises, but only once the replies it sent before dying
        were returned (a "started" among them names the task process the
        dispatcher must then kill): its pipe stays readable at end of file, so
        the next read raises."""
        worker = self.by_fd[fd]
        gone = False
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                gone = True
                break
            worker.buffer += chunk
            if len(chunk) < 1 << 16:
                # the pipe is empty now: what comes later wakes the selector
                # again (level-triggered), and a read to hear EAGAIN is a
                # syscall and an exception per reply
                break
        replies: list[Reply] = []
        buf = worker.buffer
        while len(buf) >= _HEADER:
            size = int.from_bytes(buf[:_HEADER], "little")
            if len(buf) < _HEADER + size:
                break
            token, outcome, payload = pickle.loads(bytes(buf[_HEADER : _HEADER + size]))
            del buf[: _HEADER + size]
            reply = Reply(token, outcome, payload)
            if reply.final:
                worker.in_flight -= 1
                if worker.long == token:
                    worker.long = None
            elif self.depth > 1:
                worker.long = token
            replies.append(reply)
        if gone and worker.in_flight and not replies:
            raise OperationalError(f"a staging worker (pid {worker.pid}) died mid-request")
        return replies

    def close(self) -> None:
        """Close the request pipes (workers exit at EOF) and reap the workers; a
        lazy pool never started forks nothing now."""
        self._started = True
        for w in self.workers:
            with contextlib.suppress(OSError):
                os.close(w.requests)
        for w in self.workers:
            try:
                _, _, usage = os.wait4(w.pid, 0)
                self.peak_rss_kib = max(self.peak_rss_kib, usage.ru_maxrss)
            except ChildProcessError:
                pass
            with contextlib.suppress(OSError):
                os.close(w.replies)
        self.workers.clear()
        self.by_fd.clear()

"""One unit's life, run inside a dispatcher worker: stage, start, wait, capture.

A worker (:mod:`crucible.run.executors._workers`) takes a unit from the scheduling thread
and carries it through: workspace and inputs (first attempt), a free slot, the
task process, its exit (or its timeout), and the capture of its result. It
tells the scheduling thread once the process started (an interim reply, for
``task_started``) and once the unit is done (the final reply). The task
process is the worker's child, so the worker is the one that reaps it and the
one that kills its group: no other process ever signals a group whose leader
may already have been reaped (a recycled pid).

Coordination between workers and the scheduling thread goes through
:class:`Slots`, three pipes created before the workers are forked:

- slot tokens: ``-j N`` bytes; a worker takes one before it starts a process
  and gives it back once the process was reaped, so at most N task processes
  run at once across every worker;
- stop: written once when the dispatcher received SIGINT/SIGTERM; nobody reads
  it, so it stays readable for every worker: start nothing new, terminate the
  running group, escalate to SIGKILL after the grace period;
- kill: written on a second signal: SIGKILL now.

A worker also watches its request pipe: POLLHUP there means the dispatcher is
gone, and the worker kills its task's group rather than leave it orphaned.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crucible.compile import MAX_WAIT_S
from crucible.core import atomic
from crucible.core.errors import CrucibleError
from crucible.core.fdio import write_all
from crucible.core.plan import Plan, Task
from crucible.run._options import RunOptions
from crucible.run.cache._unit import UnitCache, cacheable
from crucible.run.engine import _verdict as verdict_rules
from crucible.run.engine._failures import (
    TAIL_BYTES,
    add_log_fields,
    compose_note,
    exit_text,
    tail_text,
)
from crucible.run.executors._agent_io import AgentStdout, stdin_source
from crucible.run.executors._environ import task_environment
from crucible.run.executors._launch import launch
from crucible.run.executors._procs import TaskProcess, kill_group
from crucible.run.executors._recycle import WorkspacePool
from crucible.run.executors._usage import (
    format_memory,
    from_rusage,
    hit_memory_limit,
    memory_limit,
    memory_limit_argv,
)
from crucible.run.executors._workers import Channel, Inbox
from crucible.run.session._mirror import follow_out
from crucible.stage import (
    PROMPT_ENV_MAX,
    StateDir,
    StateLayout,
    amend_record,
    clear_path,
    escape_key,
    guard_views,
)

__all__ = ["Slots", "UnitPaths", "UnitRunner"]

PASSED, FAILED = "passed", "failed"

#: how long a task runs before its start is reported on its own (see _wait)
ANNOUNCE_AFTER = 0.002
#: the longest single poll (crucible.compile._durations.MAX_WAIT_S)
_MAX_WAIT_MS = int(MAX_WAIT_S * 1000)
#: units a pipelined worker stages ahead of its running one (UnitRunner.serve;
#: its pool queues AHEAD + 1 requests to it: crucible.run.executors._workers)
AHEAD = 3
#: how long a pipelined worker's task runs before the unit staged behind it is
#: handed back to start elsewhere (UnitRunner.serve): the longest a ready unit
#: waits behind another's task
HANDBACK_AFTER = 0.02
#: ... or this many times the median of the worker's last RECENT task durations
HANDBACK_TIMES = 5
RECENT = 31
_POLL_IN = select.POLLIN
_POLL_GONE = select.POLLHUP | select.POLLERR


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
            self._stop_poll.register(self.stop_r, _POLL_IN)
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


class UnitPaths:
    """Where a unit's files go under STATE, as :class:`crucible.stage.StateLayout`
    spells them; their parent directories are created once per process."""

    def __init__(self, state: Path, layout: StateLayout) -> None:
        self.state = state
        self.layout = layout
        self._made_dirs: set[Path] = set()
        self._output_dirs: dict[int, Path] = {}
        self._work_root = layout.work_root

    def _made(self, path: Path) -> Path:
        parent = path.parent
        if parent not in self._made_dirs:
            parent.mkdir(parents=True, exist_ok=True)
            self._made_dirs.add(parent)
        return path

    def output(self, name: str, key: str | None, attempt: int) -> Path:
        # ``name`` is a plan task's (the runner looked it up first), checked when
        # the plan's view was built: joined as is
        if key is not None:
            return self._made(self.layout.output_path(name, key, attempt))
        # An unmapped task's: its attempt's directory (as the layout spells it,
        # made once) and one join, instead of the layout's four Path steps.
        where = self._output_dirs.get(attempt)
        if where is None:
            where = self._made(self.layout.output_path(name, None, attempt)).parent
            self._output_dirs[attempt] = where
        return where / (name + ".json")

    def work(self, name: str, key: str | None) -> Path:
        """The unit's workspace, as the layout spells it (an unmapped task's: one
        join onto the cached ``work/``)."""
        if key is not None:
            return self.layout.work_dir(name, key)
        return self._work_root / name

    def log(self, name: str, key: str | None) -> Path:
        return self._made(self.layout.log_path(name, key))

    def prompt(self, name: str, key: str | None) -> Path:
        return self._made(self.layout.prompt_path(name, key))

    def log_path(self, name: str, key: str | None) -> Path:
        """Where the unit's log is (creating nothing)."""
        return self.layout.log_path(name, key)


class _LogSink:
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
        follow: _Follow | None,
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


class _Follow:
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


@dataclass
class _Staged:
    """A unit attempt made ready to start (:meth:`UnitRunner._begin`)."""

    name: str
    key: str | None
    attempt: int
    task: Task
    workspace: Path
    output: Path
    staged_env: dict[str, str] | None
    prepared: dict[str, Any]
    cache_key: Any
    #: a scored loop's time budget (wall clock), as [when] or []
    stop_by: list[Any]


@dataclass
class _Started:
    """A started attempt (:meth:`UnitRunner._start`)."""

    staged: _Staged
    proc: TaskProcess
    out_r: int
    agent_out: AgentStdout | None
    sink: _LogSink
    #: the producer units whose files it holds (None: look them up)
    held: Any


def _not_started(staged: _Staged) -> dict[str, Any]:
    """Stopping: a staged unit is not started and stays unsettled."""
    return {"kind": "not_started", "staged_env": staged.staged_env}


class _Pipeline:
    """What a pipelined worker's :meth:`UnitRunner._wait` does besides waiting
    (:meth:`UnitRunner.serve`): take the next request while none is staged,
    and once the task runs long hand whatever is staged back."""

    def __init__(
        self,
        take: Callable[[], object],
        pending: list[Any],
        hand_back: Callable[[], None],
        after: float = HANDBACK_AFTER,
    ) -> None:
        self._take = take
        self._pending = pending
        self._hand_back = hand_back
        #: how long the task may run before what is staged behind it goes back
        self.after = after
        self.long = False

    def watching(self) -> bool:
        """Whether to wake for a request: none is staged (one staged is taken
        with the next exit instead: no wake-up), or the task runs long (a
        request sent before the dispatcher heard so is handed back at once)."""
        return self.long or not self._pending

    def on_request(self) -> bool:
        """The request pipe is readable; returns whether to keep watching it."""
        self._take()
        if self.long:
            self._hand_back()
        return self.watching()

    def on_long(self) -> None:
        """The task ran HANDBACK_AFTER: what is staged behind it goes elsewhere."""
        self.long = True
        self._hand_back()


class UnitRunner:
    """Worker side of a unit (see module doc). Built in the dispatcher before the
    workers are forked; :meth:`run` is called in a worker."""

    #: a worker on the dispatcher's host writes records without fsync and says
    #: which files it wrote (the dispatcher fsyncs them, once per group commit);
    #: a Dask worker, maybe on another host, makes its own records durable
    durable_records = False

    def __init__(
        self,
        *,
        plan: dict[str, Any],
        model: Plan,
        options: RunOptions,
        emit_cap: int,
        environ: Mapping[str, str],
        slots: Slots,
        pack_dir: str = "",
        state_dir: StateDir | None = None,
    ) -> None:
        self.plan = plan
        #: the plan's typed model, and its tasks by name (crucible.core.plan)
        self.model = model
        self.tasks: Mapping[str, Task] = model.by_name
        self.options = options
        self.state = options.state
        #: the run's records and staging: the dispatcher's (inherited by its forked
        #: workers), or, on a Dask or SLURM node, built here over the plan the
        #: dispatcher checked
        self.state_dir = state_dir or StateDir(plan, options.state, checked=True)
        self.layout = self.state_dir.layout
        self.paths = UnitPaths(options.state, self.layout)
        self.emit_cap = emit_cap
        self.environ = environ
        self.slots = slots
        self.pack_dir = pack_dir
        self._host_env: dict[Any, dict[str, str]] = {}
        #: what a sandboxed unit may touch (crucible.run.executors._sandbox), made at the first
        self._sandbox: Any = None
        #: tasks whose settling wakes nothing (no consumer, outside a scored
        #: loop): a pipelined worker defers their passed replies (serve); set
        #: by the dispatcher before its workers are forked
        self.quiet: frozenset[str] = frozenset()
        # --- workspace recycling (crucible.run.executors._recycle): per process after the fork
        self.pool = WorkspacePool(keep=options.keep_workspaces)
        # --cache DIR (docs/spec/cache.md): the scheduling thread restored the hits
        # (crucible.run.cache._hits); a unit that reaches a worker is keyed and, once
        # it passed, saved
        self.cache: Any = None
        if options.cache is not None:
            # lazy: run.cache._keyer is not loaded with this module; only __init__() needs it
            from crucible.run.cache._keyer import Keyer

            keyer = Keyer(
                plan,
                options.state,
                plan_view=self.state_dir.view,
                environ=environ,
                agent_cmd=options.agent_cmd,
                emit_cap=emit_cap,
                pack_dir=pack_dir,
                cache_dir=options.cache,
            )
            self.cache = UnitCache(options.cache, keyer)

    # ----------------------------------------------------------------- a unit

    def run(self, request: tuple[Any, ...], channel: Channel) -> dict[str, Any]:
        """``("unit", name, key, attempt, staged_env[, stop_by[, cache]])``: one
        attempt of one unit (``stop_by``: a loop revision's time budget, as a
        wall-clock time, or None). ``staged_env`` is None on a first attempt
        (stage now), else what staging returned then (a retry keeps its workspace
        and inputs). With --cache, ``cache`` is ``("key", CacheKey)``, ``("hit",
        CacheKey)`` (restore it from the cache if it still hits) or None (key it
        here). The phases (:meth:`_begin`, :meth:`_start`, :meth:`_wait`,
        :meth:`_ended`, :meth:`_finish`) are also what :meth:`serve` runs."""
        staged = self._begin(request)
        if isinstance(staged, dict):
            return staged
        if not self.slots.acquire(channel.requests_fd):
            # Stopping: a staged unit is not started and stays unsettled.
            return _not_started(staged)
        try:
            started = self._start(staged)
            if isinstance(started, dict):
                return started
            code, stop_reason, gone = self._wait(
                started.proc, channel, started.out_r, started.sink, started.agent_out
            )
            held_notes = self._ended(started, gone)
        finally:
            self.slots.release()
        return self._finish(started, code, stop_reason, gone, held_notes)

    def _begin(self, request: tuple[Any, ...]) -> _Staged | dict[str, Any]:
        """Everything before the slot: a cache hit restored here (its final
        reply), else the workspace and inputs (first attempt), a fresh output
        path and the prompt; a staging failure is its final reply."""
        _, name, key, attempt, staged_env, *extra = request
        stop_by = extra[:1] if extra and extra[0] is not None else []
        cached = extra[1:2]
        task = self.tasks[name]
        cache_key = None
        if self.cache is not None and cacheable(task):
            # keyed on the scheduling thread (crucible.run.cache._hits), else here
            how, cache_key = cached[0] if cached and cached[0] else ("", None)
            cache_key = cache_key or self.cache.key(name, key)
            if how == "hit" and (hit := self._cache_hit(cache_key, attempt)):
                return hit  # a hit with large files
        workspace = self.paths.work(name, key)
        output = self.paths.output(name, key, attempt)
        # a first attempt of a keyed unit takes a free workspace of its task, if any
        recycled = staged_env is None and self.pool.acquire(key, workspace)
        try:
            prepared = self._prepare(
                task, name, key, workspace, output, staged_env is None, in_place=recycled
            )
        except CrucibleError as exc:
            return {"kind": "stage_error", "message": str(exc)}
        if staged_env is None:
            staged_env = prepared["staged_env"]
        return _Staged(
            name, key, attempt, task, workspace, output, staged_env, prepared, cache_key, stop_by
        )

    def _start(self, staged: _Staged) -> _Started | dict[str, Any]:
        """With a slot held: refresh what was staged ahead, start the task
        process. A failure is the unit's final reply (the caller gives the slot
        back)."""
        name, key, task, workspace = staged.name, staged.key, staged.task, staged.workspace
        prepared = staged.prepared
        # The producer units whose files it holds: known from this attempt's
        # staging (most hold none, and pay for no second look), else (None: a
        # retry) looked up by each check below.
        held = prepared["held"]
        try:  # staged ahead: undo what another consumer changed meanwhile
            if held is None or held:  # None (a retry): they look the units up
                self.state_dir.refresh_inputs(name, workspace, key=key, units=held)
        except CrucibleError as exc:
            return {"kind": "stage_error", "message": str(exc)}
        if task.kind == "agent":
            argv = ["sh", "-c", self.options.agent_cmd or "false"]
        else:
            run = task.run
            assert run is not None  # command and evaluate tasks have one
            argv = ["sh", "-c", run] if isinstance(run, str) else list(run)
        limit = memory_limit(task, self.options.enforce_memory)
        if limit is not None:  # --enforce-memory
            argv = memory_limit_argv(argv, limit)
        env = self._environment(
            task, name, key, staged.attempt, staged.staged_env, prepared, staged.output
        )
        env["CRUCIBLE_WORKSPACE"] = str(workspace)
        timeout = task.timeout
        if staged.stop_by:  # a scored loop's revision: its time budget ends (wall clock) then
            left = max(0.0, float(staged.stop_by[0]) - time.time())
            timeout = left if timeout is None else min(float(timeout), left)
        # --- agent streams (crucible.run.executors._agent_io): prompt on stdin, own stdout pipe
        stdin = stdin_source(task, prepared["prompt_file"])
        # --- end agent streams
        sandbox = None
        if self._sandboxed(task):
            # lazy: run.executors._sandbox is not loaded with this module; only _start() needs it
            from crucible.run.executors._sandbox import SandboxUnavailable

            try:
                sandbox = self._sandbox_of().spec(
                    task, str(workspace), str(staged.output.parent), stdin
                )
            except SandboxUnavailable as exc:  # a worker on another host: never unsandboxed
                return {
                    "kind": "spawn_error",
                    "message": f"cannot start sandboxed: {exc}",
                    "staged_env": staged.staged_env,
                }
            # its private TMPDIR is the workspace itself: a directory more per
            # unit would cost a third of a sandboxed start (bench_sandbox.py)
            env["TMPDIR"] = str(workspace)
        started_at = time.time()
        try:
            proc, out_r, agent_out = self._launch(
                argv, env, workspace, timeout, stdin, task.kind == "agent", sandbox=sandbox
            )
        except (OSError, ValueError) as exc:
            # ValueError: a NUL in argv or the environment (none should get
            # this far; a failed start, never a crashed worker)
            why = exc.strerror if isinstance(exc, OSError) else None
            return {
                "kind": "spawn_error",
                "message": f"cannot start {argv[0]!r}: {why or exc}",
                "staged_env": staged.staged_env,
            }
        # lazy: run.session._log is not loaded with this module; only _start() needs it
        from crucible.run.session._log import now_text

        attempt = staged.attempt

        def header() -> bytes:  # built at the first byte: quiet attempts pay nothing
            return log_header(name, key, attempt, argv, now_text(started_at))

        follow = _Follow(follow_prefix(name, key)) if self.options.follow else None
        sink = _LogSink(self.paths, name, key, attempt, header, follow)
        return _Started(staged, proc, out_r, agent_out, sink, held)

    # ------------------------------------------------------------- sandbox

    def _sandboxed(self, task: Task) -> bool:
        return task.sandbox or self.options.sandbox

    def _sandbox_of(self) -> Any:
        if self._sandbox is None:
            # lazy: only _sandbox_of() needs it (start-up)
            from crucible.run.executors._sandbox import UnitSandbox

            self._sandbox = UnitSandbox(self.environ, str(self.state), self.pack_dir)
        return self._sandbox

    def _ended(self, started: _Started, gone: bool) -> list[str] | None:
        """The leader was reaped: close its pipes and log, and check what it was
        handed before its slot is given back (or handed on): a changed staged
        file is restored before the next consumer can start (at -j 1 no other
        consumer ever reads it; docs/spec/inputs.md 3.4). Returns the notes of
        what changed (None: not checked)."""
        os.close(started.out_r)
        if started.agent_out is not None:
            started.agent_out.close()
        started.sink.close()
        held = started.held
        staged = started.staged
        if gone:
            return None
        if held is not None and not held:
            return []
        with contextlib.suppress(CrucibleError):  # capture checks again, and says why
            return list(
                self.state_dir.check_inputs(
                    staged.name, staged.workspace, key=staged.key, units=held
                )
            )
        return None

    def _finish(
        self,
        started: _Started,
        code: int,
        stop_reason: str | None,
        gone: bool,
        held_notes: list[str] | None,
    ) -> dict[str, Any]:
        """After the slot: the agent's response, capture, the cache, the final reply."""
        staged, proc, sink, agent_out = (
            started.staged,
            started.proc,
            started.sink,
            started.agent_out,
        )
        name, key, task, workspace, output = (
            staged.name, staged.key, staged.task, staged.workspace, staged.output
        )  # fmt: skip
        attempt, cache_key = staged.attempt, staged.cache_key
        log_error = sink.error
        # An agent that exited 0 without a result file: its stdout is `response`.
        response_problem = None
        if agent_out is not None and code == 0 and stop_reason in (None, "interrupt"):
            try:
                response_problem = agent_out.substitute(output)
            except CrucibleError as exc:
                response_problem = str(exc)

        # The log fields cost a stat and a split: only a failure pays for them.
        def log_fields() -> tuple[str | None, str]:
            path = self.paths.log_path(name, key)
            rel = str(path.relative_to(self.state)) if sink.wrote or path.exists() else None
            return rel, tail_text(sink.tail)

        duration = time.monotonic() - proc.started
        usage = from_rusage(proc.usage, proc.spawner_rss_kib)
        finished: dict[str, Any] = {
            "kind": "finished",
            "pid": proc.pid,
            "code": code,
            "duration": duration,
            "stop_reason": stop_reason,
            "staged_env": staged.staged_env,
            "record": None,
            "capture_error": None,
            "log_error": log_error,
            "log": None,
            "tail": "",
            "usage": usage,
        }
        with contextlib.suppress(OSError):
            finished["output_bytes"] = output.stat().st_size
        if cache_key is not None and attempt == 1:  # looked up and missed: why (report)
            finished["cache_miss"] = self._miss_reason(name, key, cache_key)
        if gone:
            raise SystemExit(70)  # nobody to reply to
        # A task stopped by an interrupt that still exits 0 (a TERM trap that
        # finished its work) is captured like any other: it is what it was.
        if stop_reason is None or (stop_reason == "interrupt" and code == 0):
            try:
                finished["record"] = self._capture(
                    task,
                    name,
                    key,
                    workspace,
                    attempt,
                    output,
                    code,
                    log_fields,
                    response_problem=response_problem,
                    held_notes=held_notes,
                    usage=usage,
                )
            except CrucibleError as exc:
                finished["capture_error"] = str(exc)
        record = finished["record"]
        if record is None or record.get("status") != PASSED:
            finished["log"], finished["tail"] = log_fields()
        elif cache_key is not None and code == 0:
            # store files, then the ledger line: appended by the dispatcher with its
            # batch once the unit's record is durable, unless this worker makes its
            # own records durable (a Dask worker, maybe on another host)
            finished["cache_fact"] = self.cache.save(cache_key, defer=not self.durable_records)
        if record is not None and record.get("status") == PASSED:
            self._passed(key, workspace, output)
        if self.cache is not None:
            finished["cache_warnings"] = self.cache.take_warnings()
        return finished

    # ------------------------------------------------------- a pipelined worker

    def serve(self, inbox: Inbox) -> None:
        """A local worker's life (a pipelined pool, crucible.run.executors._workers): it
        holds one slot from one unit to the next. While its task runs it takes
        the next request and stages it; when the task exits (and what it held
        was checked) the slot passes straight to the staged unit, which starts
        before the one that ended is captured. So a short task costs one
        wake-up of its worker (the exit), not three (request, slot, exit), and
        a slot is idle only for a reap and a spawn. A task that runs past
        HANDBACK_AFTER hands its staged successor back (``handback``: another
        worker starts it), so no unit waits long behind another's task."""
        held: dict[int, None] = {}  # tokens without a final reply
        # this process lives from each staging to its check: it can guard the
        # consumers' links to the one stored copy (docs/spec/inputs.md 3.4)
        guard_views()
        try:
            self._serve(inbox, held)
        except Exception as exc:  # a bug: said for every token held, then gone
            for token in held:
                inbox.fail(token, exc)

    def _serve(self, inbox: Inbox, held: dict[int, None]) -> None:
        slot = False
        running: tuple[int, _Started] | None = None
        #: staged, in the order they start (at most AHEAD)
        pending: list[tuple[int, _Staged]] = []
        #: how long this worker's last tasks ran (seconds)
        recent: deque[float] = deque(maxlen=RECENT)

        def answer(token: int, payload: dict[str, Any], name: str | None = None) -> None:
            held.pop(token, None)
            record = payload.get("record")
            if (
                name in self.quiet
                and payload.get("kind") == "finished"
                and record is not None
                and record.get("status") == PASSED
            ):
                # nothing waits for it: sent with the next reply, or once fewer
                # than two units are staged here (below)
                inbox.defer(token, payload)
            else:
                inbox.reply(token, payload)

        def take(block: bool) -> bool:
            """Take a request and stage it; False when none was whole yet (or,
            without ``block``, none is waiting)."""
            item = inbox.take(block=block)
            if item is None:
                return False
            token, request = item
            held[token] = None
            try:
                staged = self._begin(request)
            except CrucibleError as exc:  # a refusal it did not expect to meet
                held.pop(token, None)
                inbox.fail(token, exc)
                return True
            if isinstance(staged, dict):
                answer(token, staged)
            else:
                pending.append((token, staged))
            return True

        def hand_back() -> None:  # the running task runs long: what waits goes elsewhere
            while take(block=False):  # sent before the dispatcher heard it runs long
                pass
            for token, staged in pending:
                answer(token, {"kind": "handback", "staged_env": staged.staged_env})
            pending.clear()

        while True:
            if running is None:
                if not pending:
                    inbox.flush()  # nothing to run: the dispatcher hears all first
                    if not take(block=True):
                        if inbox.closed:
                            break
                        continue
                    continue
                token, staged = pending.pop(0)
                if not slot:
                    if not self.slots.acquire(inbox.requests_fd):
                        answer(token, _not_started(staged))
                        continue
                    slot = True
                started = self._start(staged)
                if isinstance(started, dict):
                    self.slots.release()
                    slot = False
                    answer(token, started)
                    continue
                running = (token, started)
            token, started = running
            # Stage what the dispatcher sent meanwhile (it is waiting in the pipe:
            # taking it now costs no wake-up), up to AHEAD units.
            while len(pending) < AHEAD and take(block=False):
                pass
            channel = inbox.channel(token)
            channel.pipeline = _Pipeline(
                lambda: take(block=False), pending, hand_back, self._handback_after(recent)
            )
            code, stop_reason, gone = self._wait(
                started.proc, channel, started.out_r, started.sink, started.agent_out
            )
            held_notes = self._ended(started, gone)
            recent.append(time.monotonic() - started.proc.started)
            running = None
            if gone:
                raise SystemExit(70)  # nobody to reply to (its group is killed)
            if pending and self.slots.stopping():
                for nt, ns in pending:
                    answer(nt, _not_started(ns))
                pending.clear()
            if pending:  # the slot passes on: start the next before capturing this one
                nt, ns = pending.pop(0)
                following = self._start(ns)
                if isinstance(following, dict):
                    self.slots.release()
                    slot = False
                    answer(nt, following)
                else:
                    running = (nt, following)
            else:
                self.slots.release()
                slot = False
            try:
                result = self._finish(started, code, stop_reason, gone, held_notes)
            except CrucibleError as exc:
                held.pop(token, None)
                inbox.fail(token, exc)
            else:
                answer(token, result, started.staged.name)
            if len(pending) < 2:  # the dispatcher refills while the next ones run
                inbox.flush()
        inbox.flush()
        if slot:
            self.slots.release()

    @staticmethod
    def _handback_after(recent: deque[float]) -> float:
        """HANDBACK_AFTER, or HANDBACK_TIMES the median of the worker's recent
        task durations when that is more: on a loaded machine a quick task
        waits for a CPU for tens of ms, and handing back what is staged behind
        it would only move the wait (and cost a round trip)."""
        if len(recent) < 3:
            return HANDBACK_AFTER
        ordered = sorted(recent)
        return max(HANDBACK_AFTER, HANDBACK_TIMES * ordered[len(ordered) // 2])

    def _passed(self, key: str | None, workspace: Path, output: Path) -> None:
        """A passed attempt leaves neither its output file (its record holds what
        it said) nor, when it can be recycled, its workspace (run.md, "State
        directory"); a failed one keeps both for inspection."""
        with contextlib.suppress(OSError):
            os.unlink(output)
        self.pool.release(key, workspace)

    def _cache_hit(self, ck: Any, attempt: int) -> dict[str, Any] | None:
        """The final reply of a hit restored here, or None (it runs)."""
        reply = None if ck is None else self.cache.lookup_reply(ck, attempt)
        if reply is None:
            return None
        return {**reply, "cache_warnings": self.cache.take_warnings()}

    def _prepare(
        self,
        task: Task,
        name: str,
        key: str | None,
        workspace: Path,
        output: Path,
        stage_now: bool,
        *,
        in_place: bool = False,
    ) -> dict[str, Any]:
        """Workspace and staged inputs (first attempt; ``in_place``: into a
        recycled workspace), fresh output path, prompt."""
        staged_env: dict[str, str] | None = None
        held = None  # not staged now: the caller looks them up
        if stage_now:  # stage_inputs creates the workspace
            staged = self.state_dir.stage_inputs(name, workspace, key=key, in_place=in_place)
            staged_env = dict(staged.env)
            held = staged.held
        clear_path(output)  # whatever an earlier attempt left there, a tree too
        prompt_file: str | None = None
        prompt_env: str | None = None
        if task.kind == "agent":
            prompt = self.state_dir.render_prompt(name, workspace, key=key)
            path = self.paths.prompt(name, key)
            data = prompt.encode("utf-8")
            # Rewritten on every attempt: atomic, not durable. A short "@tmp-"
            # temp name, as the path may end in a 250-byte escaped key.
            atomic.write_bytes(path, data, tmp_prefix="@tmp-", durable=False)
            prompt_file = str(path)
            # An environment value cannot hold NUL (execve would refuse the
            # whole launch); such a prompt travels only in the file.
            if len(data) <= PROMPT_ENV_MAX and "\x00" not in prompt:
                prompt_env = prompt
        return {
            "staged_env": staged_env,
            "prompt_file": prompt_file,
            "prompt_env": prompt_env,
            "held": held,
        }

    def _environment(
        self,
        task: Task,
        name: str,
        key: str | None,
        attempt: int,
        staged_env: dict[str, str] | None,
        prepared: dict[str, Any],
        output: Path,
    ) -> dict[str, str]:
        # The host part depends only on the variables a task declares: tasks
        # that declare the same (most: none) share one, built once per worker.
        env_key = task.env
        base = self._host_env.get(env_key)
        if base is None:
            base = self._host_env[env_key] = task_environment(
                self.model.edition, task.env, self.environ
            )
        env = dict(base)
        env.update(staged_env or {})
        env["CRUCIBLE_TASK"] = name
        if key is not None:
            # An environment value cannot hold NUL (execve refuses the launch):
            # such a key travels escaped, as in its paths; the index keeps it raw.
            env["CRUCIBLE_KEY"] = key if "\x00" not in key else escape_key(key)
        if self.pack_dir:
            env["CRUCIBLE_PACK_DIR"] = self.pack_dir
        env["CRUCIBLE_ATTEMPT"] = str(attempt)
        env["CRUCIBLE_OUTPUT"] = str(output)
        if prepared["prompt_file"] is not None:
            env["CRUCIBLE_PROMPT_FILE"] = prepared["prompt_file"]
        if prepared["prompt_env"] is not None:
            env["CRUCIBLE_PROMPT"] = prepared["prompt_env"]
        return env

    #: starts an attempt's process (crucible.run.executors._launch; a Dask worker wraps it)
    _launch = staticmethod(launch)

    def _wait(
        self,
        proc: TaskProcess,
        channel: Channel,
        out_r: int,
        sink: _LogSink,
        agent_out: AgentStdout | None = None,
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
        pipe: _Pipeline | None = getattr(channel, "pipeline", None)
        long_at = None if pipe is None else proc.started + pipe.after
        poller = select.poll()
        poller.register(proc.pidfd, _POLL_IN)
        poller.register(out_r, _POLL_IN)
        poller.register(self.slots.stop_r, _POLL_IN)
        poller.register(self.slots.kill_r, _POLL_IN)
        # POLLHUP only (the dispatcher is gone), unless a request is wanted
        poller.register(requests_fd, _POLL_IN if pipe is not None and pipe.watching() else 0)
        if agent_out is not None:
            poller.register(agent_out.fd, _POLL_IN)
        grace = self.options.kill_grace
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
            if self.slots.stop_r in ready:
                poller.unregister(self.slots.stop_r)
                if proc.stop_reason is None or proc.stop_reason == "timeout":
                    proc.stop_reason = "interrupt"
                    kill_group(proc.pid, signal.SIGTERM)
                    proc.kill_at = now + grace
            if self.slots.kill_r in ready or (
                requests_fd in ready and ready[requests_fd] & _POLL_GONE
            ):
                if requests_fd in ready:
                    gone = True
                    poller.unregister(requests_fd)
                if self.slots.kill_r in ready:
                    poller.unregister(self.slots.kill_r)
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

    def _capture(
        self,
        task: Task,
        name: str,
        key: str | None,
        workspace: Path,
        attempt: int,
        output: Path,
        code: int,
        log_fields: Callable[[], tuple[str | None, str]],
        response_problem: str | None = None,
        held_notes: list[str] | None = None,
        usage: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Capture one attempt's result; reply with what the scheduler needs (never
        the output itself, which may be large). A failed record gains the log
        fields and a note naming how it ended (crucible.run.engine._failures)."""
        # The record is built by capture, amended here in memory, and written
        # ONCE, without fsync: the dispatcher's group commit fsyncs the file
        # before any dependant starts (docs/spec/run.md, "Session log").
        record = self.state_dir.capture(
            name,
            workspace,
            output_file=output,
            exit_code=code,
            key=key,
            attempt=attempt,
            emit_cap=self.emit_cap,
            held_notes=held_notes,
            write=False,
            # a passed workspace is emptied of what was captured (one copy),
            # unless it is kept; an evaluate task's verdict may still fail it
            empty_workspace=not self.options.keep_workspaces and task.kind != "evaluate",
        )
        if record.get("status") == PASSED and task.kind == "evaluate":
            record = self._apply_verdict(record, output)
        if response_problem is not None:  # an agent's stdout over RESPONSE_MAX
            note = "; ".join(n for n in (response_problem, record.get("note")) if n)
            record = amend_record(record, status=FAILED, note=note, retryable=False)
        sandboxed = self._sandboxed(task)
        if record.get("status") != PASSED:
            log, tail = log_fields()
            record = dict(record)
            note = str(record.get("note", ""))
            if sandboxed:  # led by what the sandbox refused, when its output says
                note = self._sandbox_of().note(task, str(workspace), str(output.parent), tail, note)
            limit = memory_limit(task, self.options.enforce_memory)
            if limit is not None and code != 0 and hit_memory_limit(tail):
                note = f"killed: exceeded memory {format_memory(limit)} ({exit_text(code)})"
            record["note"] = compose_note(note, code, log, tail)
            add_log_fields(record, log, tail)
        if sandboxed:
            record = {**record, "sandbox": True}
        if usage is not None:  # what the attempt cost (crucible.run.executors._usage)
            record = {**record, "usage": usage}
        wrote = self.state_dir.write_result_where(record, durable=self.durable_records)
        summary = {k: record.get(k) for k in ("status", "note", "retryable", "files_captured")}
        if record.get("files_captured"):
            summary["files_bytes"] = sum(int(f.get("size", 0)) for f in record.get("files", []))
        if not self.durable_records:  # the dispatcher fsyncs these in its group commit
            summary["wrote"] = list(wrote)
        if "limits" in self.plan["workflow"] and record.get("status") == PASSED:
            # an accounted run's audit (docs/spec/export.md §4), without a read back
            summary["output"] = record.get("output", {})
        return summary

    def _miss_reason(self, name: str, key: str | None, cache_key: Any) -> str:
        """Why a unit the cache was asked for missed (docs/spec/cache.md, "Why
        did it run"), against the last key recorded for it: read before this
        attempt records its own."""
        try:
            last = self.cache.cache.last_components(name, key, escape_key)
            return str(self.cache.keyer.explain(last, cache_key.components))
        except (OSError, CrucibleError, ValueError):
            return "cannot say (the cache's last key cannot be read)"

    def _apply_verdict(self, record: dict[str, Any], output: Path) -> dict[str, Any]:
        """An evaluate task that passed capture passes only with ``verdict: "pass"``.
        Otherwise its captured record (output kept, for settled consumers) is
        amended to a measured failure."""
        value, problem = verdict_rules.check(output)
        if problem is None:
            return record
        return amend_record(
            record, status=FAILED, note=problem, retryable=False, extra={"verdict": value}
        )

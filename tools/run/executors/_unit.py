"""One unit's life, run inside a dispatcher worker: stage, start, wait, capture.

A worker (:mod:`crucible.run.executors._workers`) takes a unit from the scheduling thread
and carries it through: workspace and inputs (first attempt), a free slot, the
task process, its exit (or its timeout), and the capture of its result. It
tells the scheduling thread once the process started (an interim reply, for
``task_started``) and once the unit is done (the final reply). The task
process is the worker's child, so the worker is the one that reaps it and the
one that kills its group: no other process ever signals a group whose leader
may already have been reaped (a recycled pid).

Its rooms: the phases are this module's :class:`UnitRunner` (stage, start),
crucible.run.executors._waiting (the wait), crucible.run.executors._capturing
(capture and the final reply); a local worker runs them in the loop of
crucible.run.executors._pipelined; the attempt between phases is
crucible.run.executors._attempt, its log crucible.run.executors._tasklog, its
paths crucible.run.executors._unit_paths, and the slots the workers share
(``-j`` tokens, stop, kill) crucible.run.executors._slots.

A worker also watches its request pipe: POLLHUP there means the dispatcher is
gone, and the worker kills its task's group rather than leave it orphaned.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from crucible.core import atomic
from crucible.core.errors import CrucibleError
from crucible.core.plan import Plan, Task
from crucible.run._options import RunOptions
from crucible.run.cache._unit import UnitCache, cacheable
from crucible.run.executors._agent_io import AgentStdout, stdin_source
from crucible.run.executors._attempt import Staged, Started, not_started
from crucible.run.executors._capturing import finish
from crucible.run.executors._environ import task_environment
from crucible.run.executors._launch import launch
from crucible.run.executors._pipelined import serve
from crucible.run.executors._procs import TaskProcess
from crucible.run.executors._recycle import WorkspacePool
from crucible.run.executors._slots import Slots
from crucible.run.executors._tasklog import Follow, LogSink, follow_prefix, log_header
from crucible.run.executors._unit_paths import UnitPaths
from crucible.run.executors._usage import (
    memory_limit,
    memory_limit_argv,
)
from crucible.run.executors._waiting import wait_for_exit
from crucible.run.executors._workers import Channel, Inbox
from crucible.stage import (
    PROMPT_ENV_MAX,
    StateDir,
    clear_path,
    escape_key,
    guard_views,
)

__all__ = ["UnitRunner"]


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
        staged = self.begin(request)
        if isinstance(staged, dict):
            return staged
        if not self.slots.acquire(channel.requests_fd):
            # Stopping: a staged unit is not started and stays unsettled.
            return not_started(staged)
        try:
            started = self.start(staged)
            if isinstance(started, dict):
                return started
            code, stop_reason, gone = self.wait(
                started.proc, channel, started.out_r, started.sink, started.agent_out
            )
            held_notes = self.ended(started, gone)
        finally:
            self.slots.release()
        return self.finish(started, code, stop_reason, gone, held_notes)

    def begin(self, request: tuple[Any, ...]) -> Staged | dict[str, Any]:
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
        return Staged(
            name, key, attempt, task, workspace, output, staged_env, prepared, cache_key, stop_by
        )

    def start(self, staged: Staged) -> Started | dict[str, Any]:
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
        if self.sandboxed(task):
            # lazy: run.executors._sandbox is not loaded with this module; only _start() needs it
            from crucible.run.executors._sandbox import SandboxUnavailable

            try:
                sandbox = self.sandbox().spec(
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

        follow = Follow(follow_prefix(name, key)) if self.options.follow else None
        sink = LogSink(self.paths, name, key, attempt, header, follow)
        return Started(staged, proc, out_r, agent_out, sink, held)

    # ------------------------------------------------------------- sandbox

    def sandboxed(self, task: Task) -> bool:
        return task.sandbox or self.options.sandbox

    def sandbox(self) -> Any:
        if self._sandbox is None:
            # lazy: only _sandbox_of() needs it (start-up)
            from crucible.run.executors._sandbox import UnitSandbox

            self._sandbox = UnitSandbox(self.environ, str(self.state), self.pack_dir)
        return self._sandbox

    def ended(self, started: Started, gone: bool) -> list[str] | None:
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

    def wait(
        self,
        proc: TaskProcess,
        channel: Channel,
        out_r: int,
        sink: LogSink,
        agent_out: AgentStdout | None = None,
    ) -> tuple[int, str | None, bool]:
        """Wait for the leader to exit (crucible.run.executors._waiting)."""
        return wait_for_exit(
            proc,
            channel,
            out_r,
            sink,
            agent_out,
            slots=self.slots,
            kill_grace=self.options.kill_grace,
        )

    def finish(
        self,
        started: Started,
        code: int,
        stop_reason: str | None,
        gone: bool,
        held_notes: list[str] | None,
    ) -> dict[str, Any]:
        """After the slot: capture and the final reply (crucible.run.executors._capturing)."""
        return finish(self, started, code, stop_reason, gone, held_notes)

    # ------------------------------------------------------- a pipelined worker

    def serve(self, inbox: Inbox) -> None:
        """A local worker's life (crucible.run.executors._pipelined.serve)."""
        # this process lives from each staging to its check: it can guard the
        # consumers' links to the one stored copy (docs/spec/inputs.md 3.4)
        guard_views()
        serve(self, inbox)

    def passed(self, key: str | None, workspace: Path, output: Path) -> None:
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

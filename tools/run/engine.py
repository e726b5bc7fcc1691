"""The run loop: a ready set over the task graph, up to N task processes at once.

One scheduling thread, one ``select``: it waits on every running task's pidfd,
the staging workers' replies, the spawner's wake-up pipe, the signal wake-up fd,
and the next deadline (a timeout, a SIGKILL escalation or a retry backoff).
Staging and capture (``crucible.stage``) run in forked worker processes
(:mod:`crucible.run.workers`); task processes are started on a spawner thread
(:class:`crucible.run.procs.Spawner`), so the scheduling thread never waits for
a ``vfork``'d child to exec. Every decision and every event stays on the
scheduling thread.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import selectors
import signal
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crucible.core import atomic
from crucible.core.errors import CrucibleError
from crucible.run import verdict as verdict_rules
from crucible.run.admit import Admission
from crucible.run.environ import task_environment
from crucible.run.graph import TaskGraph, build_graph
from crucible.run.options import RunOptions
from crucible.run.procs import Spawner, SpawnJob, TaskProcess, kill_group
from crucible.run.session import SessionLog
from crucible.run.workers import Reply, WorkerPool

__all__ = ["Counts", "Dispatcher", "RunOutcome"]

PASSED, FAILED, SKIPPED, INTERRUPTED = "passed", "failed", "skipped", "interrupted"
BACKOFF_MAX = 30.0


@dataclass
class Counts:
    """What the progress display and ``run_finished`` show, in units (a task, or
    one instance of a mapped task)."""

    total: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    running: int = 0
    started_at: float = field(default_factory=time.monotonic)

    @property
    def settled(self) -> int:
        return self.passed + self.failed + self.skipped


@dataclass(frozen=True)
class RunOutcome:
    status: str
    exit_code: int
    counts: dict[str, int]
    digest: str
    duration: float


class Unit:
    """One runnable thing: a task, or one instance of a mapped task, and its attempt."""

    __slots__ = (
        "attempt",
        "key",
        "name",
        "proc",
        "prompt_env",
        "prompt_file",
        "staged_env",
        "workspace",
    )

    def __init__(self, name: str, key: str | None) -> None:
        self.name = name
        self.key = key
        self.attempt = 1
        self.staged_env: dict[str, str] | None = None
        self.workspace: Path | None = None
        self.prompt_file: str | None = None
        self.prompt_env: str | None = None
        self.proc: TaskProcess | None = None


@dataclass
class _Finished:
    """What the main thread needs to settle an attempt once capture ran."""

    unit: Unit
    code: int
    duration: float
    stop_reason: str | None
    output: Path
    #: capture's verdict, as the worker summarised it (None: nothing captured)
    record: dict[str, Any] | None = None


_WORKER = "worker"
_SPAWNER = "spawner"


class Dispatcher:
    """Runs one session of a run. Staging (before a unit starts) and capture (after
    it exits) run in a few forked worker processes (:mod:`crucible.run.workers`),
    so their fsyncs overlap with each other and with task processes; every
    decision and every event stays in this process's one thread."""

    def __init__(
        self,
        admission: Admission,
        options: RunOptions,
        log: SessionLog,
        *,
        environ: Mapping[str, str],
        on_progress: Callable[[Counts], None] | None = None,
    ) -> None:
        from crucible import stage

        self.stage = stage
        self.admission = admission
        self.plan = admission.plan
        self.options = options
        self.state = options.state
        self.layout = stage.StateLayout(options.state)
        self.log = log
        self.environ = environ
        self.on_progress = on_progress
        self.graph: TaskGraph = build_graph(self.plan)
        self.jobs = max(1, options.jobs or os.cpu_count() or 1)
        #: units staged (or being staged) ahead of a free slot
        self.stage_ahead = 2 * self.jobs
        self.status: dict[str, str] = {}
        self.remaining: dict[str, int] = {}
        #: units whose dependencies settled, waiting to be staged
        self.ready: deque[Unit] = deque()
        #: staged units waiting for a process slot
        self.prepared: deque[Unit] = deque()
        self.preparing = 0
        self.capturing = 0
        self.running: dict[int, Unit] = {}
        self.timers: list[tuple[float, int, Unit]] = []
        self._timer_seq = 0
        #: mapped task -> its instance keys in item order, and how many are unsettled
        self.instances: dict[str, list[str]] = {}
        self.instances_left: dict[str, int] = {}
        self.host_env: dict[str, dict[str, str]] = {}
        self.counts = Counts(total=len(self.graph.tasks))
        self.stop_signal: int | None = None
        self._escalate = False
        self._made_dirs: set[Path] = set()
        self._tokens: dict[int, Unit | _Finished] = {}
        self._next_token = 0
        # Fork the workers now, before any thread exists in this process (the
        # session log's writer starts at its first commit). Each fsync waits a
        # few ms on a busy disk; two workers per slot keep slots fed.
        self.workers = WorkerPool(min(16, 2 * self.jobs + 1), self._serve)
        self.selector = selectors.DefaultSelector()
        #: started in run(), after the workers are forked
        self.spawner: Spawner | None = None

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        self.workers.close()

    # ----------------------------------------------------------------- helpers

    def _rel(self, path: Path) -> str:
        return str(path.relative_to(self.state))

    def _unit_path(self, top: str, name: str, key: str | None, suffix: str) -> Path:
        if key is None:
            path = self.state / top / f"{name}{suffix}"
        else:
            path = self.state / top / name / f"{self.stage.escape_key(key)}{suffix}"
        parent = path.parent
        if parent not in self._made_dirs:
            parent.mkdir(parents=True, exist_ok=True)
            self._made_dirs.add(parent)
        return path

    def _output_path(self, name: str, key: str | None, attempt: int) -> Path:
        return self._unit_path(f"output/{attempt}", name, key, ".json")

    def _ids(self, unit: Unit) -> dict[str, Any]:
        return {"task": unit.name, "key": unit.key}

    # ------------------------------------------------------------ entry point

    def run(self) -> RunOutcome:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.selector.register(wake_r, selectors.EVENT_READ, None)
        for fd in self.workers.reply_fds:
            self.selector.register(fd, selectors.EVENT_READ, _WORKER)
        self.spawner = Spawner()
        self.selector.register(self.spawner.wake_fd, selectors.EVENT_READ, _SPAWNER)
        previous = self._install_signals(wake_w)
        started = time.monotonic()
        try:
            self._resume_settled()
            for name in self.graph.order:
                if name not in self.status and self.remaining[name] == 0:
                    self._on_ready(name)
            self._loop(wake_r)
        except BaseException:
            self._kill_all(signal.SIGKILL)
            for job in self.spawner.close():
                if job.proc is not None:
                    kill_group(job.proc.pid, signal.SIGKILL)
                    job.proc.reap()
            raise
        finally:
            self.spawner.close()
            self._restore_signals(previous)
            self.selector.close()
            os.close(wake_r)
            os.close(wake_w)
            self.workers.close()
        duration = time.monotonic() - started
        counts = {
            "tasks": len(self.graph.tasks),
            "units": self.counts.total,
            PASSED: self.counts.passed,
            FAILED: self.counts.failed,
            SKIPPED: self.counts.skipped,
        }
        if self.stop_signal is not None:
            status = INTERRUPTED
            code = 128 + self.stop_signal
        elif len(self.status) == len(self.graph.tasks) and all(
            s == PASSED for s in self.status.values()
        ):
            status, code = PASSED, 0
        else:
            status, code = FAILED, 1
        import resource

        self.log.emit(
            "run_finished",
            status=status,
            counts=counts,
            duration=round(duration, 6),
            max_rss_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            worker_max_rss_kib=self.workers.peak_rss_kib,
        )
        return RunOutcome(status, code, counts, self.admission.digest, duration)

    def _install_signals(self, wake_w: int) -> dict[int, Any]:
        previous: dict[int, Any] = {}

        def handler(signum: int, _frame: object) -> None:
            if self.stop_signal is None:
                self.stop_signal = signum
            else:  # a second signal: stop waiting for the grace period
                self._escalate = True

        try:
            previous[-1] = signal.set_wakeup_fd(wake_w)
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous[signum] = signal.signal(signum, handler)
        except ValueError:  # not the main thread: the caller handles signals
            previous.clear()
        return previous

    def _restore_signals(self, previous: dict[int, Any]) -> None:
        for signum, old in previous.items():
            if signum == -1:
                signal.set_wakeup_fd(old)
            else:
                signal.signal(signum, old)

    # ------------------------------------------------------------------- loop

    def _loop(self, wake_r: int) -> None:
        stopping = False
        while True:
            if self.stop_signal is not None and not stopping:
                stopping = True
                self._begin_stop()
            if not stopping:
                self._fill()
            self.log.commit()
            if self.on_progress is not None:
                self.counts.running = len(self.running)
                self.on_progress(self.counts)
            busy = self.running or self.preparing or self.capturing or self._spawning
            if not busy and (stopping or not (self.ready or self.prepared or self.timers)):
                return
            for key, _ in self.selector.select(self._next_wake()):
                if key.data is None:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(wake_r, 512):
                            pass
                    if stopping and self._escalate:
                        self._kill_all(signal.SIGKILL)
                elif key.data is _WORKER:
                    for reply in self.workers.read(key.fd):
                        self._on_reply(reply)
                elif key.data is _SPAWNER:
                    assert self.spawner is not None
                    for job in self.spawner.finished():
                        self._started(job)
                else:
                    self._exited(key.data)
            self._check_deadlines()
            if not stopping:
                self._release_timers()

    def _next_wake(self) -> float | None:
        now = time.monotonic()
        wake: float | None = None
        for unit in self.running.values():
            proc = unit.proc
            assert proc is not None
            for t in (proc.kill_at, None if proc.stop_reason else proc.deadline):
                if t is not None and (wake is None or t < wake):
                    wake = t
        if self.timers and self.stop_signal is None:
            t = self.timers[0][0]
            if wake is None or t < wake:
                wake = t
        if wake is None:
            return None
        return max(0.0, wake - now)

    def _fill(self) -> None:
        while self.prepared and len(self.running) + self._spawning < self.jobs:
            self._spawn(self.prepared.popleft())
        # Stage ahead of the slots, so staging (mostly fsync latency) is off the
        # critical path.
        while self.ready and self.preparing + len(self.prepared) < self.stage_ahead:
            unit = self.ready.popleft()
            self.preparing += 1
            self._submit(
                unit, ("prepare", unit.name, unit.key, unit.attempt, unit.staged_env is None)
            )

    def _submit(self, item: Unit | _Finished, request: tuple[Any, ...]) -> None:
        self._next_token += 1
        self._tokens[self._next_token] = item
        self.workers.submit(self._next_token, request)

    def _on_reply(self, reply: Reply) -> None:
        item = self._tokens.pop(reply.token)
        if reply.outcome == "bug":
            raise RuntimeError(f"a staging worker failed:\n{reply.payload}")
        if isinstance(item, Unit):
            self.preparing -= 1
            if reply.outcome == "error":
                self._fail_unit(item, f"cannot stage inputs: {reply.payload}")
                return
            payload = reply.payload
            if payload["staged_env"] is not None:
                item.staged_env = payload["staged_env"]
            item.workspace = self.layout.work_dir(item.name, item.key)
            item.prompt_file = payload["prompt_file"]
            item.prompt_env = payload["prompt_env"]
            if self.stop_signal is None:
                self.prepared.append(item)
            # when stopping, a staged unit is not started: it stays unsettled
            return
        self.capturing -= 1
        if reply.outcome == "error":
            self._fail_unit(item.unit, f"cannot capture the result: {reply.payload}")
            return
        item.record = reply.payload
        self._settle_attempt(item)

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for unit in list(self.running.values()):
            proc = unit.proc
            assert proc is not None
            if proc.stop_reason is None and proc.deadline is not None and now >= proc.deadline:
                proc.stop_reason = "timeout"
                kill_group(proc.pid, signal.SIGTERM)
                proc.kill_at = now + self.options.kill_grace
            elif proc.kill_at is not None and now >= proc.kill_at:
                kill_group(proc.pid, signal.SIGKILL)
                proc.kill_at = None

    def _release_timers(self) -> None:
        now = time.monotonic()
        while self.timers and self.timers[0][0] <= now:
            _, _, unit = heapq.heappop(self.timers)
            self.ready.append(unit)

    def _begin_stop(self) -> None:
        """SIGINT/SIGTERM: start nothing new, terminate every running group."""
        self.ready.clear()
        self.prepared.clear()
        self.timers.clear()
        now = time.monotonic()
        for unit in self.running.values():
            proc = unit.proc
            assert proc is not None
            proc.stop_reason = "interrupt"
            kill_group(proc.pid, signal.SIGTERM)
            proc.kill_at = now + self.options.kill_grace

    def _kill_all(self, sig: int) -> None:
        for unit in list(self.running.values()):
            if unit.proc is not None:
                kill_group(unit.proc.pid, sig)

    # ---------------------------------------------------------------- resume

    def _resume_settled(self) -> None:
        """Mark tasks settled by an earlier session; count what is left to wait for."""
        if (
            self.layout.result_path(self.graph.order[0]).parent.is_dir()
            if self.graph.order
            else False
        ):
            for name in self.graph.order:
                record = self.stage.load_result(self.state, name)
                if record is not None:
                    status = record.get("status", FAILED)
                    self.status[name] = status
                    self._count_settled_record(record, status)
        for name, deps in self.graph.waits_for.items():
            self.remaining[name] = sum(1 for d in deps if d not in self.status)

    def _count_settled_record(self, record: dict[str, Any], status: str) -> None:
        """Count a task settled in an earlier session as a run counts it: a mapped
        task with instances is one unit per instance, by their statuses."""
        keys = record.get("keys")
        counts = record.get("counts")
        if isinstance(keys, list) and keys and isinstance(counts, dict):
            self.counts.total += len(keys) - 1
            self.counts.passed += int(counts.get(PASSED, 0))
            self.counts.skipped += int(counts.get(SKIPPED, 0))
            self.counts.failed += (
                len(keys) - int(counts.get(PASSED, 0)) - int(counts.get(SKIPPED, 0))
            )
            return
        self._count_settled(status)

    def _count_settled(self, status: str) -> None:
        if status == PASSED:
            self.counts.passed += 1
        elif status == SKIPPED:
            self.counts.skipped += 1
        else:
            self.counts.failed += 1

    # ------------------------------------------------------------- readiness

    def _on_ready(self, name: str) -> None:
        """Every task ``name`` waits for has settled: skip it, expand it, or queue it."""
        task = self.graph.tasks[name]
        if task.get("join", "all") == "all":
            for dep in task.get("needs", ()):
                dep_status = self.status.get(dep)
                if dep_status != PASSED:
                    note = f"skipped: needs {dep!r}, which {_did(dep_status)}"
                    self._record_task(name, SKIPPED, note)
                    self.log.emit("task_finished", task=name, status=SKIPPED, note=note)
                    self._count_settled(SKIPPED)
                    self._settle(name, SKIPPED)
                    return
        if "map" in task:
            self._expand(name)
            return
        self.ready.append(Unit(name, None))

    def _record_task(self, name: str, status: str, note: str) -> None:
        """A task settled without running: skipped, or its map source unreadable
        (a mapped task gets an aggregate record with no instances)."""
        self.stage.record_settled(self.plan, self.state, name, status=status, note=note)

    def _expand(self, name: str) -> None:
        try:
            items = self.stage.map_items(self.plan, self.state, name)
        except CrucibleError as exc:
            note = f"cannot read the map source {self.graph.tasks[name]['map']}: {exc}"
            self._record_task(name, FAILED, note)
            self.log.emit("task_finished", task=name, status=FAILED, note=note)
            self._count_settled(FAILED)
            self._settle(name, FAILED)
            return
        keys = [key for key, _ in items]
        del items
        if not keys:
            self._fold(name, keys)
            return
        self.counts.total += len(keys) - 1
        self.instances[name] = keys
        # Instances settled in an earlier session keep their records (resume).
        instance_dir = self.layout.result_path(name, keys[0]).parent
        try:
            recorded = set(os.listdir(instance_dir))
        except FileNotFoundError:
            recorded = set()
        left = 0
        for key in keys:
            if recorded and self.layout.result_path(name, key).name in recorded:
                record = self.stage.load_result(self.state, name, key)
                if record is not None:
                    self._count_settled(record.get("status", FAILED))
                    continue
            left += 1
            self.ready.append(Unit(name, key))
        self.instances_left[name] = left
        if left == 0:
            self._fold(name, keys)

    def _fold(self, name: str, keys: list[str]) -> None:
        record = self.stage.settle_fold(self.plan, self.state, name, keys)
        status = record.get("status", FAILED)
        self.log.emit(
            "task_finished", task=name, status=status, note=record.get("note"), instances=len(keys)
        )
        if not keys:
            self._count_settled(status)
        self._settle(name, status)

    def _settle(self, name: str, status: str) -> None:
        """``name`` settled (counting is the caller's): wake its consumers."""
        self.status[name] = status
        for consumer in self.graph.consumers[name]:
            self.remaining[consumer] -= 1
            if self.remaining[consumer] == 0 and consumer not in self.status:
                self._on_ready(consumer)

    # ---------------------------------------------------- a unit (worker side)

    def _serve(self, request: tuple[Any, ...]) -> Any:
        """In a worker process: one staging or capture request."""
        if request[0] == "prepare":
            return self._prepare(*request[1:])
        if request[0] == "capture":
            return self._capture(*request[1:])
        raise ValueError(f"unknown request {request[0]!r}")

    def _prepare(self, name: str, key: str | None, attempt: int, stage_now: bool) -> dict[str, Any]:
        """Worker: workspace, staged inputs (first attempt), fresh output path, prompt."""
        task = self.graph.tasks[name]
        stage = self.stage
        workspace = self.layout.work_dir(name, key)
        staged_env: dict[str, str] | None = None
        if stage_now:
            workspace.mkdir(parents=True, exist_ok=True)
            staged_env = dict(
                stage.stage_inputs(self.plan, self.state, name, workspace, key=key).env
            )
        output = self._output_path(name, key, attempt)
        with contextlib.suppress(FileNotFoundError):
            output.unlink()
        # Create the log file here: creating an inode costs ~0.3 ms on a busy
        # ext4 (it scans for recently deleted inodes), too much for the
        # scheduling thread, which then only opens it.
        log_path = self._unit_path("logs", name, key, ".log")
        os.close(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644))
        prompt_file: str | None = None
        prompt_env: str | None = None
        if task.get("kind") == "agent":
            prompt = self._prompt(task, workspace, key)
            path = self._unit_path("prompts", name, key, ".txt")
            data = prompt.encode("utf-8")
            # Rewritten on every attempt: atomic, not durable. A short "@tmp-"
            # temp name, as the path may end in a 250-byte escaped key.
            atomic.write_bytes(path, data, tmp_prefix="@tmp-", durable=False)
            prompt_file = str(path)
            # An environment value cannot hold NUL (execve would refuse the
            # whole launch); such a prompt travels only in the file.
            if len(data) <= stage.PROMPT_ENV_MAX and "\x00" not in prompt:
                prompt_env = prompt
        return {"staged_env": staged_env, "prompt_file": prompt_file, "prompt_env": prompt_env}

    def _prompt(self, task: dict[str, Any], workspace: Path, key: str | None) -> str:
        render = getattr(self.stage, "render_prompt", None)
        if render is not None:
            return str(render(self.plan, self.state, task["name"], workspace, key=key))
        # stage without render_prompt (older branch): the prompt text and where
        # the inputs are; nothing is inlined.
        return f"{task.get('prompt', '')}\n\nYour inputs are files under {workspace / 'inputs'}.\n"

    def _capture(
        self, name: str, key: str | None, attempt: int, output: str, code: int
    ) -> dict[str, Any]:
        """Worker: capture one attempt's result; reply with what the scheduler needs
        (never the output itself, which may be large)."""
        record = self.stage.capture(
            self.plan,
            self.state,
            name,
            self.layout.work_dir(name, key),
            output_file=Path(output),
            exit_code=code,
            key=key,
            attempt=attempt,
            emit_cap=self.admission.emit_cap,
        )
        if record.get("status") == PASSED and self.graph.tasks[name].get("kind") == "evaluate":
            record = self._apply_verdict(name, key, record, Path(output))
        summary = {k: record.get(k) for k in ("status", "note", "retryable", "files_captured")}
        if record.get("files_captured"):
            summary["files_bytes"] = sum(int(f.get("size", 0)) for f in record.get("files", []))
        return summary

    def _apply_verdict(
        self, name: str, key: str | None, record: dict[str, Any], output: Path
    ) -> dict[str, Any]:
        """An evaluate task that passed capture passes only with ``verdict: "pass"``.
        Otherwise its captured record (output kept, for settled consumers) is
        amended to a measured failure."""
        value, problem = verdict_rules.check(output)
        if problem is None:
            return record
        return self.stage.amend_result(
            self.plan,
            self.state,
            name,
            key=key,
            status=FAILED,
            note=problem,
            retryable=False,
            extra={"verdict": value},
        )

    # ------------------------------------------------------ a unit (main side)

    def _environment(self, unit: Unit, task: dict[str, Any], output: Path) -> dict[str, str]:
        base = self.host_env.get(unit.name)
        if base is None:
            base = task_environment(self.plan, task, self.environ)
            self.host_env[unit.name] = base
        env = dict(base)
        env.update(unit.staged_env or {})
        env["CRUCIBLE_TASK"] = unit.name
        if unit.key is not None:
            env["CRUCIBLE_KEY"] = unit.key
        env["CRUCIBLE_ATTEMPT"] = str(unit.attempt)
        env["CRUCIBLE_WORKSPACE"] = str(unit.workspace)
        env["CRUCIBLE_OUTPUT"] = str(output)
        if unit.prompt_file is not None:
            env["CRUCIBLE_PROMPT_FILE"] = unit.prompt_file
        if unit.prompt_env is not None:
            env["CRUCIBLE_PROMPT"] = unit.prompt_env
        return env

    def _spawn(self, unit: Unit) -> None:
        assert unit.workspace is not None
        task = self.graph.tasks[unit.name]
        if task.get("kind") == "agent":
            argv = ["sh", "-c", self.options.agent_cmd or "false"]
        else:
            run = task["run"]
            argv = ["sh", "-c", run] if isinstance(run, str) else list(run)
        env = self._environment(unit, task, self._output_path(unit.name, unit.key, unit.attempt))
        unit.prompt_env = None  # in env now; keep queued units small
        timeout = task.get("timeout")
        assert self.spawner is not None
        self.spawner.submit(
            SpawnJob(
                owner=unit,
                argv=argv,
                env=env,
                cwd=unit.workspace,
                log_path=self._unit_path("logs", unit.name, unit.key, ".log"),
                header=b"== crucible: attempt %d\n" % unit.attempt,
                timeout=None if timeout is None else float(timeout),
            )
        )

    @property
    def _spawning(self) -> int:
        return 0 if self.spawner is None else self.spawner.in_flight

    def _started(self, job: SpawnJob) -> None:
        """The spawner thread started (or failed to start) a unit's process."""
        unit: Unit = job.owner
        if job.error is not None:
            if not isinstance(job.error, OSError):
                raise job.error
            strerror = job.error.strerror or job.error
            self._fail_unit(unit, f"cannot start {job.argv[0]!r}: {strerror}")
            return
        proc = job.proc
        assert proc is not None and unit.workspace is not None
        unit.proc = proc
        self.running[proc.pidfd] = unit
        self.selector.register(proc.pidfd, selectors.EVENT_READ, unit)
        self.log.emit(
            "task_started",
            **self._ids(unit),
            attempt=unit.attempt,
            pid=proc.pid,
            workspace=self._rel(unit.workspace),
        )
        if self.stop_signal is not None:
            # It was started before the signal arrived and is running now:
            # terminate it like every other running group.
            proc.stop_reason = "interrupt"
            kill_group(proc.pid, signal.SIGTERM)
            proc.kill_at = time.monotonic() + self.options.kill_grace

    def _exited(self, unit: Unit) -> None:
        proc = unit.proc
        assert proc is not None
        self.selector.unregister(proc.pidfd)
        del self.running[proc.pidfd]
        code = proc.reap()
        unit.proc = None
        finished = _Finished(
            unit=unit,
            code=code,
            duration=time.monotonic() - proc.started,
            stop_reason=proc.stop_reason,
            output=self._output_path(unit.name, unit.key, unit.attempt),
        )
        if proc.stop_reason == "interrupt":
            # Nothing is recorded in results/: the unit stays unsettled and a
            # resume runs it again.
            signame = signal.Signals(self.stop_signal or signal.SIGTERM).name
            self.log.emit(
                "task_finished",
                **self._ids(unit),
                attempt=unit.attempt,
                status=INTERRUPTED,
                note=f"terminated: the dispatcher received {signame}",
                exit_code=code,
                duration=round(finished.duration, 6),
                **self._sizes(finished.output, None),
            )
            return
        if proc.stop_reason == "timeout":  # nothing to capture
            self._settle_attempt(finished)
            return
        self.capturing += 1
        self._submit(
            finished, ("capture", unit.name, unit.key, unit.attempt, str(finished.output), code)
        )

    def _settle_attempt(self, finished: _Finished) -> None:
        unit = finished.unit
        task = self.graph.tasks[unit.name]
        record = finished.record
        note: str | None
        if finished.stop_reason == "timeout":
            status, note, retryable = FAILED, f"timed out after {task.get('timeout')} s", True
        else:
            assert record is not None
            status = record.get("status", FAILED)
            note = record.get("note")
            retryable = bool(record.get("retryable", status != PASSED))
        sizes = self._sizes(finished.output, record)
        attempts = int(task.get("retries", 0)) + 1
        if status != PASSED and retryable and unit.attempt < attempts and self.stop_signal is None:
            # Remove this attempt's record so an interruption during the backoff
            # leaves the unit unsettled (a resume runs it again).
            with contextlib.suppress(FileNotFoundError):
                self.layout.result_path(unit.name, unit.key).unlink()
            self.log.emit(
                "task_finished",
                **self._ids(unit),
                attempt=unit.attempt,
                status=status,
                note=note,
                exit_code=finished.code,
                duration=round(finished.duration, 6),
                retry=True,
                **sizes,
            )
            delay = min(BACKOFF_MAX, self.options.backoff * 2 ** (unit.attempt - 1))
            unit.attempt += 1
            self._timer_seq += 1
            heapq.heappush(self.timers, (time.monotonic() + delay, self._timer_seq, unit))
            return
        if record is None:
            self.stage.record_settled(
                self.plan, self.state, unit.name, status=status, note=note or "", key=unit.key
            )
        self._settle_unit(
            unit, status, note, exit_code=finished.code, duration=finished.duration, sizes=sizes
        )

    def _fail_unit(self, unit: Unit, note: str) -> None:
        """A unit that could not be staged, started or captured: a measured failure,
        never retried."""
        self.stage.record_settled(
            self.plan, self.state, unit.name, status=FAILED, note=note, key=unit.key
        )
        self._settle_unit(unit, FAILED, note, exit_code=None)

    @staticmethod
    def _sizes(output: Path, record: dict[str, Any] | None) -> dict[str, int]:
        """``output_bytes``: the result file as written; ``files_bytes``: what capture
        took from emits_files."""
        sizes: dict[str, int] = {}
        with contextlib.suppress(OSError):
            sizes["output_bytes"] = output.stat().st_size
        if record is not None and record.get("files_bytes") is not None:
            sizes["files_bytes"] = int(record["files_bytes"])
        return sizes

    def _settle_unit(
        self,
        unit: Unit,
        status: str,
        note: str | None,
        *,
        exit_code: int | None,
        duration: float | None = None,
        sizes: dict[str, int] | None = None,
    ) -> None:
        self.log.emit(
            "task_finished",
            **self._ids(unit),
            attempt=unit.attempt,
            status=status,
            note=note,
            exit_code=exit_code,
            duration=None if duration is None else round(duration, 6),
            **(sizes or {}),
        )
        self._count_settled(status)
        if unit.key is None:
            self._settle(unit.name, status)
            return
        self.instances_left[unit.name] -= 1
        if self.instances_left[unit.name] == 0:
            self._fold(unit.name, self.instances[unit.name])


def _did(status: str | None) -> str:
    return {FAILED: "failed", SKIPPED: "was skipped", None: "did not run"}.get(
        status, f"settled as {status}"
    )

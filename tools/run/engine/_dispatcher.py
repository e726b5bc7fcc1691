"""The run loop: a ready set over the task graph, up to N task processes at once.

One scheduling thread, one ``select``: it waits on the workers' replies, the
signal wake-up fd, and the next retry backoff. A unit's attempt (staging, the
task process with its timeout, capture) runs in a forked worker process
(:mod:`crucible.run.executors._unit`, :mod:`crucible.run.executors._workers`), which reports when the
process started and when the attempt is done; slot tokens shared by the
workers keep at most ``-j`` task processes running. Every decision and every
event stays on the scheduling thread, which never waits for a process start,
an exit or an fsync of staging or capture.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import selectors
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crucible.compile._durations import MAX_WAIT_S
from crucible.core.errors import CrucibleError
from crucible.run._options import RunOptions
from crucible.run.engine import _control as control
from crucible.run.engine._failures import compose_note, exit_text, failure_record, with_reason
from crucible.run.engine._graph import TaskGraph, build_graph
from crucible.run.engine._matrix import Fanouts
from crucible.run.engine._parallelism import ParallelismGate
from crucible.run.engine._selection import NOT_SELECTED, Selection
from crucible.run.executors import _seam as executor
from crucible.run.executors._create import create as create_executor
from crucible.run.executors._procs import close_inherited, kill_group
from crucible.run.executors._seam import Executor
from crucible.run.executors._unit import Slots, UnitRunner
from crucible.run.executors._usage import USAGE_FIELDS
from crucible.run.executors._workers import Channel, Reply
from crucible.run.session._admit import Admission
from crucible.run.session._log import SessionLog

if TYPE_CHECKING:  # imported at run time only for a plan with a loop
    from crucible.run.loop._engine import LoopRun

__all__ = ["Counts", "Dispatcher", "RunOutcome"]

PASSED, FAILED, SKIPPED, INTERRUPTED = "passed", "failed", "skipped", "interrupted"
BACKOFF_MAX = 30.0
#: the longest a turn's events wait for the next hand-over to the session log
#: when nothing waits for them to be durable (docs/spec/run.md, "Session log"):
#: one hand-over a turn woke the log's writer thread ~4 times a unit
COMMIT_HOLD = 0.02


@dataclass
class Counts:
    """What the progress display and ``run_finished`` show, in units (a task, or
    one instance of a mapped task)."""

    total: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    #: failed units whose failure the run ignores (on_failure / allow_exit)
    tolerated: int = 0
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
    #: the first failed units: (``task`` or ``task[key]``, log path relative to
    #: STATE or None), at most FAILURES_SHOWN
    failures: tuple[tuple[str, str | None], ...] = ()
    #: a session that ran nothing says why (``--resume`` with nothing left)
    message: str | None = None
    #: --dry-run: one entry per unit (task, key?, action, reason)
    plan_lines: tuple[dict[str, Any], ...] = ()


#: failed units the run's last line names
FAILURES_SHOWN = 3


class Unit:
    """One runnable thing: a task, or one instance of a mapped task, and its attempt."""

    __slots__ = ("attempt", "first_start", "key", "last_env", "name", "pid", "staged_env")

    def __init__(self, name: str, key: str | None) -> None:
        self.name = name
        self.key = key
        self.attempt = 1
        #: what staging returned on the first attempt (retries keep it)
        self.staged_env: dict[str, str] | None = None
        #: the task process of the current attempt, once started
        self.pid: int | None = None
        #: when the first attempt started (monotonic), for a task's ``deadline``
        self.first_start: float | None = None
        #: CRUCIBLE_LAST_EXIT / CRUCIBLE_LAST_REASON of the previous attempt
        self.last_env: dict[str, str] | None = None


@dataclass
class _Finished:
    """What the main thread needs to settle an attempt once capture ran."""

    unit: Unit
    code: int
    duration: float
    stop_reason: str | None
    #: event fields the worker measured: output_bytes, files_bytes, log_error
    fields: dict[str, Any]
    #: capture's verdict, as the worker summarised it (None: nothing captured)
    record: dict[str, Any] | None = None
    #: the unit's log (relative to STATE) and output tail, for a failure's note
    log: str | None = None
    tail: str = ""


_WORKER = "worker"


class Dispatcher:
    """Runs one session of a run. Each attempt of a unit runs in one of a few
    forked worker processes (:mod:`crucible.run.executors._unit`), so staging, process
    starts, fsyncs and capture overlap with each other and with task processes;
    every decision and every event stays in this process's one thread."""

    def __init__(
        self,
        admission: Admission,
        options: RunOptions,
        log: SessionLog,
        *,
        environ: Mapping[str, str],
        on_progress: Callable[[Counts], None] | None = None,
        selection: Selection | None = None,
        on_warning: Callable[[str], None] | None = None,
    ) -> None:
        from crucible import stage

        #: warnings the workers send (the task cache's, crucible.run.cache._unit)
        self.warn = on_warning or (lambda _w: None)

        self.stage = stage
        self.admission = admission
        self.plan = admission.plan
        self.options = options
        self.state = options.state
        self.layout = stage.StateLayout(options.state)
        self.log = log
        self.on_progress = on_progress
        self.graph: TaskGraph = build_graph(self.plan)
        self.jobs = admission.jobs
        self.selection = selection
        #: tasks this session may run (None: all)
        self.selected = None if selection is None else selection.selected
        #: the first failed units, for the run's last line
        self.failures: list[tuple[str, str | None]] = []
        #: --fail-fast: the unit whose failure stopped the run
        self.fail_fast_by: str | None = None
        self.status: dict[str, str] = {}
        self.remaining: dict[str, int] = {}
        #: units whose dependencies settled, waiting for a worker
        self.ready: deque[Unit] = deque()
        #: units whose task process is running
        self.running = 0
        self.timers: list[tuple[float, int, Unit]] = []
        self._timer_seq = 0
        #: mapped task -> its instance keys in item order, and how many are unsettled
        self.instances: dict[str, list[str]] = {}
        self.instances_left: dict[str, int] = {}
        self.counts = Counts(total=len(self.graph.tasks))
        self.stop_signal: int | None = None
        self._escalate = False
        # Control flow (run/engine/_control.py): conditions, and the tasks whose failure
        # was tolerated (the run's exit code ignores them). A signal abandons a
        # condition being evaluated, so the dispatcher always stops.
        self.control = control.Control(
            self.plan, options.state, stage, cancelled=lambda: self.stop_signal is not None
        )
        self.tolerated: set[str] = set()
        self._tokens: dict[int, Unit] = {}
        self._next_token = 0
        # -- record durability (docs/spec/run.md, "Session log"): what a settle
        # would start waits until the batch holding its record is durable
        #: callbacks for the next commit's batch, and (batch, callbacks) waiting
        self._deferred: list[Callable[[], None]] = []
        self._waiting: deque[tuple[int, list[Callable[[], None]]]] = deque()
        self._gating = False
        self._wake_lock = threading.Lock()
        self._wake_fd = -1
        # -- end record durability
        # No task may inherit a descriptor of ours (posix_spawn closes none).
        close_inherited()
        stage.prepare_plan(self.plan)
        # Listed fan-outs (IR v3): static ones expand now, before plan_admitted.
        self.fanouts = Fanouts(self.plan, admission.params, options.state)
        self.gate: ParallelismGate[Unit] = ParallelismGate(self.graph.tasks)
        self.slots = Slots(self.jobs)
        self.runner = UnitRunner(
            plan=self.plan,
            tasks=self.graph.tasks,
            options=options,
            emit_cap=admission.emit_cap,
            environ=environ,
            slots=self.slots,
            pack_dir=admission.pack_dir,
        )
        # --cache (crucible.run.cache._hits): a ready unit that hits is restored and
        # settled on this thread, with no worker, slot or staging
        self.hits: Any = None
        if options.cache is not None:
            from crucible.run.cache._hits import CacheHits

            self.hits = CacheHits(
                options.cache, plan=self.plan, tasks=self.graph.tasks, state=options.state,
                environ=environ, agent_cmd=options.agent_cmd, emit_cap=admission.emit_cap,
                warn=self.warn, pack_dir=admission.pack_dir,
            )  # fmt: skip
            self.ready = self.hits.ready_queue()  # each unit looked up once
            # the cache records workers encoded are appended once their batch is durable
            log.on_batch_durable = self.hits.record_facts
            log.on_close = self.hits.close_recorder
        # The executor: a local one forks its workers at the first unit that needs
        # one (crucible.run.executors._workers), in the loop's first turn, before the session
        # log's writer thread starts at that turn's commit. A worker holds one
        # unit from staging to capture; the extra workers stage the next units
        # while the slots are busy.
        try:
            self.workers: Executor = create_executor(
                options, jobs=self.jobs, slots=self.slots, runner=self.runner, serve=self._serve,
                lock=admission.lock,
                warn=self.warn,
            )  # fmt: skip
        except BaseException:
            self.slots.close()
            raise
        self.selector = selectors.DefaultSelector()
        # -- scored loop (docs/spec/loop.md): revisions of the body, run/loop/_engine.py
        # (imported only for a plan with a loop: most plans have none)
        self.loop: LoopRun | None = None
        if self.plan.get("loop") is not None:
            from crucible.run.loop import _engine as loop_engine

            self.loop = loop_engine.attach(self)
        # -- end scored loop
        # A unit whose settle wakes nothing may be answered late, with the next
        # reply of its worker (crucible.run.executors._unit.UnitRunner.serve).
        self.runner.quiet = frozenset(
            name
            for name in self.graph.tasks
            if not self.graph.consumers[name]
            and (self.loop is None or not (name in self.loop.body or name in self.loop.phases.before))
        )

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        self.workers.close()
        self.slots.close()

    # ----------------------------------------------------------------- helpers

    def _rel(self, path: Path) -> str:
        return str(path.relative_to(self.state))

    def _ids(self, unit: Unit) -> dict[str, Any]:
        return {"task": unit.name, "key": unit.key}

    def _attempt_finished(
        self,
        unit: Unit,
        status: str,
        note: str | None,
        exit_code: int | None,
        duration: float | None,
        fields: dict[str, Any] | None,
    ) -> None:
        """The ``task_finished`` of an attempt that ran (settled, interrupted or
        retried), its members in run.md's order; ``fields`` last."""
        self.log.emit(
            "task_finished",
            task=unit.name,
            key=unit.key,
            attempt=unit.attempt,
            status=status,
            note=note,
            exit_code=exit_code,
            duration=None if duration is None else round(duration, 6),
            **(fields or {}),
        )

    # ------------------------------------------------------------ entry point

    def run(self) -> RunOutcome:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.selector.register(wake_r, selectors.EVENT_READ, None)
        # -- lazy workers (crucible.run.executors._workers): a local pool forks at its first
        # unit; its reply fds are watched as they appear
        def watch(fd: int) -> None:
            self.selector.register(fd, selectors.EVENT_READ, _WORKER)

        if hasattr(self.workers, "watch"):
            self.workers.watch(watch)
        else:
            for fd in self.workers.reply_fds:
                watch(fd)
        # -- end lazy workers
        previous = self._install_signals(wake_w)
        started = time.monotonic()
        lost: executor.ExecutorLost | None = None
        self._wake_fd = wake_w
        self.log.on_durable = self._durable_wake
        try:
            self._resume_settled()
            self._not_selected()
            for name in self.graph.order:
                if name not in self.status and self.remaining[name] == 0:
                    self._on_ready(name)
            if self.loop is not None:  # scored loop: its before tasks may all be settled
                self.loop.maybe_start()
            self._loop(wake_r)
            if self.loop is not None:
                self.loop.at_end()
        except executor.ExecutorLost as exc:  # recorded as a failed run, then raised
            lost = exc
            self.workers.stop()
            self.workers.kill()
            self._kill_orphaned_groups()
        except BaseException:
            # The workers kill their tasks' groups; a task whose worker died
            # (the likely cause of getting here) has nobody else to do it.
            self.workers.stop()
            self.workers.kill()
            self._kill_orphaned_groups()
            raise
        finally:
            self._restore_signals(previous)
            with self._wake_lock:  # the log's writer thread may still call it
                self.log.on_durable = None
                self._wake_fd = -1
            self.selector.close()
            os.close(wake_r)
            os.close(wake_w)
            self.workers.close()
            self.slots.close()
            if self.hits is not None:
                self.hits.close()
        duration = time.monotonic() - started
        counts = {
            "tasks": len(self.graph.tasks),
            "units": self.counts.total,
            PASSED: self.counts.passed,
            FAILED: self.counts.failed,
            SKIPPED: self.counts.skipped,
        }
        if self.counts.tolerated:
            counts["tolerated"] = self.counts.tolerated
        if lost is not None:
            status, code = FAILED, lost.exit_code
        elif self.stop_signal is not None:
            status = INTERRUPTED
            code = 128 + self.stop_signal
        elif self.loop is not None and self.loop.fails_run:  # scored loop: body_failed
            status, code = FAILED, 1
        elif all(self.status.get(n) == PASSED for n in self._expected()):
            status, code = PASSED, 0
        elif self.plan["version"] >= 3 and all(
            n in self.status and (self.status[n] != FAILED or n in self.tolerated)
            for n in self._expected()
        ):
            # IR v3: skips (a false condition, a tolerated producer) and tolerated
            # failures leave the run passed; any other skip follows a failure.
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
        if lost is not None:
            raise lost  # after run_finished: the runner logs its shutdown (exit 3)
        return RunOutcome(
            status, code, counts, self.admission.digest, duration, tuple(self.failures)
        )

    def _expected(self) -> list[str]:
        """The tasks that must pass for the run to pass: the selected ones."""
        if self.selected is None:
            return list(self.graph.order)
        return [n for n in self.graph.order if n in self.selected]

    def _not_selected(self) -> None:
        """--target: every unsettled task outside the selection is recorded as not
        selected (in the log only: no record, so a later resume runs it)."""
        if self.selected is None:
            return
        for name in self.graph.order:
            if name not in self.selected and name not in self.status:
                self.log.emit(
                    "task_finished",
                    task=name,
                    status=NOT_SELECTED,
                    note="not selected: not a --target or an ancestor of one",
                )

    def _kill_orphaned_groups(self) -> None:
        """SIGKILL the groups of tasks still running, when their pids are this
        host's: a remote executor's pids name other hosts' processes (its own
        ``kill`` reaches those), and killing that number here would hit
        whatever local process has it."""
        if not getattr(self.workers, "pids_are_local", True):
            return
        for unit in self._tokens.values():
            if unit.pid is not None:
                kill_group(unit.pid, signal.SIGKILL)

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
        self._gating = True
        try:
            self._turns(wake_r)
        finally:
            self._gating = False

    def _turns(self, wake_r: int) -> None:
        stopping = False
        #: when the oldest turn whose events were not handed over yet ended
        held_since: float | None = None
        while True:
            if (self.stop_signal is not None or self.fail_fast_by) and not stopping:
                stopping = True
                self._begin_stop()
            if not stopping:
                self._fill()
            # Hand the turn's events (and records to fsync) to the log's writer
            # now when something waits for them to be durable, else once the
            # oldest has waited COMMIT_HOLD: most turns settle units nothing
            # waits for, and each hand-over wakes the writer thread.
            now = time.monotonic()
            if self._deferred or stopping or (
                held_since is not None and now - held_since >= COMMIT_HOLD
            ):
                seq = self.log.commit()
                held_since = None
            elif held_since is None:
                held_since = now
            if self._deferred:
                self._waiting.append((seq, self._deferred))
                self._deferred = []
            if self.on_progress is not None:
                self.counts.running = self.running
                self.on_progress(self.counts)
            busy = self.workers.in_flight
            if not busy and not self._waiting and (stopping or not (self.ready or self.timers)):
                return
            wake = self._next_wake()
            if held_since is not None:  # the held events go out by then at the latest
                left = max(0.0, held_since + COMMIT_HOLD - time.monotonic())
                wake = left if wake is None else min(wake, left)
            if self._waiting and self._waiting[0][0] <= self.log.durable_seq:
                # durable before it was waited for: the writer may not have
                # woken us for it (_durable_wake), so do not sleep
                wake = 0.0
            if wake is not None:  # a retry a month away: wake, and wait again
                wake = min(wake, MAX_WAIT_S)
            for key, _ in self.selector.select(wake):
                if key.data is None:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(wake_r, 512):
                            pass
                    if stopping and self._escalate:
                        self.workers.kill()
                else:
                    for reply in self.workers.read(key.fd):
                        self._on_reply(reply)
            self._release_durable()
            if not stopping:
                self._release_timers()

    # ------------------------------------------------------ record durability

    def _after_durable(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` (it may start a dependant) once every record written so far
        is durable: after the next commit's batch is on disk. Outside the loop
        (resume, the loop's end) everything read is already durable."""
        if self._gating:
            self._deferred.append(fn)
        else:
            fn()

    def _durable_wake(self) -> None:
        """On the log's writer thread: a batch is durable; wake the loop, when
        something waits for a batch (most settles wake nobody: a task without
        consumers). A batch that turns durable before the loop queued what
        waits for it is seen by the loop itself before it sleeps (_turns)."""
        if not self._waiting:
            return
        with self._wake_lock:
            if self._wake_fd >= 0:
                with contextlib.suppress(OSError):
                    os.write(self._wake_fd, b"d")

    def _release_durable(self) -> None:
        durable = self.log.durable_seq
        while self._waiting and self._waiting[0][0] <= durable:
            for fn in self._waiting.popleft()[1]:
                fn()

    def _wrote(self, task: str, key: str | None) -> None:
        """A record the scheduling thread wrote without fsync: the next batch
        fsyncs it (and its directory) before its lines."""
        path = self.layout.result_path(task, key)
        self.log.sync((str(path), str(path.parent)))

    def _next_wake(self) -> float | None:
        if self.timers and self.stop_signal is None and self.fail_fast_by is None:
            return max(0.0, self.timers[0][0] - time.monotonic())
        return None

    def _fill(self) -> None:
        if self.hits is not None:  # --cache: hits settle here, consumers' hits too
            stop = self._stop_requested  # a signal ends the pass (and forks no worker)
            self.hits.take(self.ready, self._settle_cached, stop=stop)
            if stop():
                return
        idle = self.workers.idle
        while self.ready and idle:
            unit = self.ready.popleft()
            if not self.gate.take(unit.name, unit):
                continue  # the task's parallelism is used up: it waits in the gate
            self._next_token += 1
            self._tokens[self._next_token] = unit
            env = unit.staged_env
            if unit.last_env is not None and env is not None:
                env = {**env, **unit.last_env}  # a retry: what the last attempt did
            request: tuple[Any, ...] = ("unit", unit.name, unit.key, unit.attempt, env)
            if self.loop is not None or self.hits is not None:
                # [5] a scored loop's time budget (crucible.run.loop._engine), or None;
                # [6] --cache: its key, or a hit to restore there (run.cache_hits)
                stop_by = () if self.loop is None else self.loop.stop_by(unit.name, unit.key)
                request += (stop_by[0] if stop_by else None,)
                if self.hits is not None:
                    request += (self.hits.handoff(unit),)
            self.workers.submit(self._next_token, request)
            idle -= 1
        self.workers.flush()  # executor seam: send this round's submissions

    def _stop_requested(self) -> bool:
        return self.stop_signal is not None or self.fail_fast_by is not None

    def _on_reply(self, reply: Reply) -> None:
        if reply.outcome == "bug":
            raise RuntimeError(f"a dispatch worker failed:\n{reply.payload}")
        if not reply.final:
            unit = self._tokens[reply.token]
            self._started(unit, reply.payload["pid"], reply.payload.get("worker"))
            return
        unit = self._tokens.pop(reply.token)
        if (waiting := self.gate.release(unit.name)) is not None:
            self.ready.append(waiting)
        if reply.outcome == "error":  # a refusal the worker did not expect to meet
            if unit.pid is not None:
                self.running -= 1
            self._fail_unit(unit, str(reply.payload))
            return
        result = reply.payload
        kind = result["kind"]
        for warning in result.get("cache_warnings") or ():
            self.warn(warning)
        if result.get("cache_fact") is not None:  # --cache: appended with its batch
            self.log.after_durable(result["cache_fact"])
        if result.get("staged_env") is not None:
            unit.staged_env = result["staged_env"]
        if kind == "stage_error":
            self._fail_unit(unit, f"cannot stage inputs: {result['message']}")
        elif kind == "spawn_error":
            self._fail_unit(unit, result["message"])
        elif kind == "cached":  # a hit with large files, restored by the worker
            self._settle_cached(unit, result)
        elif kind == "finished":
            if unit.pid is None:  # a short task: its start comes with its end
                self._started(unit, result["pid"], result.get("worker"))
            self._exited(unit, result)
        elif kind == "handback":  # staged behind a task that runs long: start it elsewhere
            self.ready.appendleft(unit)
        elif kind == "worker_lost":  # an executor's worker died mid-unit
            self._worker_lost(unit, str(result["worker"]))
        # "not_started": stopping; a staged unit is not started and stays
        # unsettled (a resume runs it)

    def _settle_cached(self, unit: Unit, result: dict[str, Any]) -> None:
        """A unit restored from the task cache (crucible.run.cache._hits): nothing
        was started."""
        # restored without fsync: the next batch makes it (and its directory) durable
        self.log.sync(result["wrote"])
        fields: dict[str, Any] = {"cached": True, "cache_key": result["cache_key"]}
        if result["record"].get("files_bytes") is not None:
            fields["files_bytes"] = int(result["record"]["files_bytes"])
        # the usage of the attempt that produced it, marked by ``cached``
        fields.update(result["record"].get("usage") or {})
        self._settle_unit(unit, PASSED, result["record"].get("note"), exit_code=0, fields=fields)

    def _release_timers(self) -> None:
        now = time.monotonic()
        while self.timers and self.timers[0][0] <= now:
            _, _, unit = heapq.heappop(self.timers)
            self.ready.append(unit)

    def _begin_stop(self) -> None:
        """SIGINT/SIGTERM: start nothing new; the workers terminate every running
        group (SIGKILL after the grace period)."""
        self.ready.clear()
        self.timers.clear()
        self.workers.stop()

    # ---------------------------------------------------------------- resume

    def _resume_settled(self) -> None:
        """Mark tasks settled by an earlier session; count what is left to wait for."""
        if self.selection is not None:
            for name in self.graph.order:
                record = self.selection.kept.get(name)
                if record is not None:
                    status = record.get("status", FAILED)
                    self.status[name] = status
                    if record.get("tolerated") is True:
                        self.tolerated.add(name)
                        if "keys" not in record:
                            self.counts.tolerated += 1
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
        if self.selected is not None and name not in self.selected:
            return  # recorded as not selected at the start
        if self.loop is not None:  # scored loop: the body runs by revisions
            if name in self.loop.body:
                self.loop.maybe_start()
                return
            if (note := self.loop.skip_note(name)) is not None:
                self._settle_unrun(name, SKIPPED, note)
                return
        task = self.graph.tasks[name]
        if task.get("join", "all") == "all":
            epilogue = task.get("epilogue", False)
            for dep in task.get("needs", ()):
                if epilogue and not self.graph.tasks[dep].get("epilogue", False):
                    # An epilogue runs whatever the regular tasks did; its needs
                    # on them only order it (stage stages them as settled).
                    continue
                dep_status = self.status.get(dep)
                if dep_status != PASSED:
                    note = f"skipped: needs {dep!r}, which {_did(dep_status)}"
                    self._settle_unrun(name, SKIPPED, note)
                    return
        if "map" in task or "matrix" in task:
            self._expand(name)
            return
        if "when" in task and self._condition_settles(name, None, control.NO_ITEM):
            return
        self.ready.append(Unit(name, None))

    def _condition_settles(self, name: str, key: str | None, item: Any) -> bool:
        """Evaluate the unit's ``when``; settle it (skipped, or failed on an error)
        and say so, or return False when it runs."""
        task = self.graph.tasks[name]
        run = (
            control.run_status(self.graph.tasks, self.status, self.tolerated)
            if task["epilogue"]
            else None
        )
        decided = self.control.decide(task, self.status, item=item, run=run)
        if decided is None:
            return False
        status, note = decided
        if status == FAILED:  # a condition error: listed, and --fail-fast stops
            self._note_failure(Unit(name, key), None)
        if key is None:
            self._settle_unrun(name, status, note)
        else:
            # An instance that never had an attempt: no attempt number in its event.
            self.stage.record_settled(
                self.plan, self.state, name, status=status, note=note, key=key, durable=False
            )
            self._wrote(name, key)
            self.log.emit("task_finished", task=name, key=key, status=status, note=note)
            self._count_settled(status)
            self.instances_left[name] -= 1
            if self.instances_left[name] == 0:
                keys = self.instances[name]
                self._after_durable(lambda: self._fold(name, keys))
        return True

    def _settle_unrun(self, name: str, status: str, note: str) -> None:
        """A task settled without running: skipped, failed by its condition, or
        its map source unreadable (a mapped task gets an aggregate record with no
        instances). Recorded, logged, counted, and its consumers woken."""
        self.stage.record_settled(
            self.plan, self.state, name, status=status, note=note, durable=False
        )
        self._wrote(name, None)
        self.log.emit("task_finished", task=name, status=status, note=note)
        self._count_settled(status)
        self._settle(name, status)

    def _expand(self, name: str) -> None:
        conditional = "when" in self.graph.tasks[name]
        item_of: dict[str, Any] = {}
        try:
            if self.fanouts.listed(name):
                keys = self.fanouts.keys(name)
                if conditional:  # a condition may read `item`
                    item_of = self.fanouts.items(name)
            else:
                items = self.stage.map_items(self.plan, self.state, name)
                keys = [key for key, _ in items]
                self.fanouts.remember_previews(name, items)
                if conditional:
                    item_of = dict(items)
                del items
        except CrucibleError as exc:
            if self.fanouts.listed(name):
                note = f"cannot expand the fan-out: {exc}"
            else:
                note = f"cannot read the map source {self.graph.tasks[name]['map']}: {exc}"
            self._settle_unrun(name, FAILED, note)
            return
        if not keys:
            self._fold(name, keys)
            return
        self.counts.total += len(keys) - 1
        self.instances[name] = keys
        # Instances settled in an earlier session keep their records (resume):
        # one read of the task's packed records.
        recorded = self.stage.load_all(self.state, name)
        pending: list[str] = []
        for key in keys:
            record = recorded.get(key)
            if record is not None:
                self._count_settled(record.get("status", FAILED))
                continue
            pending.append(key)
        self.instances_left[name] = len(pending)
        if not pending:
            self._fold(name, keys)
            return
        for key in pending:
            # A false condition settles its instance at once (the last one folds).
            if conditional and self._condition_settles(name, key, item_of[key]):
                continue
            self.ready.append(Unit(name, key))

    def _fold(self, name: str, keys: list[str]) -> None:
        record = self.stage.settle_fold(self.plan, self.state, name, keys, durable=False)
        self._wrote(name, None)
        status = record.get("status", FAILED)
        task = self.graph.tasks[name]
        if "when" in task and (verdict := control.fold_verdict(record)) is not None:
            status, note = verdict  # instances skipped by their condition are no failure
            record = control.amend_record(
                self.layout.result_path(name), status=status, note=note, durable=False
            )  # rides the group commit (issue 14): self._wrote above
        if status == FAILED and control.tolerates_fold(task, self.state, self.stage, record):
            control.mark_tolerated(self.layout.result_path(name), durable=False)
            self.tolerated.add(name)
        self.log.emit(
            "task_finished",
            task=name,
            status=status,
            note=record.get("note"),
            instances=len(keys),
            **({"tolerated": True} if name in self.tolerated else {}),
        )
        if not keys:
            self._count_settled(status)
        self._settle(name, status)

    def _settle(self, name: str, status: str) -> None:
        """``name`` settled (counting is the caller's): wake its consumers once
        its record is durable. A task nothing waits for (no consumer, not
        before a scored loop) defers nothing: no loop turn waits for its batch."""
        self.status[name] = status
        if self.graph.consumers[name] or (
            self.loop is not None and name in self.loop.phases.before
        ):
            self._after_durable(lambda: self._wake_consumers(name))

    def _wake_consumers(self, name: str) -> None:
        for consumer in self.graph.consumers[name]:
            self.remaining[consumer] -= 1
            if self.remaining[consumer] == 0 and consumer not in self.status:
                self._on_ready(consumer)
        if self.loop is not None and name in self.loop.phases.before:  # scored loop
            self.loop.maybe_start()

    # ---------------------------------------------------- a unit (worker side)

    def _serve(self, request: tuple[Any, ...], channel: Channel) -> Any:
        """In a worker process: one attempt of one unit."""
        if request[0] == "unit":
            return self.runner.run(request, channel)
        raise ValueError(f"unknown request {request[0]!r}")

    # ------------------------------------------------------ a unit (main side)

    def _workspace_rel(self, unit: Unit) -> str:
        """``work/<task>[/<escaped key>]``, as the layout spells it relative to
        STATE (an unmapped task's without building its Path: once per start;
        its name is a plan task's, checked when the plan's view was built)."""
        if unit.key is None:
            return "work/" + unit.name
        return self._rel(self.layout.work_dir(unit.name, unit.key))

    def _started(self, unit: Unit, pid: int, worker: str | None = None) -> None:
        unit.pid = pid
        if unit.first_start is None:
            unit.first_start = time.monotonic()
        self.running += 1
        self.log.emit(
            "task_started",
            **self._ids(unit),
            attempt=unit.attempt,
            pid=pid,
            workspace=self._workspace_rel(unit),
            **self._item_preview(unit),
            **({} if worker is None else {"worker": worker}),  # a Dask executor's
        )

    def _item_preview(self, unit: Unit) -> dict[str, str]:
        """``item``: a short preview of an instance's item (report, timeline), on
        its first attempt only (later attempts have the same item)."""
        if unit.key is None or unit.attempt > 1:
            return {}
        text = self.fanouts.previews.get((unit.name, unit.key))
        return {} if text is None else {"item": text}

    def _exited(self, unit: Unit, result: dict[str, Any]) -> None:
        self.running -= 1
        unit.pid = None
        fields: dict[str, Any] = {}
        if result.get("output_bytes") is not None:
            fields["output_bytes"] = int(result["output_bytes"])
        record = result.get("record")
        if record is not None and record.get("wrote"):
            self.log.sync(record["wrote"])  # fsynced by the next batch, before its lines
        if record is not None and record.get("files_bytes") is not None:
            fields["files_bytes"] = int(record["files_bytes"])
        if result.get("log_error") is not None:
            fields["log_error"] = result["log_error"]
        if result.get("cache_miss") is not None:  # why the cache did not restore it
            fields["cache_miss"] = str(result["cache_miss"])
        fields.update(result.get("usage") or {})  # what it cost (crucible.run.executors._usage)
        finished = _Finished(
            unit=unit,
            code=result["code"],
            duration=result["duration"],
            stop_reason=result["stop_reason"],
            fields=fields,
            record=record,
        )
        if finished.stop_reason == "interrupt" and not _passed(finished):
            # Nothing is recorded in results/: the unit stays unsettled and a
            # resume runs it again. (One that exited 0 and passed capture after
            # its TERM trap settles as passed, below.)
            if record is not None:
                self.stage.remove_result(self.state, unit.name, unit.key, durable=False)
                self._wrote(unit.name, unit.key)
            if self.stop_signal is None and self.fail_fast_by is not None:
                why = f"terminated: --fail-fast after {self.fail_fast_by} failed"
            else:
                signame = signal.Signals(self.stop_signal or signal.SIGTERM).name
                why = f"terminated: the dispatcher received {signame}"
            self._attempt_finished(unit, INTERRUPTED, why, finished.code, finished.duration, fields)
            return
        finished.log = result.get("log")
        finished.tail = result.get("tail") or ""
        if result.get("capture_error") is not None:
            self._fail_unit(
                unit,
                f"cannot capture the result: {result['capture_error']}",
                log=finished.log,
                tail=finished.tail,
                exit_code=finished.code,
            )
            return
        self._settle_attempt(finished)

    def _settle_attempt(self, finished: _Finished) -> None:
        unit = finished.unit
        task = self.graph.tasks[unit.name]
        record = finished.record
        note: str | None
        cut = False  # stopped by the scored loop's time budget: failed, never retried
        if finished.stop_reason == "timeout":
            how = exit_text(finished.code)
            note = compose_note(
                f"{how} after timeout {task.get('timeout')}s", None, finished.log, finished.tail
            )
            status, retryable = FAILED, True
            if self.loop is not None and self.loop.budget_cut(unit.name, unit.key):
                note = compose_note(
                    f"{how}: the loop's time budget ran out", None, finished.log, finished.tail
                )
                cut = True
        else:
            assert record is not None
            status = record.get("status", FAILED)
            note = record.get("note")
            retryable = bool(record.get("retryable", status != PASSED))
        fields = finished.fields
        timed_out = finished.stop_reason == "timeout" and not cut
        retry = control.Retry(None)
        if status != PASSED and self.stop_signal is None and not cut:
            retry = control.next_retry(
                task,
                unit.attempt,
                timed_out=timed_out,
                exit_code=finished.code,
                retryable=retryable,
                backoff=self.options.backoff,
                elapsed=None if unit.first_start is None else time.monotonic() - unit.first_start,
            )
            if retry.why_not is not None and note is not None:
                note = with_reason(note, retry.why_not)
        if retry.delay is not None:
            # Remove this attempt's record so an interruption during the backoff
            # leaves the unit unsettled (a resume runs it again).
            self.stage.remove_result(self.state, unit.name, unit.key, durable=False)
            self._wrote(unit.name, unit.key)
            self._attempt_finished(
                unit, status, note, finished.code, finished.duration, {"retry": True, **fields}
            )
            delay = retry.delay
            unit.last_env = control.last_attempt_env(finished.code, timed_out)
            unit.attempt += 1
            self._timer_seq += 1
            heapq.heappush(self.timers, (time.monotonic() + delay, self._timer_seq, unit))
            return
        if record is None:
            failed = failure_record(
                self.stage.RESULT_FORMAT,
                unit.name,
                unit.key,
                note or "",
                log=finished.log,
                tail=finished.tail,
                exit_code=finished.code,
            )
            if all(k in fields for k in USAGE_FIELDS):  # it ran (a timeout): what it cost
                failed["usage"] = {k: fields[k] for k in USAGE_FIELDS}
            self.stage.write_result(self.state, failed, durable=False)
            self._wrote(unit.name, unit.key)
        elif retry.why_not is not None:  # the note says why the policy stopped here
            self.stage.amend_result(
                self.plan, self.state, unit.name, key=unit.key, status=status, note=note or "",
                durable=False,
            )  # fmt: skip
            self._wrote(unit.name, unit.key)
        tolerable = status == FAILED and control.tolerates(task, finished.code, timed_out)
        if status == FAILED and not tolerable:
            self._note_failure(unit, finished.log)
        self._settle_unit(
            unit,
            status,
            note,
            exit_code=finished.code,
            duration=finished.duration,
            fields=fields,
            tolerable=tolerable,
        )

    def _worker_lost(self, unit: Unit, worker: str) -> None:
        """A transient failure: retried under the task's retries (whatever its
        ``on_exit``: there is no exit code), else a failure of the unit that no
        exit-code tolerance covers (docs/spec/run.md, Executors)."""
        if unit.pid is not None:
            self.running -= 1
            unit.pid = None
        note = f"worker lost: {worker}"
        task = dict(self.graph.tasks[unit.name])
        if isinstance(task.get("retry"), dict):
            task["retry"] = {k: v for k, v in task["retry"].items() if k != "on_exit"}
        retry = control.Retry(None)
        if self.stop_signal is None:
            retry = control.next_retry(
                task, unit.attempt, timed_out=False, exit_code=None, retryable=True,
                backoff=self.options.backoff,
                elapsed=None if unit.first_start is None else time.monotonic() - unit.first_start,
            )  # fmt: skip
        if retry.delay is None:
            self._fail_unit(unit, note if retry.why_not is None else f"{note}; {retry.why_not}")
            return
        self.log.emit(
            "task_finished", **self._ids(unit), attempt=unit.attempt, status=FAILED, note=note,
            retry=True,
        )  # fmt: skip
        unit.attempt += 1
        self._timer_seq += 1
        heapq.heappush(self.timers, (time.monotonic() + retry.delay, self._timer_seq, unit))

    def _fail_unit(
        self,
        unit: Unit,
        note: str,
        *,
        log: str | None = None,
        tail: str = "",
        exit_code: int | None = None,
    ) -> None:
        """A unit that could not be staged, started or captured: a measured failure,
        never retried."""
        note = compose_note(note, None, log, tail)
        self.stage.write_result(
            self.state,
            failure_record(
                self.stage.RESULT_FORMAT, unit.name, unit.key, note, log=log, tail=tail,
                exit_code=exit_code,
            ),
            durable=False,
        )  # fmt: skip
        self._wrote(unit.name, unit.key)
        task = self.graph.tasks[unit.name]
        # exit codes tolerate a task's own exit only, not a unit that could not
        # be staged, started or captured
        tolerable = control.tolerates(task, None, False)
        if not tolerable:
            self._note_failure(unit, log)
        self._settle_unit(unit, FAILED, note, exit_code=exit_code, tolerable=tolerable)

    def _note_failure(self, unit: Unit, log: str | None) -> None:
        """A unit settled failed: keep it for the last line; --fail-fast stops."""
        if self.loop is not None and self.loop.forgives(unit.name, unit.key):
            return  # a failed scoring unit fails its revision, not the run
        label = unit.name if unit.key is None else f"{unit.name}[{unit.key}]"
        if len(self.failures) < FAILURES_SHOWN:
            self.failures.append((label, log))
        if self.options.fail_fast and self.fail_fast_by is None:
            self.fail_fast_by = repr(label)

    def _settle_unit(
        self,
        unit: Unit,
        status: str,
        note: str | None,
        *,
        exit_code: int | None,
        duration: float | None = None,
        fields: dict[str, Any] | None = None,
        tolerable: bool = False,
    ) -> None:
        if tolerable:  # the record says so first: report, outcome and resume read it
            if unit.key is None:  # rides the group commit (issue 14)
                control.mark_tolerated(self.layout.result_path(unit.name), durable=False)
                self._wrote(unit.name, None)
            else:
                self.stage.update_record(
                    self.state, unit.name, unit.key, tolerated=True, durable=False
                )
                self._wrote(unit.name, unit.key)
            fields = {**(fields or {}), "tolerated": True}
            self.counts.tolerated += 1
            if unit.key is None:
                self.tolerated.add(unit.name)
        self._attempt_finished(unit, status, note, exit_code, duration, fields)
        self._count_settled(status)
        if unit.key is None:
            self._settle(unit.name, status)
            return
        if self.loop is not None and unit.name in self.loop.body:  # a revision's unit
            loop = self.loop
            self._after_durable(lambda: loop.unit_settled(unit.name, status, tolerable))
            return
        self.instances_left[unit.name] -= 1
        if self.instances_left[unit.name] == 0:
            # the aggregate is written once every instance's record is durable
            keys = self.instances[unit.name]
            self._after_durable(lambda: self._fold(unit.name, keys))


def _passed(finished: _Finished) -> bool:
    return (
        finished.code == 0
        and finished.record is not None
        and finished.record.get("status") == PASSED
    )


def _did(status: str | None) -> str:
    return {FAILED: "failed", SKIPPED: "was skipped", None: "did not run"}.get(
        status, f"settled as {status}"
    )

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
import os
import resource
import selectors
import signal
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from crucible.compile import MAX_WAIT_S
from crucible.run._options import RunOptions
from crucible.run.engine import _control as control
from crucible.run.engine._attempts import Attempts
from crucible.run.engine._durable import DurableGate
from crucible.run.engine._graph import TaskGraph
from crucible.run.engine._host import EngineHost
from crucible.run.engine._matrix import Fanouts
from crucible.run.engine._parallelism import ParallelismGate
from crucible.run.engine._parts import Parts
from crucible.run.engine._readiness import Readiness
from crucible.run.engine._schedule import Schedule
from crucible.run.engine._selection import Selection
from crucible.run.engine._signals import StopSignals
from crucible.run.engine._temps import TempFreer
from crucible.run.engine._units import (
    FAILED,
    FAILURES_SHOWN,
    INTERRUPTED,
    PASSED,
    SKIPPED,
    Counts,
    RunOutcome,
    Unit,
)
from crucible.run.executors import _seam as executor
from crucible.run.executors._create import create as create_executor
from crucible.run.executors._procs import close_inherited, kill_group
from crucible.run.executors._seam import Executor
from crucible.run.executors._slots import Slots
from crucible.run.executors._unit import UnitRunner
from crucible.run.executors._workers import Channel, Reply
from crucible.run.session import events
from crucible.run.session._admit import Admission
from crucible.run.session._log import SessionLog

if TYPE_CHECKING:  # imported at run time only for --cache, a loop or accounting
    from crucible.run.accounting._book import Accounting
    from crucible.run.cache._hits import CacheHits
    from crucible.run.loop._engine import LoopRun
    from crucible.stage import StateDir

__all__ = ["FAILURES_SHOWN", "Counts", "Dispatcher", "RunOutcome", "Unit"]

BACKOFF_MAX = 30.0
#: the longest a turn's events wait for the next hand-over to the session log
#: when nothing waits for them to be durable (docs/spec/run.md, "Session log"):
#: one hand-over a turn woke the log's writer thread ~4 times a unit
COMMIT_HOLD = 0.02


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
        state_dir: StateDir,
        graph: TaskGraph,
        environ: Mapping[str, str],
        on_progress: Callable[[Counts], None] | None = None,
        selection: Selection | None = None,
        on_warning: Callable[[str], None] | None = None,
    ) -> None:
        """Built once per session, from what the run built once (the plan's
        admission, its state dir's records and staging, its task graph), in
        this order: the decisions' state, the executor, a scored loop, the
        accounting of an accounted plan, and the rooms that decide (readiness,
        attempts)."""
        #: warnings the workers send (the task cache's, crucible.run.cache._unit)
        self.warn = on_warning or (lambda _w: None)
        self.admission = admission
        self.plan = admission.plan
        #: the plan's typed model: what the run reads (crucible.core.plan)
        self.model = admission.model
        self.options = options
        self.state = options.state
        self.state_dir = state_dir
        self.layout = state_dir.layout
        self.log = log
        self.on_progress = on_progress
        self.graph = graph
        self.jobs = admission.jobs
        self.selection = selection
        self._set_up_decisions()
        self._set_up_executor(environ)
        self._set_up_loop()
        self._set_up_accounting(environ)
        self._set_up_rooms()

    def _set_up_decisions(self) -> None:
        """The state the decisions keep, each its own object: record durability
        (crucible.run.engine._durable), the scheduling state (._schedule), the
        stop signals (._signals), control flow (._control: conditions; a signal
        abandons a condition being evaluated, so the dispatcher always stops),
        listed fan-outs (._matrix: static ones expand now, before
        plan_admitted) and each task's parallelism (._parallelism)."""
        self.durable = DurableGate(self.log, self.layout)
        self.schedule = Schedule(self.graph, self.durable, self.selection)
        self.signals = StopSignals()
        self.control = control.Control(
            self.model, self.state_dir, cancelled=lambda: self.signals.received is not None
        )
        self._tokens: dict[int, Unit] = {}
        self._next_token = 0
        # No task may inherit a descriptor of ours (posix_spawn closes none).
        close_inherited()
        self.fanouts = Fanouts(self.model, self.admission.params, self.state)
        self.parallelism: ParallelismGate[Unit] = ParallelismGate(self.graph.tasks)

    def _set_up_executor(self, environ: Mapping[str, str]) -> None:
        """The slots, the unit runner the workers run, the --cache hit path, the
        executor and the selector its replies are read with."""
        options, admission = self.options, self.admission
        self.slots = Slots(self.jobs)
        self.runner = UnitRunner(
            plan=self.plan,
            model=admission.model,
            options=options,
            emit_cap=admission.emit_cap,
            environ=environ,
            slots=self.slots,
            pack_dir=admission.pack_dir,
            state_dir=self.state_dir,
        )
        # --cache (crucible.run.cache._hits): a ready unit that hits is restored and
        # settled on this thread, with no worker, slot or staging
        self.hits: CacheHits | None = None
        if options.cache is not None:
            from crucible.run.cache._hits import CacheHits  # lazy: only a run with --cache

            self.hits = CacheHits(
                options.cache, state_dir=self.state_dir, tasks=self.graph.tasks,
                environ=environ, agent_cmd=options.agent_cmd, emit_cap=admission.emit_cap,
                warn=self.warn, pack_dir=admission.pack_dir,
            )  # fmt: skip
            # each unit looked up once: the schedule's ready queue is the hits'
            self.schedule.ready = self._hit_queue = self.hits.ready_queue()
            # the cache records workers encoded are appended once their batch is durable
            self.log.on_batch_durable = self.hits.record_facts
            self.log.on_close = self.hits.close_recorder
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

    def _set_up_loop(self) -> None:
        """A scored loop (docs/spec/loop.md): revisions of the body, run/loop/_engine.py."""
        self.loop: LoopRun | None = None
        if self.model.loop is not None:
            # lazy: most plans have no loop (tests/run/test_startup_imports.py)
            from crucible.run.loop import _engine as loop_engine

            host = EngineHost(
                plan=self.plan, model=self.model, state_dir=self.state_dir, log=self.log, graph=self.graph,
                control=self.control, schedule=self.schedule, durable=self.durable,
                signals=self.signals,
            )  # fmt: skip
            self.loop = loop_engine.attach(host)
            if self.loop is not None:
                self.schedule.loop_before = frozenset(self.loop.phases.before)
                self.schedule.on_loop_before = self.loop.maybe_start

    def _set_up_accounting(self, environ: Mapping[str, str]) -> None:
        """An accounted plan (docs/spec/export.md): the proof writer's engine,
        driven as the run decides."""
        self.accounting: Accounting | None = None
        if self.model.workflow.accounted:
            # lazy: only an accounted plan loads the proof writer
            from crucible.run.accounting._book import open_accounting

            self.accounting = open_accounting(
                self.model, self.state_dir, self.admission.params, actor=self.options.actor,
                resume=self.options.resume, environ=environ,
            )  # fmt: skip

    def _set_up_rooms(self) -> None:
        """The rooms of a session's decisions, sharing its Parts: readiness (skip,
        expand, queue, fold) and the attempts' outcomes (start, end, retry, settle)."""
        parts = Parts(
            plan=self.plan, options=self.options, state=self.state, layout=self.layout,
            log=self.log, state_dir=self.state_dir, graph=self.graph, schedule=self.schedule,
            durable=self.durable, signals=self.signals, control=self.control,
            fanouts=self.fanouts, loop=self.loop, accounting=self.accounting,
        )  # fmt: skip
        # temporary files (crucible.run.engine._temps): freed as their readers settle
        self.temps: Any = None
        if any(t.temp_files for t in self.graph.tasks.values()):
            self.temps = TempFreer(
                self.state, self.graph.tasks, self.schedule.status,
                lambda: self.schedule.selected, self._temp_freed,
                self.loop.body if self.loop is not None else frozenset(),
            )  # fmt: skip
            self.schedule.on_settled = self.temps.settled
        self.attempts = Attempts(parts)
        self.readiness = Readiness(parts, self.attempts.note_failure)
        self.attempts.readiness = self.readiness
        self.schedule.on_ready = self.readiness.on_ready
        if self.accounting is not None:
            self.accounting.requeue = self.schedule.ready.append
            self.accounting.unsettle = self.attempts.unsettle
        # A unit whose settle wakes nothing may be answered late, with the next
        # reply of its worker (crucible.run.executors._unit.UnitRunner.serve).
        self.runner.quiet = frozenset(
            name
            for name in self.graph.tasks
            if not self.graph.consumers[name]
            and (
                self.loop is None or not (name in self.loop.body or name in self.loop.phases.before)
            )
        )

    def _temp_freed(self, task: str, files: int, size: int) -> None:
        self.log.emit(events.temp_freed(task=task, files=files, bytes=size))

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        self.workers.close()
        self.slots.close()

    # ------------------------------------------------------------ entry point

    def run(self) -> RunOutcome:
        """The session: watch the workers and the signals, queue what is ready,
        run the turns until nothing is left, then its verdict (``run_finished``)."""
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.selector.register(wake_r, selectors.EVENT_READ, None)
        self._watch_workers()
        self.signals.install(wake_w)
        started = time.monotonic()
        lost: executor.ExecutorLost | None = None
        self.durable.watch(wake_w)
        try:
            self._queue_ready()
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
            self.signals.restore()
            self.durable.unwatch()
            self.selector.close()
            os.close(wake_r)
            os.close(wake_w)
            self.workers.close()
            self.slots.close()
            if self.hits is not None:
                self.hits.close()
            if self.accounting is not None:  # recover an open epoch; usage.json
                self.accounting.close()
        duration = time.monotonic() - started
        counts = self._counts()
        status, code = self._verdict(lost)
        self.log.emit(
            events.run_finished(
                status=status,
                counts=counts,
                duration=round(duration, 6),
                max_rss_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                worker_max_rss_kib=self.workers.peak_rss_kib,
            )
        )
        if lost is not None:
            raise lost  # after run_finished: the runner logs its shutdown (exit 3)
        return RunOutcome(
            status, code, counts, self.admission.digest, duration, tuple(self.schedule.failures)
        )

    def _watch_workers(self) -> None:
        """The workers' reply fds in the selector: a local pool forks at its first
        unit (crucible.run.executors._workers), its fds watched as they appear."""

        def watch(fd: int) -> None:
            self.selector.register(fd, selectors.EVENT_READ, _WORKER)

        if hasattr(self.workers, "watch"):
            self.workers.watch(watch)
        else:
            for fd in self.workers.reply_fds:
                watch(fd)

    def _queue_ready(self) -> None:
        """What an earlier session settled, the leftovers it freed, what is not
        selected, then every task ready now (and a scored loop whose before tasks
        may all have settled)."""
        self.schedule.resume(self.selection)
        if self.temps is not None:  # an earlier session's leftovers, first
            self.temps.start()
        self.readiness.not_selected()
        for name in self.graph.order:
            if name not in self.schedule.status and self.schedule.remaining[name] == 0:
                self.schedule.ready_once(name)
        if self.loop is not None:  # scored loop: its before tasks may all be settled
            self.loop.maybe_start()

    def _counts(self) -> dict[str, int]:
        """``run_finished.counts``."""
        counts = {
            "tasks": len(self.graph.tasks),
            "units": self.schedule.counts.total,
            PASSED: self.schedule.counts.passed,
            FAILED: self.schedule.counts.failed,
            SKIPPED: self.schedule.counts.skipped,
        }
        if self.schedule.counts.tolerated:
            counts["tolerated"] = self.schedule.counts.tolerated
        return counts

    def _verdict(self, lost: executor.ExecutorLost | None) -> tuple[str, int]:
        """The session's status and exit code (docs/spec/run.md, "Exit codes")."""
        if lost is not None:
            return FAILED, lost.exit_code
        if self.signals.received is not None:
            return INTERRUPTED, 128 + self.signals.received
        if self.loop is not None and self.loop.fails_run:  # scored loop: body_failed
            return FAILED, 1
        if all(self.schedule.status.get(n) == PASSED for n in self.schedule.expected()):
            return PASSED, 0
        if self.model.version >= 3 and all(
            n in self.schedule.status
            and (self.schedule.status[n] != FAILED or n in self.schedule.tolerated)
            for n in self.schedule.expected()
        ):
            # IR v3: skips (a false condition, a tolerated producer) and tolerated
            # failures leave the run passed; any other skip follows a failure.
            return PASSED, 0
        return FAILED, 1

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

    # ------------------------------------------------------------------- loop

    def _loop(self, wake_r: int) -> None:
        self.durable.gating = True
        try:
            self._turns(wake_r)
        finally:
            self.durable.gating = False

    def _turns(self, wake_r: int) -> None:
        stopping = False
        #: when the oldest turn whose events were not handed over yet ended
        held_since: float | None = None
        while True:
            if (self.signals.received is not None or self.schedule.fail_fast_by) and not stopping:
                stopping = True
                self._begin_stop()
            if not stopping:
                self._fill()
            # Hand the turn's events (and records to fsync) to the log's writer
            # now when something waits for them to be durable, else once the
            # oldest has waited COMMIT_HOLD: most turns settle units nothing
            # waits for, and each hand-over wakes the writer thread.
            now = time.monotonic()
            if (
                self.durable.deferred
                or stopping
                or (held_since is not None and now - held_since >= COMMIT_HOLD)
            ):
                self.durable.committed(self.log.commit(urgent=self.durable.urgent))
                held_since = None
            elif held_since is None:
                held_since = now
            if self.on_progress is not None:
                self.schedule.counts.running = self.schedule.running
                self.on_progress(self.schedule.counts)
            busy = self.workers.in_flight
            idle = not (self.schedule.ready or self.schedule.timers)
            if not busy and not self.durable.waiting and (stopping or idle):
                return
            wake = self.schedule.next_wake(self._stop_requested())
            if held_since is not None:  # the held events go out by then at the latest
                left = max(0.0, held_since + COMMIT_HOLD - time.monotonic())
                wake = left if wake is None else min(wake, left)
            if self.durable.due():
                # durable before it was waited for: the writer may not have
                # woken us for it (DurableGate._durable_wake), so do not sleep
                wake = 0.0
            if wake is not None:  # a retry a month away: wake, and wait again
                wake = min(wake, MAX_WAIT_S)
            for key, _ in self.selector.select(wake):
                if key.data is None:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(wake_r, 512):
                            pass
                    if stopping and self.signals.escalate:
                        self.workers.kill()
                else:
                    for reply in self.workers.read(key.fd):
                        self._on_reply(reply)
            self.durable.release()
            if not stopping:
                self.schedule.release_timers()

    def _fill(self) -> None:
        if self.hits is not None:  # --cache: hits settle here, consumers' hits too
            stop = self._stop_requested  # a signal ends the pass (and forks no worker)
            self.hits.take(self._hit_queue, self.attempts.settle_cached, stop=stop)
            if stop():
                return
        idle = self.workers.idle
        while self.schedule.ready and idle:
            unit = self.schedule.ready.popleft()
            if not self.parallelism.take(unit.name, unit):
                continue  # the task's parallelism is used up: it waits in the gate
            if self.accounting is not None and not self._accounted_start(unit):
                continue
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

    def _accounted_start(self, unit: Unit) -> bool:
        """An accounted run: may ``unit`` start (its slot begun, or its retry epoch
        begun now)? One waiting for its epoch is requeued by the accounting; one
        that must not run settles failed (docs/spec/export.md §5)."""
        assert self.accounting is not None
        verdict = self.accounting.may_start(unit)
        if verdict is True:
            return True
        if (waiting := self.parallelism.release(unit.name)) is not None:
            self.schedule.ready.append(waiting)
        if isinstance(verdict, str):
            self.attempts.fail_unit(unit, verdict)
        return False

    def _stop_requested(self) -> bool:
        return self.signals.received is not None or self.schedule.fail_fast_by is not None

    def _on_reply(self, reply: Reply) -> None:
        if reply.outcome == "bug":
            raise RuntimeError(f"a dispatch worker failed:\n{reply.payload}")
        if not reply.final:
            unit = self._tokens[reply.token]
            self.attempts.started(unit, reply.payload["pid"], reply.payload.get("worker"))
            return
        unit = self._tokens.pop(reply.token)
        if (waiting := self.parallelism.release(unit.name)) is not None:
            self.schedule.ready.append(waiting)
        if reply.outcome == "error":  # a refusal the worker did not expect to meet
            if unit.pid is not None:
                self.schedule.running -= 1
            self.attempts.fail_unit(unit, str(reply.payload))
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
            self.attempts.fail_unit(unit, f"cannot stage inputs: {result['message']}")
        elif kind == "spawn_error":
            self.attempts.fail_unit(unit, result["message"])
        elif kind == "cached":  # a hit with large files, restored by the worker
            self.attempts.settle_cached(unit, result)
        elif kind == "finished":
            if unit.pid is None:  # a short task: its start comes with its end
                self.attempts.started(unit, result["pid"], result.get("worker"))
            self.attempts.exited(unit, result)
        elif kind == "handback":  # staged behind a task that runs long: start it elsewhere
            self.schedule.ready.appendleft(unit)
        elif kind == "worker_lost":  # an executor's worker died mid-unit
            self.attempts.worker_lost(unit, str(result["worker"]))
        # "not_started": stopping; a staged unit is not started and stays
        # unsettled (a resume runs it)

    def _begin_stop(self) -> None:
        """SIGINT/SIGTERM: start nothing new; the workers terminate every running
        group (SIGKILL after the grace period)."""
        self.schedule.clear()
        self.workers.stop()

    # ------------------------------------------------------------- readiness

    # ---------------------------------------------------- a unit (worker side)

    def _serve(self, request: tuple[Any, ...], channel: Channel) -> Any:
        """In a worker process: one attempt of one unit."""
        if request[0] == "unit":
            return self.runner.run(request, channel)
        raise ValueError(f"unknown request {request[0]!r}")

    # ------------------------------------------------------ a unit (main side)

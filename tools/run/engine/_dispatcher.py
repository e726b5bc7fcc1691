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
import selectors
import signal
import time
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crucible.compile._durations import MAX_WAIT_S
from crucible.core.errors import CrucibleError
from crucible.run._options import RunOptions
from crucible.run.engine import _control as control
from crucible.run.engine._durable import DurableGate
from crucible.run.engine._failures import compose_note, exit_text, failure_record, with_reason
from crucible.run.engine._graph import TaskGraph, build_graph
from crucible.run.engine._matrix import Fanouts
from crucible.run.engine._parallelism import ParallelismGate
from crucible.run.engine._schedule import Schedule
from crucible.run.engine._selection import NOT_SELECTED, Selection
from crucible.run.engine._signals import StopSignals
from crucible.run.engine._units import (
    FAILED,
    FAILURES_SHOWN,
    INTERRUPTED,
    PASSED,
    SKIPPED,
    Counts,
    Finished,
    RunOutcome,
    Unit,
)
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
        # The concerns the dispatcher's loop composes, each its own object:
        # record durability (crucible.run.engine._durable), the scheduling state
        # (crucible.run.engine._schedule), the stop signals (._signals), the
        # cache hits and the executor (below), and a scored loop (run/loop/).
        self.durable = DurableGate(log, self.layout)
        self.schedule = Schedule(self.graph, self.durable, selection)
        self.schedule.on_ready = self._on_ready
        self.signals = StopSignals()
        # Control flow (run/engine/_control.py): conditions. A signal abandons a
        # condition being evaluated, so the dispatcher always stops.
        self.control = control.Control(
            self.plan, options.state, stage, cancelled=lambda: self.signals.received is not None
        )
        self._tokens: dict[int, Unit] = {}
        self._next_token = 0
        # No task may inherit a descriptor of ours (posix_spawn closes none).
        close_inherited()
        stage.prepare_plan(self.plan)
        # Listed fan-outs (IR v3): static ones expand now, before plan_admitted.
        self.fanouts = Fanouts(self.plan, admission.params, options.state)
        self.parallelism: ParallelismGate[Unit] = ParallelismGate(self.graph.tasks)
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
            self.schedule.ready = self.hits.ready_queue()  # each unit looked up once
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
            if self.loop is not None:
                self.schedule.loop_before = frozenset(self.loop.phases.before)
                self.schedule.on_loop_before = self.loop.maybe_start
        # -- end scored loop
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

    # ------------------------------------------- what a scored loop may ask
    # (crucible.run.engine._host.LoopHost: run/loop/ uses nothing else)

    @property
    def status(self) -> Mapping[str, str]:
        return self.schedule.status

    @property
    def selected(self) -> AbstractSet[str] | None:
        return self.schedule.selected

    def select_also(self, names: AbstractSet[str]) -> None:
        if self.schedule.selected is not None:
            self.schedule.selected = self.schedule.selected | set(names)

    @property
    def stopping(self) -> bool:
        return self._stop_requested()

    @property
    def in_turns(self) -> bool:
        return self.durable.gating

    def after_durable(self, fn: Callable[[], None]) -> None:
        self.durable.after_durable(fn)

    def wrote(self, task: str, key: str | None) -> None:
        self.durable.wrote(task, key)

    def settle(self, name: str, status: str) -> None:
        self.schedule.settle(name, status)

    def count_settled(self, status: str) -> None:
        self.schedule.count_settled(status)

    def add_units(self, n: int) -> None:
        self.schedule.counts.total += n

    def note_failed(self, label: str) -> None:
        self.schedule.counts.failed += 1
        self.schedule.note_failure(label, None, fail_fast=False)

    def queue(self, unit: Unit) -> None:
        self.schedule.ready.append(unit)

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
        self.signals.install(wake_w)
        started = time.monotonic()
        lost: executor.ExecutorLost | None = None
        self.durable.watch(wake_w)
        try:
            self.schedule.resume(self.selection)
            self._not_selected()
            for name in self.graph.order:
                if name not in self.schedule.status and self.schedule.remaining[name] == 0:
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
            self.signals.restore()
            self.durable.unwatch()
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
            "units": self.schedule.counts.total,
            PASSED: self.schedule.counts.passed,
            FAILED: self.schedule.counts.failed,
            SKIPPED: self.schedule.counts.skipped,
        }
        if self.schedule.counts.tolerated:
            counts["tolerated"] = self.schedule.counts.tolerated
        if lost is not None:
            status, code = FAILED, lost.exit_code
        elif self.signals.received is not None:
            status = INTERRUPTED
            code = 128 + self.signals.received
        elif self.loop is not None and self.loop.fails_run:  # scored loop: body_failed
            status, code = FAILED, 1
        elif all(self.schedule.status.get(n) == PASSED for n in self.schedule.expected()):
            status, code = PASSED, 0
        elif self.plan["version"] >= 3 and all(
            n in self.schedule.status
            and (self.schedule.status[n] != FAILED or n in self.schedule.tolerated)
            for n in self.schedule.expected()
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
            status, code, counts, self.admission.digest, duration, tuple(self.schedule.failures)
        )

    def _not_selected(self) -> None:
        """--target: every unsettled task outside the selection is recorded as not
        selected (in the log only: no record, so a later resume runs it)."""
        if self.schedule.selected is None:
            return
        for name in self.graph.order:
            if name not in self.schedule.selected and name not in self.schedule.status:
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
                self.durable.committed(self.log.commit())
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
            self.hits.take(self.schedule.ready, self._settle_cached, stop=stop)
            if stop():
                return
        idle = self.workers.idle
        while self.schedule.ready and idle:
            unit = self.schedule.ready.popleft()
            if not self.parallelism.take(unit.name, unit):
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
        return self.signals.received is not None or self.schedule.fail_fast_by is not None

    def _on_reply(self, reply: Reply) -> None:
        if reply.outcome == "bug":
            raise RuntimeError(f"a dispatch worker failed:\n{reply.payload}")
        if not reply.final:
            unit = self._tokens[reply.token]
            self._started(unit, reply.payload["pid"], reply.payload.get("worker"))
            return
        unit = self._tokens.pop(reply.token)
        if (waiting := self.parallelism.release(unit.name)) is not None:
            self.schedule.ready.append(waiting)
        if reply.outcome == "error":  # a refusal the worker did not expect to meet
            if unit.pid is not None:
                self.schedule.running -= 1
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
            self.schedule.ready.appendleft(unit)
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

    def _begin_stop(self) -> None:
        """SIGINT/SIGTERM: start nothing new; the workers terminate every running
        group (SIGKILL after the grace period)."""
        self.schedule.clear()
        self.workers.stop()

    # ------------------------------------------------------------- readiness

    def _on_ready(self, name: str) -> None:
        """Every task ``name`` waits for has settled: skip it, expand it, or queue it."""
        if self.schedule.selected is not None and name not in self.schedule.selected:
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
                dep_status = self.schedule.status.get(dep)
                if dep_status != PASSED:
                    note = f"skipped: needs {dep!r}, which {_did(dep_status)}"
                    self._settle_unrun(name, SKIPPED, note)
                    return
        if "map" in task or "matrix" in task:
            self._expand(name)
            return
        if "when" in task and self._condition_settles(name, None, control.NO_ITEM):
            return
        self.schedule.ready.append(Unit(name, None))

    def _condition_settles(self, name: str, key: str | None, item: Any) -> bool:
        """Evaluate the unit's ``when``; settle it (skipped, or failed on an error)
        and say so, or return False when it runs."""
        task = self.graph.tasks[name]
        run = (
            control.run_status(self.graph.tasks, self.schedule.status, self.schedule.tolerated)
            if task["epilogue"]
            else None
        )
        decided = self.control.decide(task, self.schedule.status, item=item, run=run)
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
            self.durable.wrote(name, key)
            self.log.emit("task_finished", task=name, key=key, status=status, note=note)
            self.schedule.count_settled(status)
            self.schedule.instances_left[name] -= 1
            if self.schedule.instances_left[name] == 0:
                keys = self.schedule.instances[name]
                self.durable.after_durable(lambda: self._fold(name, keys))
        return True

    def _settle_unrun(self, name: str, status: str, note: str) -> None:
        """A task settled without running: skipped, failed by its condition, or
        its map source unreadable (a mapped task gets an aggregate record with no
        instances). Recorded, logged, counted, and its consumers woken."""
        self.stage.record_settled(
            self.plan, self.state, name, status=status, note=note, durable=False
        )
        self.durable.wrote(name, None)
        self.log.emit("task_finished", task=name, status=status, note=note)
        self.schedule.count_settled(status)
        self.schedule.settle(name, status)

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
        self.schedule.counts.total += len(keys) - 1
        self.schedule.instances[name] = keys
        # Instances settled in an earlier session keep their records (resume):
        # one read of the task's packed records.
        recorded = self.stage.load_all(self.state, name)
        pending: list[str] = []
        for key in keys:
            record = recorded.get(key)
            if record is not None:
                self.schedule.count_settled(record.get("status", FAILED))
                continue
            pending.append(key)
        self.schedule.instances_left[name] = len(pending)
        if not pending:
            self._fold(name, keys)
            return
        for key in pending:
            # A false condition settles its instance at once (the last one folds).
            if conditional and self._condition_settles(name, key, item_of[key]):
                continue
            self.schedule.ready.append(Unit(name, key))

    def _fold(self, name: str, keys: list[str]) -> None:
        record = self.stage.settle_fold(self.plan, self.state, name, keys, durable=False)
        self.durable.wrote(name, None)
        status = record.get("status", FAILED)
        task = self.graph.tasks[name]
        if "when" in task and (verdict := control.fold_verdict(record)) is not None:
            status, note = verdict  # instances skipped by their condition are no failure
            record = control.amend_record(
                self.layout.result_path(name), status=status, note=note, durable=False
            )  # rides the group commit (issue 14): self._wrote above
        if status == FAILED and control.tolerates_fold(task, self.state, self.stage, record):
            control.mark_tolerated(self.layout.result_path(name), durable=False)
            self.schedule.tolerated.add(name)
        self.log.emit(
            "task_finished",
            task=name,
            status=status,
            note=record.get("note"),
            instances=len(keys),
            **({"tolerated": True} if name in self.schedule.tolerated else {}),
        )
        if not keys:
            self.schedule.count_settled(status)
        self.schedule.settle(name, status)

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
        self.schedule.running += 1
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
        self.schedule.running -= 1
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
        finished = Finished(
            unit=unit,
            code=result["code"],
            duration=result["duration"],
            stop_reason=result["stop_reason"],
            fields=fields,
            record=record,
        )
        if finished.stop_reason == "interrupt" and not finished.passed:
            # Nothing is recorded in results/: the unit stays unsettled and a
            # resume runs it again. (One that exited 0 and passed capture after
            # its TERM trap settles as passed, below.)
            if record is not None:
                self.stage.remove_result(self.state, unit.name, unit.key, durable=False)
                self.durable.wrote(unit.name, unit.key)
            if self.signals.received is None and self.schedule.fail_fast_by is not None:
                why = f"terminated: --fail-fast after {self.schedule.fail_fast_by} failed"
            else:
                signame = signal.Signals(self.signals.received or signal.SIGTERM).name
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

    def _settle_attempt(self, finished: Finished) -> None:
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
        if status != PASSED and self.signals.received is None and not cut:
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
            self.durable.wrote(unit.name, unit.key)
            self._attempt_finished(
                unit, status, note, finished.code, finished.duration, {"retry": True, **fields}
            )
            delay = retry.delay
            unit.last_env = control.last_attempt_env(finished.code, timed_out)
            unit.attempt += 1
            self.schedule.retry_later(unit, delay)
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
            self.durable.wrote(unit.name, unit.key)
        elif retry.why_not is not None:  # the note says why the policy stopped here
            self.stage.amend_result(
                self.plan, self.state, unit.name, key=unit.key, status=status, note=note or "",
                durable=False,
            )  # fmt: skip
            self.durable.wrote(unit.name, unit.key)
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
            self.schedule.running -= 1
            unit.pid = None
        note = f"worker lost: {worker}"
        task = dict(self.graph.tasks[unit.name])
        if isinstance(task.get("retry"), dict):
            task["retry"] = {k: v for k, v in task["retry"].items() if k != "on_exit"}
        retry = control.Retry(None)
        if self.signals.received is None:
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
        self.schedule.retry_later(unit, retry.delay)

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
        self.durable.wrote(unit.name, unit.key)
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
        self.schedule.note_failure(label, log, fail_fast=self.options.fail_fast)

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
                self.durable.wrote(unit.name, None)
            else:
                self.stage.update_record(
                    self.state, unit.name, unit.key, tolerated=True, durable=False
                )
                self.durable.wrote(unit.name, unit.key)
            fields = {**(fields or {}), "tolerated": True}
            self.schedule.counts.tolerated += 1
            if unit.key is None:
                self.schedule.tolerated.add(unit.name)
        self._attempt_finished(unit, status, note, exit_code, duration, fields)
        self.schedule.count_settled(status)
        if unit.key is None:
            self.schedule.settle(unit.name, status)
            return
        if self.loop is not None and unit.name in self.loop.body:  # a revision's unit
            loop = self.loop
            self.durable.after_durable(lambda: loop.unit_settled(unit.name, status, tolerable))
            return
        self.schedule.instances_left[unit.name] -= 1
        if self.schedule.instances_left[unit.name] == 0:
            # the aggregate is written once every instance's record is durable
            keys = self.schedule.instances[unit.name]
            self.durable.after_durable(lambda: self._fold(unit.name, keys))


def _did(status: str | None) -> str:
    return {FAILED: "failed", SKIPPED: "was skipped", None: "did not run"}.get(
        status, f"settled as {status}"
    )

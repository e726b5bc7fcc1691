"""An attempt's outcome, on the scheduling thread: its start, its end as the
worker reported it (passed, failed, timed out, interrupted, lost), a retry
under the task's policy or a settled unit with its record, event and counts,
and a unit restored from the task cache. A mapped task's last instance folds
its aggregate (:mod:`._readiness`)."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from crucible.core import structs
from crucible.core.plan import Task
from crucible.run.engine import _control as control
from crucible.run.engine._failures import compose_note, exit_text, failure_record, with_reason
from crucible.run.engine._parts import Parts, Room
from crucible.run.engine._readiness import Readiness
from crucible.run.engine._retry_when import apply_retry_when, last_attempt
from crucible.run.engine._units import FAILED, INTERRUPTED, PASSED, Finished, Unit
from crucible.run.executors._usage import USAGE_FIELDS
from crucible.run.session import events
from crucible.stage import RESULT_FORMAT

__all__ = ["Attempts"]


class Attempts(Room):
    def __init__(self, parts: Parts) -> None:
        super().__init__(parts)
        #: set by the dispatcher once built (it needs note_failure from here)
        self.readiness: Readiness

    def _rel(self, path: Path) -> str:
        return str(path.relative_to(self.state))

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
            events.task_finished(
                task=unit.name,
                key=unit.key,
                attempt=unit.attempt,
                status=status,
                note=note,
                exit_code=exit_code,
                duration=None if duration is None else round(duration, 6),
                measured=fields,
            )
        )

    def settle_cached(self, unit: Unit, result: dict[str, Any]) -> None:
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

    def _workspace_rel(self, unit: Unit) -> str:
        """``work/<task>[/<escaped key>]``, as the layout spells it relative to
        STATE (an unmapped task's without building its Path: once per start;
        its name is a plan task's, checked when the plan's view was built)."""
        if unit.key is None:
            return "work/" + unit.name
        return self._rel(self.layout.work_dir(unit.name, unit.key))

    def started(self, unit: Unit, pid: int, worker: str | None = None) -> None:
        unit.pid = pid
        if unit.first_start is None:
            unit.first_start = time.monotonic()
        self.schedule.running += 1
        self.log.emit(
            events.task_started(
                task=unit.name,
                key=unit.key,
                attempt=unit.attempt,
                pid=pid,
                workspace=self._workspace_rel(unit),
                item=self._item_preview(unit),
                worker=worker,  # a Dask executor's
            )
        )

    def _item_preview(self, unit: Unit) -> str | None:
        """``item``: a short preview of an instance's item (report, timeline), on
        its first attempt only (later attempts have the same item)."""
        if unit.key is None or unit.attempt > 1:
            return None
        # said once: a started instance's preview is not kept (a million of them)
        return self.fanouts.take_preview(unit.name, unit.index)

    def exited(self, unit: Unit, result: dict[str, Any]) -> None:
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
                self.state_dir.remove_result(unit.name, unit.key, durable=False)
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
            self.fail_unit(
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
                f"{how} after timeout {task.timeout}s", None, finished.log, finished.tail
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
            retry = self._retry_when(
                task,
                retry,
                last_attempt(
                    attempt=unit.attempt, exit_code=finished.code, timed_out=timed_out,
                    duration=finished.duration, tail=finished.tail,
                ),
            )  # fmt: skip
            if retry.why_not is not None and note is not None:
                note = with_reason(note, retry.why_not)
        if retry.delay is not None:
            # Remove this attempt's record so an interruption during the backoff
            # leaves the unit unsettled (a resume runs it again).
            self.state_dir.remove_result(unit.name, unit.key, durable=False)
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
                RESULT_FORMAT,
                unit.name,
                unit.key,
                note or "",
                log=finished.log,
                tail=finished.tail,
                exit_code=finished.code,
            )
            if all(k in fields for k in USAGE_FIELDS):  # it ran (a timeout): what it cost
                failed["usage"] = {k: fields[k] for k in USAGE_FIELDS}
            self.state_dir.write_result(failed, durable=False)
            self.durable.wrote(unit.name, unit.key)
        elif retry.why_not is not None:  # the note says why the policy stopped here
            self.state_dir.amend_result(
                unit.name, key=unit.key, status=status, note=note or "", durable=False
            )
            self.durable.wrote(unit.name, unit.key)
        tolerable = status == FAILED and control.tolerates(task, finished.code, timed_out)

        def settle(refusal: str | None = None) -> None:
            nonlocal status, note
            if refusal is not None:  # accounted: its output refused (export.md §5)
                status, note = FAILED, self._refused(unit, refusal)
            if status == FAILED and not tolerable:
                self.note_failure(unit, finished.log)
            self._settle_unit(
                unit,
                status,
                note,
                exit_code=finished.code,
                duration=finished.duration,
                fields=fields,
                tolerable=tolerable,
            )

        if self.accounting is None:
            settle()
            return
        # an accounted run: the unit settles once its observation is applied, in
        # its epoch's starts order (docs/spec/export.md §5)
        reason = "timeout" if finished.stop_reason == "timeout" else "exit"
        if status != PASSED and finished.code == 0 and reason == "exit":
            reason = "capture"
        kind = "evaluated" if status == PASSED else "failed"
        output = None if record is None else record.get("output")
        self.accounting.observed(unit, kind, finished.code, reason, settle, output=output)

    def _refused(self, unit: Unit, note: str) -> str:
        """An accounted unit whose output the proof refused: its record fails."""
        self.state_dir.amend_result(
            unit.name, key=unit.key, status=FAILED, note=note, durable=False
        )
        self.durable.wrote(unit.name, unit.key)
        return note

    def unsettle(self, unit: Unit) -> None:
        """An accounted unit held at shutdown, its observation never applied: its
        record goes, so a resume runs it again (docs/spec/export.md §5)."""
        self.state_dir.remove_result(unit.name, unit.key, durable=True)

    def _retry_when(self, task: Task, retry: control.Retry, last: dict[str, Any]) -> control.Retry:
        """The task's ``retry.when`` over the failed attempt, asked only of a retry
        the rest of its policy allows (crucible.run.engine._retry_when)."""
        return apply_retry_when(
            task, retry, last, cancelled=lambda: self.signals.received is not None
        )

    def worker_lost(self, unit: Unit, worker: str) -> None:
        """A transient failure: retried under the task's retries (whatever its
        ``on_exit``: there is no exit code), else a failure of the unit that no
        exit-code tolerance covers (docs/spec/run.md, Executors)."""
        if unit.pid is not None:
            self.schedule.running -= 1
            unit.pid = None
        note = f"worker lost: {worker}"
        task = self.graph.tasks[unit.name]
        if task.retry is not None:  # no exit code: on_exit does not apply
            task = structs.replace(task, retry=structs.replace(task.retry, on_exit=None))
        retry = control.Retry(None)
        if self.signals.received is None:
            retry = control.next_retry(
                task, unit.attempt, timed_out=False, exit_code=None, retryable=True,
                backoff=self.options.backoff,
                elapsed=None if unit.first_start is None else time.monotonic() - unit.first_start,
            )  # fmt: skip
            last = last_attempt(
                attempt=unit.attempt, exit_code=None, timed_out=False, duration=None, tail="",
                lost=True,
            )  # fmt: skip
            retry = self._retry_when(task, retry, last)
        if retry.delay is None:
            self.fail_unit(unit, note if retry.why_not is None else f"{note}; {retry.why_not}")
            return
        self.log.emit(
            events.task_finished(
                task=unit.name, key=unit.key, attempt=unit.attempt, status=FAILED, note=note,
                retry=True,
            )
        )  # fmt: skip
        unit.attempt += 1
        self.schedule.retry_later(unit, retry.delay)

    def fail_unit(
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
        self.state_dir.write_result(
            failure_record(
                RESULT_FORMAT, unit.name, unit.key, note, log=log, tail=tail,
                exit_code=exit_code,
            ),
            durable=False,
        )  # fmt: skip
        self.durable.wrote(unit.name, unit.key)
        task = self.graph.tasks[unit.name]
        # exit codes tolerate a task's own exit only, not a unit that could not
        # be staged, started or captured
        tolerable = control.tolerates(task, None, False)

        def settle(_refusal: str | None = None) -> None:
            if not tolerable:
                self.note_failure(unit, log)
            self._settle_unit(unit, FAILED, note, exit_code=exit_code, tolerable=tolerable)

        if self.accounting is None:
            settle()
        else:  # accounted: an attempt that never ran (docs/spec/export.md §4)
            self.accounting.observed(unit, "acquisition", exit_code, "acquisition", settle)

    def note_failure(self, unit: Unit, log: str | None) -> None:
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
                self.state_dir.update_record(unit.name, unit.key, tolerated=True, durable=False)
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
            self.durable.after_durable(lambda: self.readiness.fold(unit.name, keys))

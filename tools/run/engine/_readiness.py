"""Readiness: what happens to a task once everything it waits for settled.

It is skipped (a needed task did not pass), settled by its condition,
expanded into its instances (a map or a matrix, resumed instances kept), or
queued as a unit; a mapped task's aggregate is folded once its last instance
settled. Called by the scheduling state (:mod:`._schedule`) and the attempts'
outcomes (:mod:`._attempts`); its decisions are recorded, logged and counted
here, on the scheduling thread."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from crucible.core.errors import CrucibleError
from crucible.run.engine import _control as control
from crucible.run.engine._matrix import FanoutSkipped
from crucible.run.engine._parts import Parts, Room
from crucible.run.engine._selection import NOT_SELECTED
from crucible.run.engine._units import FAILED, PASSED, SKIPPED, Unit
from crucible.run.session import events

__all__ = ["Readiness"]


class Readiness(Room):
    def __init__(self, parts: Parts, note_failure: Callable[[Unit, str | None], None]) -> None:
        super().__init__(parts)
        #: a unit failed: listed for the last line (crucible.run.engine._attempts)
        self.note_failure = note_failure

    def not_selected(self) -> None:
        """--target: every unsettled task outside the selection is recorded as not
        selected (in the log only: no record, so a later resume runs it)."""
        if self.schedule.selected is None:
            return
        for name in self.graph.order:
            if name not in self.schedule.selected and name not in self.schedule.status:
                self.log.emit(
                    events.task_finished(
                        task=name,
                        status=NOT_SELECTED,
                        note="not selected: not a --target or an ancestor of one",
                    )
                )

    def on_ready(self, name: str) -> None:
        """Every task ``name`` waits for has settled: skip it, expand it, or queue it."""
        if self.schedule.selected is not None and name not in self.schedule.selected:
            return  # recorded as not selected at the start
        if self.loop is not None:  # scored loop: the body runs by revisions
            if name in self.loop.body:
                self.loop.maybe_start()
                return
            if (note := self.loop.skip_note(name)) is not None:
                self.settle_unrun(name, SKIPPED, note)
                return
        task = self.graph.tasks[name]
        if task.join == "all":
            for dep in task.needs:
                if task.epilogue and not self.graph.tasks[dep].epilogue:
                    # An epilogue runs whatever the regular tasks did; its needs
                    # on them only order it (stage stages them as settled).
                    continue
                dep_status = self.schedule.status.get(dep)
                if dep_status != PASSED:
                    note = f"skipped: needs {dep!r}, which {_did(dep_status)}"
                    self.settle_unrun(name, SKIPPED, note)
                    return
        if task.fans_out:
            self._expand(name)
            return
        if task.when is not None and self._condition_settles(name, None, control.NO_ITEM):
            return
        self.schedule.ready.append(Unit(name, None))

    def _condition_settles(self, name: str, key: str | None, item: Any) -> bool:
        """Evaluate the unit's ``when``; settle it (skipped, or failed on an error)
        and say so, or return False when it runs."""
        task = self.graph.tasks[name]
        run = (
            control.run_status(self.graph.tasks, self.schedule.status, self.schedule.tolerated)
            if task.epilogue
            else None
        )
        decided = self.control.decide(task, self.schedule.status, item=item, run=run)
        if decided is None:
            return False
        status, note = decided
        if status == FAILED:  # a condition error: listed, and --fail-fast stops
            self.note_failure(Unit(name, key), None)
        if key is None:
            self.settle_unrun(name, status, note)
        else:
            # An instance that never had an attempt: no attempt number in its event.
            self.state_dir.record_settled(name, status=status, note=note, key=key, durable=False)
            self.durable.wrote(name, key)
            self.log.emit(events.task_finished(task=name, key=key, status=status, note=note))
            self.schedule.count_settled(status)
            self.schedule.instances_left[name] -= 1
            if self.schedule.instances_left[name] == 0:
                keys = self.schedule.instances[name]
                self.durable.after_durable(lambda: self.fold(name, keys))
        return True

    def _refuse_instance(self, name: str, key: str, note: str) -> None:
        """An accounted instance whose selection was refused: failed, never started."""
        self.note_failure(Unit(name, key), None)
        self.state_dir.record_settled(name, status=FAILED, note=note, key=key, durable=False)
        self.durable.wrote(name, key)
        self.log.emit(events.task_finished(task=name, key=key, status=FAILED, note=note))
        self.schedule.count_settled(FAILED)
        self.schedule.instances_left[name] -= 1
        if self.schedule.instances_left[name] == 0:
            keys = self.schedule.instances[name]
            self.durable.after_durable(lambda: self.fold(name, keys))

    def settle_unrun(self, name: str, status: str, note: str) -> None:
        """A task settled without running: skipped, failed by its condition, or
        its map source unreadable (a mapped task gets an aggregate record with no
        instances). Recorded, logged, counted, and its consumers woken."""
        self.state_dir.record_settled(name, status=status, note=note, durable=False)
        self.durable.wrote(name, None)
        self.log.emit(events.task_finished(task=name, status=status, note=note))
        self.schedule.count_settled(status)
        self.schedule.settle(name, status)

    def _keys_of(self, name: str) -> list[str]:
        """A mapped task's instance keys, as its own expansion finds them (an
        accounted selection reserves every consumer's children at once)."""
        if self.fanouts.listed(name):
            return self.fanouts.keys(name)
        return [key for key, _ in self.state_dir.map_items(name)]

    def _expand(self, name: str) -> None:
        conditional = self.graph.tasks[name].when is not None
        item_of: dict[str, Any] = {}
        try:
            if self.fanouts.listed(name):
                keys = self.fanouts.keys(name)
                if conditional:  # a condition may read `item`
                    item_of = self.fanouts.items(name)
            else:
                items = self.state_dir.map_items(name)
                keys = [key for key, _ in items]
                self.fanouts.remember_previews(name, items)
                if conditional:
                    item_of = dict(items)
                del items
        except FanoutSkipped as exc:  # join = "all" over a mapped task's fold
            self.settle_unrun(name, SKIPPED, exc.message)
            return
        except CrucibleError as exc:
            if self.fanouts.listed(name):
                note = f"cannot expand the fan-out: {exc}"
            else:
                ref = self.graph.tasks[name].map_ref
                note = f"cannot read the map source {ref.text if ref else ''}: {exc}"
            self.settle_unrun(name, FAILED, note)
            return
        # an accounted run: the selection reserving these instances (export.md §5)
        refusal = (
            None
            if self.accounting is None
            else self.accounting.reserve(name, keys, keys_of=self._keys_of)
        )
        if not keys:
            self.fold(name, keys)
            return
        self.schedule.counts.total += len(keys) - 1
        self.schedule.instances[name] = keys
        # Instances settled in an earlier session keep their records (resume):
        # one read of the task's packed records.
        recorded = self.state_dir.load_all(name)
        pending: list[int] = []  # indexes into keys
        for index, key in enumerate(keys):
            record = recorded.get(key)
            if record is not None:
                self.schedule.count_settled(record.get("status", FAILED))
                continue
            pending.append(index)
        del recorded
        self.schedule.instances_left[name] = len(pending)
        if not pending:
            self.fold(name, keys)
            return
        for index in pending:
            key = keys[index]
            if refusal is not None:  # refused children never start
                self._refuse_instance(name, key, refusal)
                continue
            # A false condition settles its instance at once (the last one folds).
            if conditional and self._condition_settles(name, key, item_of[key]):
                continue
            self.schedule.ready.append(Unit(name, key, index))

    def fold(self, name: str, keys: list[str]) -> None:
        record = self.state_dir.settle_fold(name, keys, durable=False)
        self.durable.wrote(name, None)
        status = record.get("status", FAILED)
        task = self.graph.tasks[name]
        if not keys and task.skips_when_empty:  # issue 32: Tekton's empty fan-out
            status, note = SKIPPED, 'skipped: the fan-out has no instances (on_empty = "skip")'
            record = control.amend_record(
                self.layout.result_path(name), status=status, note=note, durable=False
            )  # rides the group commit: self.durable.wrote above
        if task.when is not None and (verdict := control.fold_verdict(record)) is not None:
            status, note = verdict  # instances skipped by their condition are no failure
            record = control.amend_record(
                self.layout.result_path(name), status=status, note=note, durable=False
            )  # rides the group commit (issue 14): self.durable.wrote above
        if status == FAILED and control.tolerates_fold(task, self.state_dir, record):
            control.mark_tolerated(self.layout.result_path(name), durable=False)
            self.schedule.tolerated.add(name)
        self.log.emit(
            events.task_finished(
                task=name,
                status=status,
                note=record.get("note"),
                instances=len(keys),
                tolerated=True if name in self.schedule.tolerated else None,
            )
        )
        if not keys:
            self.schedule.count_settled(status)
        self.schedule.settle(name, status)


def _did(status: str | None) -> str:
    return {FAILED: "failed", SKIPPED: "was skipped", None: "did not run"}.get(
        status, f"settled as {status}"
    )

"""One run's state directory as stage knows it: its layout, its records and the
staging of its units, over one plan whose view is built once.

A dispatcher builds one :class:`StateDir` per run, before it forks its workers
(they inherit it), and passes it to every part of the run that reads or writes
records or stages a unit; each call is typed, and each hands stage the plan's
view, so nothing is checked or looked up again (every stage function behind it
takes that view: crucible.stage._plan.PlanView). ``crucible-stage`` builds one
per command (crucible.stage.commands.load_plan).
The same plan over another directory (a dry run's shadow state) is
:meth:`StateDir.over`, sharing the view.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from crucible.core.errors import InputRefused
from crucible.core.plan import Plan
from crucible.stage import _capture, _inputs, _prompt, _records
from crucible.stage._files import FILES_RUN_MAX
from crucible.stage._layout import StateLayout
from crucible.stage._plan import PlanView, TaskView, build_view
from crucible.stage._records import (
    STATUSES,
    amend_record,
    base_record,
    check_key,
    checked_extra,
    write_record,
)
from crucible.stage._share import Unit
from crucible.stage._store import Records

__all__ = ["StateDir"]


class StateDir:
    """``state`` holding a run of ``plan`` (its JSON object). ``checked``: the
    plan passed the compiler's checks, so its view is built without checking
    each task again (crucible.stage._plan.build_view)."""

    def __init__(
        self,
        plan: dict[str, Any],
        state: Path,
        *,
        checked: bool = False,
        model: Plan | None = None,
    ) -> None:
        self.plan = plan
        self.state = state
        self.layout = StateLayout(state)
        #: the plan's view, built here, once (crucible.stage._plan.PlanView), over
        #: its typed model (``model``: already built, by a dispatcher's admission)
        self.view: PlanView = build_view(plan, checked=checked, model=model)
        if self.view.order:
            self.view.ancestors(self.view.order[0])  # builds its position map before a fork

    @classmethod
    def _of(cls, pv: PlanView, state: Path) -> StateDir:
        made = cls.__new__(cls)
        made.plan = pv.plan
        made.state = state
        made.layout = StateLayout(state)
        made.view = pv
        return made

    def over(self, state: Path) -> StateDir:
        """The same plan (and view) over another state directory."""
        return StateDir._of(self.view, state)

    def task(self, name: str) -> TaskView:
        """The plan's task ``name`` as stage reads it (refused when unknown)."""
        return self.view.task(name)

    # ---------------------------------------------------------------- records

    def load_result(self, task: str, key: str | None = None) -> dict[str, Any] | None:
        """The settled record of ``task`` (or its instance ``key``), or None."""
        return _records.load_result(self.state, task, key)

    def load_all(self, task: str) -> Records:
        """Every instance record of a mapped ``task``, by key."""
        return _records.load_all(self.state, task)

    def write_result(self, record: dict[str, Any], *, durable: bool = True) -> Path:
        """Write ``record`` where its task and key say; returns the file written."""
        return _records.write_result(self.state, record, durable=durable)

    def write_result_where(
        self, record: dict[str, Any], *, durable: bool = True
    ) -> tuple[str, str]:
        """As :meth:`write_result`; returns what to fsync (the file, its dir)."""
        return _records.write_result_where(self.state, record, durable=durable)

    def remove_result(self, task: str, key: str | None = None, *, durable: bool = True) -> None:
        _records.remove_result(self.state, task, key, durable=durable)

    def remove_results(self, task: str, keys: list[str] | None, *, durable: bool = True) -> None:
        """The instance records ``keys`` of ``task`` (None: all of them)."""
        _records.remove_results(self.state, task, keys, durable=durable)

    def update_record(
        self, task: str, key: str | None = None, *, durable: bool = True, **members: Any
    ) -> dict[str, Any]:
        """Set ``members`` in a settled record and rewrite it atomically."""
        return _records.update_record(self.state, task, key, durable=durable, **members)

    def amend_result(
        self,
        task: str,
        *,
        key: str | None = None,
        status: str,
        note: str,
        retryable: bool = False,
        extra: dict[str, Any] | None = None,
        durable: bool = True,
    ) -> dict[str, Any]:
        """Change a settled record's verdict (e.g. dispatch failing an evaluate
        task on its verdict) and rewrite it atomically; everything else is kept.
        ``extra`` members are merged into the record's ``extra``."""
        check_key(self.view, task, key)
        record = _records.load_result(self.state, task, key)
        if record is None:
            raise InputRefused(f"task {task!r} key {key!r} has no record to amend")
        record = amend_record(record, status=status, note=note, retryable=retryable, extra=extra)
        return write_record(self.state, record, durable=durable)

    def record_settled(
        self,
        task: str,
        *,
        status: str,
        note: str,
        key: str | None = None,
        extra: dict[str, Any] | None = None,
        durable: bool = True,
    ) -> dict[str, Any]:
        """Write a record without capture (a skipped task, a timeout, a kill),
        with the notes of any held file a consumer changed: it reads what the
        inputs writer staged and writes a record, as capture does.

        For a mapped task without ``key`` (one that settled before it expanded:
        a skip, an unreadable map source) this is its aggregate record with no
        instances: ``keys: []`` and zero counts, with the given status and note."""
        aggregate = key is None and self.view.task(task).map is not None
        if not aggregate:
            check_key(self.view, task, key)
        record = base_record(task, key, status, note)
        # an aggregate has no workspace of its own; a timed-out or killed
        # consumer's (default) workspace is checked as capture checks one
        # (docs/spec/inputs.md 3.4): no notes when it was never staged
        tampering = (
            [] if aggregate else self.check_inputs(task, self.layout.work_dir(task, key), key=key)
        )
        if tampering:
            record["note"] = "; ".join([note, *tampering]) if note else "; ".join(tampering)
        if aggregate:
            record["keys"] = []
            record["counts"] = dict.fromkeys(STATUSES, 0)
        ex = checked_extra(extra)
        if ex is not None:
            record["extra"] = ex
        return write_record(self.state, record, durable=durable)

    def settle_fold(self, task: str, keys: list[str], *, durable: bool = True) -> dict[str, Any]:
        """A mapped task's aggregate record over its instances ``keys``."""
        return _records.settle_fold(self.view, self.state, task, keys, durable=durable)

    # ---------------------------------------------------------------- staging

    def map_items(self, task: str) -> list[tuple[str, Any]]:
        """A mapped task's (key, item) pairs, in item order."""
        return _inputs.map_items(self.view, self.state, task)

    def stage_inputs(
        self,
        task: str,
        workspace: Path,
        *,
        key: str | None = None,
        files_max: int = FILES_RUN_MAX,
        in_place: bool = False,
    ) -> _inputs.StagedInputs:
        """Lay down ``workspace/inputs/`` (crucible.stage._inputs.stage_inputs)."""
        return _inputs.stage_inputs(
            self.view, self.state, task, workspace, key=key, files_max=files_max,
            in_place=in_place,
        )  # fmt: skip

    def refresh_inputs(
        self,
        task: str,
        workspace: Path,
        *,
        key: str | None = None,
        units: Sequence[Unit] | None = None,
    ) -> list[str]:
        """Just before a staged task starts (crucible.stage._inputs.refresh_inputs)."""
        return _inputs.refresh_inputs(self.view, self.state, task, workspace, key=key, units=units)

    def check_inputs(
        self,
        task: str,
        workspace: Path,
        *,
        key: str | None = None,
        units: Sequence[Unit] | None = None,
    ) -> list[str]:
        """Once the task's processes are gone (crucible.stage._inputs.check_inputs)."""
        return _inputs.check_inputs(self.view, self.state, task, workspace, key=key, units=units)

    def render_prompt(self, task: str, workspace: Path, *, key: str | None = None) -> str:
        """An agent task's prompt (crucible.stage._prompt.render_prompt)."""
        return _prompt.render_prompt(self.view, self.state, task, workspace, key=key)

    def capture(
        self,
        task: str,
        workspace: Path,
        *,
        output_file: Path,
        exit_code: int,
        key: str | None = None,
        attempt: int = 1,
        emit_cap: int = _capture.EMIT_CAP_DEFAULT,
        extra: dict[str, Any] | None = None,
        files_max: int = FILES_RUN_MAX,
        output_name: str | None = None,
        held_notes: list[str] | None = None,
        write: bool = True,
        empty_workspace: bool = False,
    ) -> dict[str, Any]:
        """Settle one attempt and return its record (crucible.stage._capture.capture)."""
        return _capture.capture(
            self.view, self.state, task, workspace, output_file=output_file,
            exit_code=exit_code, key=key, attempt=attempt, emit_cap=emit_cap, extra=extra,
            files_max=files_max, output_name=output_name, held_notes=held_notes, write=write,
            empty_workspace=empty_workspace,
        )  # fmt: skip

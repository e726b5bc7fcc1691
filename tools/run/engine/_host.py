"""What a scored loop (:mod:`crucible.run.loop._engine`) may ask of the engine
that runs it: a small protocol, so the loop never reaches into the
dispatcher's state, and :class:`EngineHost`, its one implementation, answering
from a session's scheduling state, durability gate and stop signals (the
dispatcher, :mod:`crucible.run.engine._dispatcher`, builds one for a plan with
a loop)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from pathlib import Path
from typing import Any, Protocol

from crucible.core.plan import Plan
from crucible.run.engine._control import Control
from crucible.run.engine._durable import DurableGate
from crucible.run.engine._graph import TaskGraph
from crucible.run.engine._schedule import Schedule
from crucible.run.engine._signals import StopSignals
from crucible.run.engine._units import Unit
from crucible.run.session._log import SessionLog
from crucible.stage import StateDir, StateLayout

__all__ = ["EngineHost", "LoopHost"]


class LoopHost(Protocol):
    plan: dict[str, Any]
    #: the plan's typed model (crucible.core.plan)
    model: Plan
    state: Path
    layout: StateLayout
    log: SessionLog
    graph: TaskGraph
    control: Control
    #: the state dir's records and staging (crucible.stage.StateDir)
    state_dir: StateDir

    @property
    def status(self) -> Mapping[str, str]:
        """Each settled task's status (read only)."""
        ...

    @property
    def selected(self) -> Set[str] | None:
        """The tasks this session may run (None: all)."""
        ...

    def select_also(self, names: Set[str]) -> None:
        """--target: widen the selection (a body task brings the whole loop)."""
        ...

    @property
    def stopping(self) -> bool:
        """A signal or --fail-fast stopped the run."""
        ...

    @property
    def in_turns(self) -> bool:
        """Inside the dispatcher's turns, where a write waits for its batch."""
        ...

    def after_durable(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once every record written so far is durable."""
        ...

    def wrote(self, task: str, key: str | None) -> None:
        """A record written without fsync: the next batch makes it durable."""
        ...

    def settle(self, name: str, status: str) -> None:
        """``name`` settled: its consumers wake once its record is durable."""
        ...

    def count_settled(self, status: str) -> None:
        """One unit settled with ``status``, for the counts."""
        ...

    def add_units(self, n: int) -> None:
        """``n`` more units (negative: fewer) to run than counted so far."""
        ...

    def note_failed(self, label: str) -> None:
        """A failed unit the run's last line may name (counted failed)."""
        ...

    def queue(self, unit: Unit) -> None:
        """``unit`` is ready to run."""
        ...


class EngineHost:
    """:class:`LoopHost` over one session's parts: the loop's questions answered by
    the scheduling state (crucible.run.engine._schedule), the durability gate
    (._durable) and the stop signals (._signals)."""

    def __init__(
        self,
        *,
        plan: dict[str, Any],
        model: Plan,
        state_dir: StateDir,
        log: SessionLog,
        graph: TaskGraph,
        control: Control,
        schedule: Schedule,
        durable: DurableGate,
        signals: StopSignals,
    ) -> None:
        self.plan = plan
        self.model = model
        self.state_dir = state_dir
        self.state = state_dir.state
        self.layout = state_dir.layout
        self.log = log
        self.graph = graph
        self.control = control
        self._schedule = schedule
        self._durable = durable
        self._signals = signals

    @property
    def status(self) -> Mapping[str, str]:
        return self._schedule.status

    @property
    def selected(self) -> Set[str] | None:
        return self._schedule.selected

    def select_also(self, names: Set[str]) -> None:
        if self._schedule.selected is not None:
            self._schedule.selected = self._schedule.selected | set(names)

    @property
    def stopping(self) -> bool:
        return self._signals.received is not None or self._schedule.fail_fast_by is not None

    @property
    def in_turns(self) -> bool:
        return self._durable.gating

    def after_durable(self, fn: Callable[[], None]) -> None:
        self._durable.after_durable(fn)

    def wrote(self, task: str, key: str | None) -> None:
        self._durable.wrote(task, key)

    def settle(self, name: str, status: str) -> None:
        self._schedule.settle(name, status)

    def count_settled(self, status: str) -> None:
        self._schedule.count_settled(status)

    def add_units(self, n: int) -> None:
        self._schedule.counts.total += n

    def note_failed(self, label: str) -> None:
        self._schedule.counts.failed += 1
        self._schedule.note_failure(label, None, fail_fast=False)

    def queue(self, unit: Unit) -> None:
        self._schedule.ready.append(unit)

"""What a scored loop (:mod:`crucible.run.loop._engine`) may ask of the engine
that runs it: a small protocol, so the loop never reaches into the
dispatcher's state. The dispatcher (:mod:`crucible.run.engine._dispatcher`)
implements it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from pathlib import Path
from typing import Any, Protocol

from crucible.run.engine._control import Control
from crucible.run.engine._graph import TaskGraph
from crucible.run.engine._units import Unit
from crucible.run.session._log import SessionLog
from crucible.stage import StateDir, StateLayout

__all__ = ["LoopHost"]


class LoopHost(Protocol):
    plan: dict[str, Any]
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

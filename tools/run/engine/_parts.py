"""The parts of one dispatcher session that its rooms share: the plan and its
graph, the state dir, the session log, the scheduling state, the durability
gate, the stop signals, control flow, fan-outs and a scored loop. Built once
by the dispatcher (:mod:`crucible.run.engine._dispatcher`), read by
readiness (:mod:`._readiness`) and the attempts' outcomes (:mod:`._attempts`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from crucible.core.structs import dataclass
from crucible.run._options import RunOptions
from crucible.run.engine._control import Control
from crucible.run.engine._durable import DurableGate
from crucible.run.engine._graph import TaskGraph
from crucible.run.engine._matrix import Fanouts
from crucible.run.engine._schedule import Schedule
from crucible.run.engine._signals import StopSignals
from crucible.run.session._log import SessionLog

if TYPE_CHECKING:  # imported only for a plan with a loop, or with [workflow.limits]
    from crucible.run.accounting._book import Accounting
    from crucible.run.loop._engine import LoopRun
    from crucible.stage import StateDir, StateLayout

__all__ = ["Parts", "Room"]


@dataclass
class Parts:
    plan: dict[str, Any]
    options: RunOptions
    state: Path
    layout: StateLayout
    log: SessionLog
    #: the state dir's records and staging, over the plan's view (built once per run)
    state_dir: StateDir
    graph: TaskGraph
    schedule: Schedule
    durable: DurableGate
    signals: StopSignals
    control: Control
    fanouts: Fanouts
    #: a scored loop (docs/spec/loop.md), for a plan with one
    loop: LoopRun | None = None
    #: an accounted plan's accounting (crucible.run.accounting._book.Accounting)
    accounting: Accounting | None = None


class Room(Parts):
    """A room of the engine (readiness, the attempts' outcomes): the session's
    parts as its own attributes, shared with every other room (the same
    objects, not copies). Compared and hashed as itself: a room is no value."""

    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def __init__(self, parts: Parts) -> None:
        self.__dict__.update(vars(parts))

"""What a node or worker away from the dispatcher needs to build the run's
UnitRunner: one spec for the executors that send units to a cluster (a Dask
worker's, crucible.run.executors.dask._executor._Spec; a SLURM array
element's, crucible.run.executors.slurm._node.NodeSpec), sent once per run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from crucible.core.plan import Plan
from crucible.core.structs import dataclass, replace

if TYPE_CHECKING:
    from crucible.run._options import RunOptions
    from crucible.run.executors._slots import Slots
    from crucible.run.executors._unit import UnitRunner

__all__ = ["RunnerSpec"]

_Runner = TypeVar("_Runner", bound="UnitRunner")


@dataclass(frozen=True)
class RunnerSpec:
    """The run a node's UnitRunner serves: its plan (the JSON object a node's
    StateDir is built from, and the typed model), options, emit cap, the host
    environment tasks are handed, and the pack's directory."""

    run_id: str
    plan: dict[str, Any]
    #: the plan's typed model (crucible.core.plan)
    model: Plan
    #: the run's options, every path absolute (a node's working directory is its own)
    options: RunOptions
    emit_cap: int
    environ: dict[str, str]
    pack_dir: str

    def runner(self, cls: type[_Runner], slots: Slots) -> _Runner:
        """The run's unit runner of class ``cls`` on this node, taking ``slots``;
        without ``--follow``: the node's own stdout is nobody's terminal."""
        return cls(
            plan=self.plan,
            model=self.model,
            options=replace(self.options, follow=False),
            emit_cap=self.emit_cap,
            environ=self.environ,
            slots=slots,
            pack_dir=self.pack_dir,
        )

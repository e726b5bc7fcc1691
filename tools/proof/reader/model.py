"""The reader's own logical state: instances, attempts, stages (workflow.md §4, §6).

Built only from validated inputs and the reader's derivations; serialized here
to the exact canonical forms so control files can be measured and compared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from crucible.core import canon
from crucible.proof import layout

__all__ = ["Attempt", "Instance", "StageDef", "set_json"]

PINS = tuple(layout.ATTEMPT_FILES)


@dataclass(slots=True)
class StageDef:
    name: str
    from_stage: str | None
    fields: list[str] | None
    admit_max_bytes: int | None
    pointer: str
    cardinality: str
    consumers: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Attempt:
    number: int
    state: str
    failure: str | None
    retry: dict[str, Any] | None
    pins: dict[str, str | None]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "number": self.number,
            "state": self.state,
            "failure": self.failure,
            "retry": self.retry,
        }
        out.update(self.pins)
        return out


@dataclass(slots=True)
class Instance:
    id: str
    stage: str
    parent: dict[str, Any] | None
    selection: dict[str, Any] | None
    case_digest: str | None
    reservation: int
    #: state/failure while the instance has no attempt
    base_state: str = "interrupted"
    base_failure: str | None = None
    attempts: list[Attempt] = field(default_factory=list)
    size: int = 0

    @property
    def state(self) -> str:
        return self.attempts[-1].state if self.attempts else self.base_state

    @property
    def failure(self) -> str | None:
        return self.attempts[-1].failure if self.attempts else self.base_failure

    @property
    def derived_failure(self) -> str | None:
        """projection-invalid / admission-refused derived at reservation, else None."""
        if not self.attempts and self.base_failure in ("projection-invalid", "admission-refused"):
            return self.base_failure
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "stage": self.stage,
            "parent": self.parent,
            "selection": self.selection,
            "caseDigest": self.case_digest,
            "state": self.state,
            "failure": self.failure,
            "attempts": [a.to_json() for a in self.attempts],
        }

    def measure(self) -> int:
        self.size = len(canon.dumps(self.to_json()))
        return self.size


def set_json(stage: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    return {"setVersion": 1, "stage": stage, "records": records}

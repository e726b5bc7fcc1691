"""The reader's own logical state: instances, attempts, stages (workflow.md §4, §6).

Built only from validated inputs and the reader's derivations; serialized here
to the exact canonical forms so control files can be measured and compared.

Control structures have fixed ASCII member names and no floats, so orjson with
sorted keys yields their RFC 8785 bytes exactly (canonical-json.md; the one
divergence, keys at or above U+E000, cannot occur here). Sizes are cached per
attempt, so a changed instance costs O(1) serialization, not O(attempts).

``PINS``, ``control_dumps``, ``Attempt`` and ``Instance`` repeat the writer's
(writer/_state.py) on purpose: the reader imports no writer code (DESIGN.md), so a
defect in one side's records cannot hide the same defect in the other's verdicts.
"""

from __future__ import annotations

from typing import Any

import orjson

from crucible.core.structs import dataclass, field
from crucible.proof import layout

__all__ = ["PINS", "Attempt", "Instance", "StageDef", "control_dumps", "set_json"]

PINS = tuple(layout.ATTEMPT_FILES)


def control_dumps(value: Any) -> bytes:
    """Canonical bytes of a control structure built by the reader (ASCII keys, no floats)."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


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

    def size(self) -> int:
        return len(control_dumps(self.to_json()))


# independent of the writer on purpose: a copy of writer/_state.py's Instance record; the
# reader reaches its verdict from the bundle and the spec alone and imports no writer code
# (DESIGN.md, docs/spec/workflow.md §10); tests/proof/reader/test_independence.py keeps it so.
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
    #: summed sizes of all attempts but the last (they never change again)
    sealed: int = 0
    sealed_count: int = 0

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

    def _head(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "stage": self.stage,
            "parent": self.parent,
            "selection": self.selection,
            "caseDigest": self.case_digest,
            "state": self.state,
            "failure": self.failure,
            "attempts": [],
        }

    def to_json(self) -> dict[str, Any]:
        out = self._head()
        out["attempts"] = [a.to_json() for a in self.attempts]
        return out

    def measure(self) -> int:
        """Canonical size of ``to_json()``, without re-serializing sealed attempts."""
        n = len(self.attempts)
        while self.sealed_count < n - 1:
            self.sealed += self.attempts[self.sealed_count].size()
            self.sealed_count += 1
        total = len(control_dumps(self._head()))
        if n:
            total += self.sealed + self.attempts[-1].size() + (n - 1)
        self.size = total
        return total


def set_json(stage: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    return {"setVersion": 1, "stage": stage, "records": records}

"""The writer's logical state: active execution, retained-file accounting, undo.

Every control file's canonical size is kept incrementally (the size of a JSON array
is the sum of its elements' sizes plus separators), so measuring a candidate costs
O(1) beyond the change itself. A decision is tried inside a transaction: the
mutators log their inverse, and a refused alternative is rolled back exactly.
Full serializations (:meth:`State.execution_bytes`, :meth:`State.set_bytes`) exist
for the export and for the cross-check mode that materializes every candidate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from crucible.core import canon, digest
from crucible.core.structs import dataclass, field
from crucible.proof import layout
from crucible.proof.writer._model import Workflow

__all__ = ["PINS", "Attempt", "Instance", "State", "control_dumps"]

PINS = tuple(layout.ATTEMPT_FILES)


def control_dumps(value: Any) -> bytes:
    """RFC 8785 bytes of a control value the writer built itself.

    Such values hold only our fixed ASCII member names, strings that came through the
    strict parser or our id patterns, safe integers and null/booleans — never a
    float or a key at or above U+E000 — which is exactly the domain where orjson's
    sorted output equals JCS (canonical-json.md; ``canon.dumps`` takes the same path
    after a checking walk). Received and payload-derived values use ``canon.dumps``.
    The cross-check mode rebuilds every file with ``canon.dumps`` and compares.
    """
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


_DIGEST_WIDTH = "sha256:" + "0" * 64


@dataclass(slots=True)
class Attempt:
    number: int
    state: str
    failure: str | None
    retry: dict[str, str] | None
    #: the five pins in PINS order (a tuple: one per attempt, kept compact)
    pins: tuple[str | None, ...]
    size: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "state": self.state,
            "failure": self.failure,
            "retry": self.retry,
            **dict(zip(PINS, self.pins, strict=True)),
        }

    def sized(self) -> Attempt:
        self.size = len(control_dumps(self.to_json()))
        return self


# the reader's copy (reader/_model.py) is independent of the writer on purpose: it may
# not import writer code (DESIGN.md); both follow workflow.md §4's instance form.
@dataclass(slots=True)
class Instance:
    id: str
    stage: str
    parent: dict[str, Any] | None
    selection: dict[str, Any] | None
    case_digest: str | None
    state: str
    failure: str | None
    reservation: int
    attempts: list[Attempt] = field(default_factory=list)
    #: set records emitted by this instance's completed attempt
    records: list[dict[str, Any]] = field(default_factory=list)
    base_size: int = 0
    attempts_size: int = 0

    def to_json(self, attempts: bool = True) -> dict[str, Any]:
        return {
            "id": self.id,
            "stage": self.stage,
            "parent": self.parent,
            "selection": self.selection,
            "caseDigest": self.case_digest,
            "state": self.state,
            "failure": self.failure,
            "attempts": [a.to_json() for a in self.attempts] if attempts else [],
        }

    def resize_base(self) -> None:
        self.base_size = len(control_dumps(self.to_json(attempts=False)))

    @property
    def entry_size(self) -> int:
        return self.base_size + self.attempts_size + max(0, len(self.attempts) - 1)


class State:
    """Active execution + retained history accounting for one branch."""

    def __init__(self, wf: Workflow, execution: str, root_id: str) -> None:
        self.wf = wf
        self.execution = execution
        self.root_id = root_id
        self.instances: dict[str, Instance] = {}
        self.stage_ids: dict[str, list[str]] = {s.name: [] for s in wf.stages}
        self.stage_set: dict[str, str] = {s.name: "blocked" for s in wf.stages}
        self.stage_selection: dict[str, dict[str, Any] | None] = {s.name: None for s in wf.stages}
        self.revisions: dict[str, int] = {s.name: 0 for s in wf.stages}
        #: every id ever proposed (root, admitted, refused, retired)
        self.used_ids: set[str] = set()
        self.reserved = 0
        self.records_total = 0
        #: admitted reservation epoch -> its instance ids (dropped when retired)
        self.reservations: dict[int, list[str]] = {}
        self.retained: dict[str, int] = {}
        self.retained_bytes = 0
        self._inst_sum = 0
        self._rec_sum: dict[str, int] = {s.name: 0 for s in wf.stages}
        self._rec_n: dict[str, int] = {s.name: 0 for s in wf.stages}
        self._set_base = {
            s.name: len(canon.dumps({"setVersion": 1, "stage": s.name, "records": []}))
            for s in wf.stages
        }
        self.frozen = [{"stage": s.name, "digest": _digest_of(s.frozen)} for s in wf.stages]
        self._skeleton: int | None = None
        self._undo: list[Callable[[], None]] | None = None
        #: immutable files added by the open transaction (path -> bytes)
        self.pending: dict[str, bytes] = {}

    # -- transactions ----------------------------------------------------------------
    def begin(self) -> None:
        assert self._undo is None
        self._undo = []
        self.pending = {}

    def rollback(self) -> None:
        assert self._undo is not None
        for fn in reversed(self._undo):
            fn()
        self._undo = None
        self.pending = {}

    def commit(self) -> dict[str, bytes]:
        """End the transaction; return the immutable files it added."""
        assert self._undo is not None
        self._undo = None
        added, self.pending = self.pending, {}
        return added

    def _log(self, fn: Callable[[], None]) -> None:
        if self._undo is not None:
            self._undo.append(fn)

    # -- retained immutable files ----------------------------------------------------
    def add_file(self, path: str, data: bytes) -> None:
        assert path not in self.retained, f"immutable path reused: {path}"
        self.retained[path] = len(data)
        self.retained_bytes += len(data)
        self.pending[path] = data

        def undo() -> None:
            del self.retained[path]
            self.retained_bytes -= len(data)
            self.pending.pop(path, None)

        self._log(undo)

    # -- instances -------------------------------------------------------------------
    def add_instance(self, inst: Instance) -> None:
        inst.resize_base()
        inst.attempts_size = sum(a.size for a in inst.attempts)
        self.instances[inst.id] = inst
        self.stage_ids[inst.stage].append(inst.id)
        self.reservations.setdefault(inst.reservation, []).append(inst.id)
        self._inst_sum += inst.entry_size
        self.reserved += 1

        def undo() -> None:
            del self.instances[inst.id]
            self.stage_ids[inst.stage].pop()
            ids = self.reservations[inst.reservation]
            ids.pop()
            if not ids:
                del self.reservations[inst.reservation]
            self._inst_sum -= inst.entry_size
            self.reserved -= 1

        self._log(undo)

    def set_status(self, inst: Instance, state: str, failure: str | None) -> None:
        old = (inst.state, inst.failure, inst.base_size)
        self._inst_sum -= inst.entry_size
        inst.state, inst.failure = state, failure
        inst.resize_base()
        self._inst_sum += inst.entry_size

        def undo() -> None:
            self._inst_sum -= inst.entry_size
            inst.state, inst.failure, inst.base_size = old
            self._inst_sum += inst.entry_size

        self._log(undo)

    def push_attempt(self, inst: Instance, attempt: Attempt) -> None:
        self._inst_sum -= inst.entry_size
        inst.attempts.append(attempt)
        inst.attempts_size += attempt.size
        self._inst_sum += inst.entry_size

        def undo() -> None:
            self._inst_sum -= inst.entry_size
            inst.attempts.pop()
            inst.attempts_size -= attempt.size
            self._inst_sum += inst.entry_size

        self._log(undo)

    def replace_last_attempt(self, inst: Instance, attempt: Attempt) -> None:
        old = inst.attempts[-1]
        self._inst_sum -= inst.entry_size
        inst.attempts[-1] = attempt
        inst.attempts_size += attempt.size - old.size
        self._inst_sum += inst.entry_size

        def undo() -> None:
            self._inst_sum -= inst.entry_size
            inst.attempts[-1] = old
            inst.attempts_size -= attempt.size - old.size
            self._inst_sum += inst.entry_size

        self._log(undo)

    def add_records(self, inst: Instance, records: list[dict[str, Any]]) -> None:
        sizes = [len(control_dumps(r)) for r in records]
        stage = inst.stage
        inst.records.extend(records)
        self._rec_sum[stage] += sum(sizes)
        self._rec_n[stage] += len(records)
        self.records_total += len(records)

        def undo() -> None:
            del inst.records[len(inst.records) - len(records) :]
            self._rec_sum[stage] -= sum(sizes)
            self._rec_n[stage] -= len(records)
            self.records_total -= len(records)

        self._log(undo)

    def retire_stage(self, stage: str) -> None:
        """Remove a stage's active instances, records and reservations (files stay)."""
        ids = self.stage_ids[stage]
        removed = [self.instances.pop(i) for i in ids]
        reservations = {inst.reservation for inst in removed}
        saved_res = {r: self.reservations.pop(r) for r in reservations if r in self.reservations}
        inst_sum = sum(inst.entry_size for inst in removed)
        rec = (self._rec_sum[stage], self._rec_n[stage])
        self.stage_ids[stage] = []
        self._inst_sum -= inst_sum
        self._rec_sum[stage], self._rec_n[stage] = 0, 0

        def undo() -> None:
            for inst in removed:
                self.instances[inst.id] = inst
            self.stage_ids[stage] = ids
            self.reservations.update(saved_res)
            self._inst_sum += inst_sum
            self._rec_sum[stage], self._rec_n[stage] = rec

        self._log(undo)

    # -- stages ----------------------------------------------------------------------
    def set_stage(self, stage: str, set_state: str, selection: dict[str, Any] | None) -> None:
        old = (self.stage_set[stage], self.stage_selection[stage], self._skeleton)
        self.stage_set[stage] = set_state
        self.stage_selection[stage] = selection
        self._skeleton = None

        def undo() -> None:
            self.stage_set[stage], self.stage_selection[stage], self._skeleton = old

        self._log(undo)

    def set_revision(self, stage: str, revision: int) -> None:
        old = self.revisions[stage]
        self.revisions[stage] = revision

        def undo() -> None:
            self.revisions[stage] = old

        self._log(undo)

    def use_ids(self, ids: list[str]) -> None:
        new = [i for i in ids if i not in self.used_ids]
        self.used_ids.update(new)
        self._log(lambda: self.used_ids.difference_update(new))

    def consumed(self, stage: str) -> bool:
        return self.stage_selection[stage] is not None

    # -- measurement -----------------------------------------------------------------
    def _stages_json(self) -> list[dict[str, Any]]:
        return [
            {
                "stage": s.name,
                "set": self.stage_set[s.name],
                "selection": self.stage_selection[s.name],
            }
            for s in self.wf.stages
        ]

    def _execution_json(self, proof_digest: str, instances: list[Any]) -> dict[str, Any]:
        return {
            "executionVersion": 2,
            "execution": self.execution,
            "workflowDigest": self.wf.digest,
            "admissionProofDigest": proof_digest,
            "frozen": self.frozen,
            "stages": self._stages_json(),
            "instances": instances,
        }

    def execution_size(self) -> int:
        if self._skeleton is None:
            self._skeleton = len(canon.dumps(self._execution_json(_DIGEST_WIDTH, [])))
        return self._skeleton + self._inst_sum + max(0, len(self.instances) - 1)

    def set_size(self, stage: str) -> int:
        return self._set_base[stage] + self._rec_sum[stage] + max(0, self._rec_n[stage] - 1)

    def controls_size(self, proof_size: int) -> tuple[int, int]:
        """Bytes and files of the control files for a proof prefix of ``proof_size``."""
        size = self.execution_size() + sum(self.set_size(s.name) for s in self.wf.stages)
        size += proof_size + len(_DIGEST_WIDTH) + 1
        return size, 1 + len(self.wf.stages) + 2

    def measure(self, proof_size: int) -> tuple[int, int]:
        """(bytes, files) of the complete candidate for the current state."""
        csize, cfiles = self.controls_size(proof_size)
        return self.retained_bytes + csize, len(self.retained) + cfiles

    # -- full serialization ----------------------------------------------------------
    def ordered_instances(self) -> list[Instance]:
        return [self.instances[i] for s in self.wf.stages for i in self.stage_ids[s.name]]

    def execution_bytes(self, proof_digest: str) -> bytes:
        instances = [inst.to_json() for inst in self.ordered_instances()]
        return canon.dumps(self._execution_json(proof_digest, instances))

    def set_records(self, stage: str) -> list[dict[str, Any]]:
        return [r for i in self.stage_ids[stage] for r in self.instances[i].records]

    def set_bytes(self, stage: str) -> bytes:
        return canon.dumps({"setVersion": 1, "stage": stage, "records": self.set_records(stage)})

    def control_files(self, proof: bytes, proof_digest: str) -> dict[str, bytes]:
        files = {
            layout.EXECUTION: self.execution_bytes(proof_digest),
            layout.ADMISSION_PROOF: proof,
            layout.ADMISSION_PROOF_DIGEST: proof_digest.encode("ascii") + b"\n",
        }
        for s in self.wf.stages:
            files[layout.set_path(s.name)] = self.set_bytes(s.name)
        return files


def _digest_of(data: bytes) -> str:
    return digest.of_bytes(data)

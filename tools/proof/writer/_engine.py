"""Applying operations: every decision of docs/spec/admission-proof.md §5.

Each decision tries its acceptance candidate inside a state transaction, measures it
(O(change) thanks to incremental sizes), and either commits it or rolls back and
tries the refusal carrier. A carrier that cannot fit, a begin that cannot fit, or a
proof ceiling is *recording unavailable* (:class:`Unrecordable`), never a refusal.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from crucible.core import canon, digest
from crucible.core.errors import InputRefused, Location, OperationalError
from crucible.core.structs import dataclass, field
from crucible.proof import layout
from crucible.proof.writer._bundle import FileSink
from crucible.proof.writer._derive import emitted_outputs, project
from crucible.proof.writer._model import Stage, Workflow
from crucible.proof.writer._ops import (
    FILE_ROLES,
    Assertion,
    Finish,
    Group,
    Observe,
    Op,
    Recover,
    Retry,
    Root,
    Select,
    Stop,
)
from crucible.proof.writer._proofchain import ProofChain, split_at_results
from crucible.proof.writer._received import (
    TooLarge,
    check_pins,
    depth_ok,
    output_records,
    read_artifact,
    strict_json,
)
from crucible.proof.writer._state import PINS, Attempt, Instance, State, control_dumps

__all__ = ["Decision", "Engine", "EngineSettings", "Forbidden", "Unrecordable"]


_NO_PINS: tuple[str | None, ...] = (None,) * len(PINS)


class Forbidden(InputRefused):
    """An operation the rules forbid (exit 1); the message names the rule."""

    code = "forbidden-operation"


class Unrecordable(OperationalError):
    """Recording unavailable (RFC 0024 §8): no valid export includes this operation.

    Exit 3. The pipeline catches it to write the last complete prefix, labelled partial;
    ``line`` is the operation's line."""

    code = "recording-unavailable"

    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


@dataclass(frozen=True)
class Decision:
    """One measured decision, for reports, the probe and tests."""

    line: int
    epoch: int
    observation: int | None
    kind: str
    outcome: str
    #: (bytes, files) of the acceptance candidate, when it was built
    acceptance: tuple[int, int] | None
    #: (bytes, files) of the refusal carrier, when it was built
    refusal: tuple[int, int] | None


@dataclass
class _OpenEpoch:
    number: int
    kind: str
    begins: list[tuple[str, int]]
    next: int = 0
    cutoffs: set[str] = field(default_factory=set)
    held: dict[int, Observe] = field(default_factory=dict)


@dataclass(frozen=True)
class _Taken:
    """An observation on its way into the proof: the operation, its instance, the
    files received (pin -> bytes), their pins, the begun attempt's retry."""

    op: Observe
    inst: Instance
    received: dict[str, bytes]
    pins: dict[str, str | None]
    retry: dict[str, str] | None


@dataclass
class CustodyItem:
    line: int
    instance: str
    attempt: int
    reason: str
    files: dict[str, str]


@dataclass(frozen=True)
class EngineSettings:
    """How an engine checks and what it keeps: the caller's choices, none of which
    changes what is recorded."""

    #: materialize every candidate and compare with the incremental measurement
    check: bool = False
    proof_ceiling: int = layout.MAX_PROOF_BYTES
    #: the operation log's display name in errors (``OPS:LINE``)
    ops_name: str = "operations"
    #: called with every materialized candidate (path -> bytes) when ``check``
    candidate_hook: Callable[[dict[str, bytes]], None] | None = None
    keep_decisions: bool = True


_DEFAULT_SETTINGS = EngineSettings()


class Engine:
    """Applies typed operations in order to one branch."""

    def __init__(
        self,
        wf: Workflow,
        artifacts: Path,
        sink: FileSink,
        spool: Any,
        settings: EngineSettings = _DEFAULT_SETTINGS,
    ) -> None:
        self.wf = wf
        self.artifacts = artifacts
        #: resolved once for the escape check of every received file
        self._artifacts_base = artifacts.resolve()
        self.sink = sink
        self.spool = spool
        self.settings = settings
        self._retries: dict[Assertion, dict[str, str]] = {}
        #: every auditSignaturesDigest pinned so far (workflow.md §9: one sidecar, one attempt)
        self._signature_pins: set[str] = set()
        self.state: State | None = None
        self.proof: ProofChain | None = None
        self.open: _OpenEpoch | None = None
        self.decisions: list[Decision] = []
        self.custody: list[CustodyItem] = []
        self.finished: Finish | None = None
        self.finalization: dict[str, bytes] = {}
        #: epoch dicts, kept only in cross-check mode to rebuild proofs independently
        self._epoch_dicts: list[dict[str, Any]] = []
        self._proof_root: dict[str, Any] = {}

    # -- helpers ---------------------------------------------------------------------
    def _where(self, line: int) -> Location:
        return Location(self.settings.ops_name, line)

    def _forbid(self, line: int, message: str) -> Forbidden:
        return Forbidden(message, where=self._where(line))

    def _between_epochs(self, line: int) -> State:
        """The branch's state for an operation that begins an epoch (a selection, a
        group, a retry): §2 forbids one while another is open."""
        if self.open is not None:
            raise self._forbid(line, "§2: an open epoch admits no following epoch")
        return self.branch_state

    @property
    def branch_state(self) -> State:
        """The branch's state, once root has been applied."""
        assert self.state is not None
        return self.state

    @property
    def proof_chain(self) -> ProofChain:
        """The proof being built, once root has been applied."""
        assert self.proof is not None
        return self.proof

    def _proof_size_ok(self, size: int, line: int, epochs: int) -> None:
        if epochs > layout.MAX_BLOCKS * layout.MAX_EPOCHS_PER_BLOCK:
            raise Unrecordable(
                f"the proof would hold {epochs} epochs, over its structural ceiling "
                f"({layout.MAX_BLOCKS} blocks of {layout.MAX_EPOCHS_PER_BLOCK})",
                line,
            )
        if size > self.settings.proof_ceiling:
            raise Unrecordable(
                f"the proof would be {size} bytes, over its "
                f"{self.settings.proof_ceiling}-byte ceiling",
                line,
            )

    def _fits(self, size: tuple[int, int]) -> bool:
        lim = self.wf.limits
        return size[0] <= lim.max_bytes and size[1] <= lim.max_files

    def _measure(
        self, proof_size: int, epochs_view: Callable[[], list[dict[str, Any]]]
    ) -> tuple[int, int]:
        size = self.branch_state.measure(proof_size)
        if self.settings.check:
            self._cross_check(size, proof_size, epochs_view())
        return size

    def _cross_check(
        self, size: tuple[int, int], proof_size: int, epochs: list[dict[str, Any]]
    ) -> None:
        """Materialize the complete candidate from scratch and compare (tests only)."""
        blocks = [
            epochs[i : i + layout.MAX_EPOCHS_PER_BLOCK]
            for i in range(0, len(epochs), layout.MAX_EPOCHS_PER_BLOCK)
        ]
        proof = canon.dumps({**self._proof_root, "epochBlocks": blocks})
        assert len(proof) == proof_size, (len(proof), proof_size)
        files = dict(self.sink.kept or {})
        files.update(self.branch_state.pending)
        files.update(self.branch_state.control_files(proof, digest.of_bytes(proof)))
        full = (sum(len(b) for b in files.values()), len(files))
        assert full == size, (full, size)
        if self.settings.candidate_hook is not None:
            self.settings.candidate_hook(files)

    def _record(self, decision: Decision) -> None:
        if self.settings.keep_decisions:
            self.decisions.append(decision)

    def _commit(self) -> None:
        self.sink.write(self.branch_state.commit())

    # -- dispatch --------------------------------------------------------------------
    def apply(self, op: Op) -> None:
        if self.finished is not None:
            raise self._forbid(op.line, "no operation may follow finish")
        if self.state is None and not isinstance(op, Root):
            raise self._forbid(op.line, "the first operation must be root")
        if isinstance(op, Root):
            self._root(op)
        elif isinstance(op, Select):
            self._select(op)
        elif isinstance(op, Group):
            self._group(op)
        elif isinstance(op, Retry):
            self._retry(op)
        elif isinstance(op, Observe):
            self._observe(op)
        elif isinstance(op, Recover | Stop):
            self._stop(op, "interrupted" if isinstance(op, Recover) else "cancelled")
        elif isinstance(op, Finish):
            self._finish(op)

    # -- root ------------------------------------------------------------------------
    def _root(self, op: Root) -> None:
        if self.state is not None:
            raise self._forbid(op.line, "root occurs exactly once, as the first operation")
        where = self._where(op.line)
        try:
            case = read_artifact(self.artifacts, op.case, where, self._artifacts_base)
        except TooLarge as exc:
            raise InputRefused(str(exc), where=where) from None
        value = strict_json(case, "root case", where)
        if not isinstance(value, dict) or canon.dumps(value) != case:
            raise InputRefused("the root case must be a canonical JSON object", where=where)
        if not depth_ok(value):
            raise InputRefused("the root case nests deeper than 64 levels", where=where)
        st = State(self.wf, op.execution, op.root_instance)
        self.state = st
        case_digest = digest.of_bytes(case)
        self._proof_root = {
            "admissionProofVersion": 1,
            "workflowDigest": self.wf.digest,
            "execution": op.execution,
            "rootCaseDigest": case_digest,
            "frozenDigest": digest.of_json(st.frozen),
            "rootInstance": op.root_instance,
        }
        self.proof = ProofChain(
            {k: v for k, v in self._proof_root.items() if k != "admissionProofVersion"},
            self.spool,
        )
        epoch = {"number": 1, "previousProofDigest": self.proof_chain.p0_digest, "kind": "root"}
        eb = control_dumps(epoch)
        psize = self.proof_chain.size_with_closed(eb)
        self._proof_size_ok(psize, op.line, 1)
        st.begin()
        st.add_file(layout.WORKFLOW, self.wf.data)
        for s in self.wf.stages:
            st.add_file(layout.frozen_path(s.name), s.frozen)
        st.add_file(layout.ROOT_CASE, case)
        st.add_file(layout.case_path(op.root_instance), case)
        root = Instance(
            id=op.root_instance,
            stage=self.wf.root.name,
            parent=None,
            selection=None,
            case_digest=case_digest,
            state="interrupted",
            failure=None,
            reservation=1,
        )
        st.add_instance(root)
        st.use_ids([op.root_instance])
        st.set_stage(self.wf.root.name, "closed", None)
        size = self._measure(psize, lambda: [epoch])
        if not self._fits(size):
            st.rollback()
            self.state = None
            raise Unrecordable(
                f"the root candidate is {size[0]} bytes in {size[1]} files, over the "
                "workflow limits; there is no root refusal",
                op.line,
            )
        self._commit()
        self.proof_chain.append_closed(eb)
        self._epoch_dicts.append(epoch)
        self._record(Decision(op.line, 1, None, "root", "admitted", size, None))

    # -- selection and fork ----------------------------------------------------------
    def _select(self, op: Select) -> None:
        """A selection or fork epoch (admission-proof.md §5, "Selection / fork"): the
        rules, the count rule and ids, the epoch, the projection, then the acceptance
        candidate or the refusal carrier."""
        revision, offered, slots = self._selection_rules(op)
        child_ids = self._child_ids(op, slots)
        core = {
            "selectionVersion": 1,
            "stage": op.stage,
            "revision": revision,
            "review": op.review.as_json(),
            "offeredDigest": digest.of_json(offered),
            "selected": [{"instance": i, "output": k} for i, k in op.selected],
        }
        core_bytes = canon.dumps(core)
        # the epoch is identical whatever the decision
        number = self.proof_chain.closed_epochs + 1
        epoch = {
            "number": number,
            "previousProofDigest": self.proof_chain.previous_digest(),
            "kind": "fork" if op.fork else "selection",
            "stage": op.stage,
            "revision": revision,
            "selectionCoreDigest": digest.of_bytes(core_bytes),
            "childIds": child_ids,
        }
        eb = control_dumps(epoch)
        psize = self.proof_chain.size_with_closed(eb)
        self._proof_size_ok(psize, op.line, number)
        view = lambda: [*self._epoch_dicts, epoch]  # noqa: E731
        planned = (
            None
            if child_ids is None
            else self._plan_children(op, slots, child_ids, revision, number)
        )
        acceptance: tuple[int, int] | None = None
        if planned is not None:
            assert child_ids is not None
            acceptance = self._try_admit_selection(op, epoch, core_bytes, planned, psize, view)
            if acceptance is None:
                return
        self._refuse_selection(op, epoch, core, psize, view, child_ids, acceptance)

    def _selection_rules(
        self, op: Select
    ) -> tuple[int, list[dict[str, Any]], list[tuple[Stage, dict[str, Any]]]]:
        """Forbidden selections (§2, §3, §6); the revision, offered set and child slots."""
        st, wf = self._between_epochs(op.line), self.wf
        if wf.stage(op.stage) is None:
            raise self._forbid(op.line, f"unknown stage {op.stage!r}")
        if st.stage_set[op.stage] != "closed":
            raise self._forbid(op.line, f"§3: stage {op.stage!r} is blocked; it has no offered set")
        if op.fork and not st.consumed(op.stage):
            raise self._forbid(
                op.line, f"§6: a fork replaces a consumed selection; {op.stage!r} is unconsumed"
            )
        if not op.fork and st.consumed(op.stage):
            raise self._forbid(
                op.line,
                f"§3/§6: the selection of {op.stage!r} is consumed; a new one requires a fork",
            )
        revision = st.revisions[op.stage] + 1
        if revision > layout.MAX_REVISIONS:
            raise self._forbid(
                op.line, f"§3: stage {op.stage!r} already has {layout.MAX_REVISIONS} revisions"
            )
        offered = st.set_records(op.stage)
        by_key = {(r["instance"], r["output"]): r for r in offered}
        if len(set(op.selected)) != len(op.selected):
            raise self._forbid(op.line, "§3: selected parents must be distinct")
        for key in op.selected:
            if key not in by_key:
                raise self._forbid(
                    op.line,
                    f"§3: selected parent {{instance {key[0]!r}, output {key[1]}}} is not in "
                    f"the offered set of {op.stage!r}",
                )
        slots = [(c, by_key[key]) for c in wf.consumers(op.stage) for key in op.selected]
        return revision, offered, slots

    def _child_ids(self, op: Select, slots: list[tuple[Stage, dict[str, Any]]]) -> list[str] | None:
        """The count rule (§3): None when the reservation exceeds maxInstances (the
        selection is then refused), else exactly one fresh, distinct id per slot."""
        st = self.branch_state
        if st.reserved + len(slots) > self.wf.limits.max_instances:
            return None
        if op.child_ids is None:
            raise self._forbid(
                op.line,
                f"§3: the reservation fits maxInstances, so childIds must hold {len(slots)} ids",
            )
        child_ids = list(op.child_ids)
        if len(child_ids) != len(slots):
            raise self._forbid(
                op.line,
                f"§3: childIds must hold exactly one id per child slot ({len(slots)}), "
                f"not {len(child_ids)}",
            )
        if len(set(child_ids)) != len(child_ids):
            raise self._forbid(op.line, "§3: childIds must be distinct")
        for cid in child_ids:
            if cid in st.used_ids:
                raise self._forbid(
                    op.line,
                    f"§3: child id {cid!r} was already proposed in the retained history "
                    "(ids are fresh across refused and retired reservations too)",
                )
        if len(child_ids) > layout.MAX_PROOF_ARRAY:
            raise Unrecordable(
                f"childIds would hold {len(child_ids)} ids, over the proof's "
                f"{layout.MAX_PROOF_ARRAY}-element array ceiling",
                op.line,
            )
        return child_ids

    def _plan_children(
        self,
        op: Select,
        slots: list[tuple[Stage, dict[str, Any]]],
        child_ids: list[str],
        revision: int,
        number: int,
    ) -> list[tuple[Instance, bytes | None]] | None:
        """Project every slot (local bounds before any aggregate candidate); None when a
        case is over maxCaseBytes (the selection is then refused)."""
        planned: list[tuple[Instance, bytes | None]] = []
        for (consumer, record), cid in zip(slots, child_ids, strict=True):
            inst, case = self._project(consumer, record, cid, op.stage, revision, number)
            if case is not None and len(case) > self.wf.limits.max_case_bytes:
                return None
            planned.append((inst, case))
        return planned

    def _try_admit_selection(
        self,
        op: Select,
        epoch: dict[str, Any],
        core_bytes: bytes,
        planned: list[tuple[Instance, bytes | None]],
        psize: int,
        view: Callable[[], list[dict[str, Any]]],
    ) -> tuple[int, int] | None:
        """Commit the acceptance candidate if it fits (None); else roll back and return
        its measured size for the refusal's Decision."""
        st, number, revision = self.branch_state, epoch["number"], epoch["revision"]
        st.begin()
        self._fork_effects(op)
        st.add_file(layout.selection_path(op.stage, revision), core_bytes)
        for inst, case in planned:
            if case is not None:
                st.add_file(layout.case_path(inst.id), case)
            st.add_instance(inst)
        st.set_stage(
            op.stage, "closed", {"revision": revision, "digest": epoch["selectionCoreDigest"]}
        )
        for c in self.wf.consumers(op.stage):
            st.set_stage(c.name, "closed", None)
        st.set_revision(op.stage, revision)
        st.use_ids(epoch["childIds"])
        acceptance = self._measure(psize, view)
        if not self._fits(acceptance):
            st.rollback()
            return acceptance
        self._commit()
        self._close_atomic(control_dumps(epoch), epoch, number, epoch["kind"], True)
        self._record(Decision(op.line, number, None, epoch["kind"], "admitted", acceptance, None))
        return None

    def _refuse_selection(
        self,
        op: Select,
        epoch: dict[str, Any],
        core: dict[str, Any],
        psize: int,
        view: Callable[[], list[dict[str, Any]]],
        child_ids: list[str] | None,
        acceptance: tuple[int, int] | None,
    ) -> None:
        """The refusal carrier: the refusal-bearing selection, which must fit."""
        st, number, revision, kind = (
            self.branch_state,
            epoch["number"],
            epoch["revision"],
            epoch["kind"],
        )
        st.begin()
        self._fork_effects(op)
        st.add_file(
            layout.selection_path(op.stage, revision),
            canon.dumps({**core, "refusal": "limit-exceeded"}),
        )
        if op.fork:
            st.set_stage(op.stage, "closed", None)
        st.set_revision(op.stage, revision)
        st.use_ids(child_ids or [])
        refusal = self._measure(psize, view)
        if not self._fits(refusal):
            st.rollback()
            raise Unrecordable(
                f"{kind} of {op.stage!r} revision {revision} is refused and its refusal carrier "
                f"({refusal[0]} bytes, {refusal[1]} files) does not fit either",
                op.line,
            )
        self._commit()
        self._close_atomic(control_dumps(epoch), epoch, number, kind, False)
        self._record(Decision(op.line, number, None, kind, "refused", acceptance, refusal))

    def _fork_effects(self, op: Select) -> None:
        if not op.fork:
            return
        for d in self.wf.strict_descendants(op.stage):
            self.branch_state.retire_stage(d.name)
            self.branch_state.set_stage(d.name, "blocked", None)

    def _project(
        self,
        consumer: Stage,
        record: dict[str, Any],
        cid: str,
        upstream: str,
        revision: int,
        reservation: int,
    ) -> tuple[Instance, bytes | None]:
        payload = canon.loads(
            self.sink.read(
                layout.payload_path(
                    upstream, record["instance"], record["attempt"], record["output"]
                )
            )
        )
        parent = {"instance": record["instance"], "output": record["output"]}
        slot = project(consumer, payload, cid, parent)
        inst = Instance(
            id=cid,
            stage=consumer.name,
            parent=parent,
            selection={"stage": upstream, "revision": revision},
            case_digest=None if slot.case is None else digest.of_bytes(slot.case),
            state=slot.state,
            failure=slot.failure,
            reservation=reservation,
        )
        return inst, slot.case

    def _close_atomic(
        self, eb: bytes, epoch: dict[str, Any], number: int, kind: str, admitted: bool
    ) -> None:
        self.proof_chain.append_closed(eb)
        if self.settings.check:
            self._epoch_dicts.append(epoch)

    # -- group and retry -------------------------------------------------------------
    def _group(self, op: Group) -> None:
        st = self._between_epochs(op.line)
        ids = st.reservations.get(op.reservation)
        if ids is None:
            raise self._forbid(
                op.line,
                f"§2: reservation {op.reservation} is not an admitted root, selection or fork "
                "epoch with active (unretired) instances",
            )
        eligible = [
            i
            for i in ids
            if st.instances[i].state == "interrupted" and not st.instances[i].attempts
        ]
        eligible_set = set(eligible)
        starts = set(op.starts)
        cancels = {c.instance: c for c in op.cancelled}
        if len(starts) != len(op.starts) or len(cancels) != len(op.cancelled):
            raise self._forbid(op.line, "§2: starts and cancelled have no repetition")
        for i in [*op.starts, *cancels]:
            if i not in eligible_set:
                raise self._forbid(
                    op.line,
                    f"§4: {i!r} is not an eligible slot of reservation {op.reservation} "
                    "(an active interrupted instance with no attempt)",
                )
        if starts & set(cancels):
            raise self._forbid(op.line, "§4: starts and cancelled must not overlap")
        if not starts and not cancels:
            raise self._forbid(op.line, "§4: starts or cancelled must be non-empty")
        deferred = [i for i in eligible if i not in starts and i not in cancels]
        if op.deferred is not None and sorted(op.deferred) != sorted(deferred):
            raise self._forbid(
                op.line,
                "§4: deferred must be exactly the eligible slots neither started nor cancelled",
            )
        for i in [*starts, *cancels]:
            stage = st.instances[i].stage
            if st.consumed(stage):
                raise self._forbid(
                    op.line,
                    f"§4: first begin or cancel of {i!r} in consumed stage {stage!r} requires "
                    "the affected-stage fork (§6)",
                )
        ordered_starts = [i for i in eligible if i in starts]
        ordered_cancels = [cancels[i] for i in eligible if i in cancels]
        number = self.proof_chain.closed_epochs + 1
        epoch: dict[str, Any] = {
            "number": number,
            "previousProofDigest": self.proof_chain.previous_digest(),
            "kind": "group",
            "reservation": op.reservation,
            "starts": [{"instance": i, "number": 1, "retry": None} for i in ordered_starts],
            "deferred": deferred,
            "cancelled": [{"instance": c.instance, **c.by.as_json()} for c in ordered_cancels],
            "results": [],
        }
        if max(len(ordered_starts), len(deferred), len(ordered_cancels)) > layout.MAX_PROOF_ARRAY:
            raise Unrecordable(
                f"a group array would exceed the proof's {layout.MAX_PROOF_ARRAY}-element ceiling",
                op.line,
            )

        def mutate() -> None:
            for i in ordered_starts:
                st.push_attempt(st.instances[i], self._stub(1, None))
            for c in ordered_cancels:
                st.set_status(st.instances[c.instance], "cancelled", None)

        self._begin_epoch(op.line, number, "group", epoch, [(i, 1) for i in ordered_starts], mutate)

    def _retry(self, op: Retry) -> None:
        st = self._between_epochs(op.line)
        inst = st.instances.get(op.instance)
        if inst is None:
            raise self._forbid(
                op.line, f"§4: retry target {op.instance!r} is not an active instance"
            )
        if inst.state not in ("failed", "interrupted"):
            raise self._forbid(
                op.line,
                f"§4: retry of {op.instance!r} is forbidden: a {inst.state} instance is ineligible "
                "(only failed or interrupted instances may be retried)",
            )
        if not inst.attempts:
            raise self._forbid(
                op.line,
                f"§4: {op.instance!r} has no begun attempt; a never-begun slot is started by a "
                "group, and projection/admission failures cannot be retried",
            )
        if st.consumed(inst.stage):
            raise self._forbid(
                op.line,
                f"§4/§6: stage {inst.stage!r} is consumed; retrying {op.instance!r} requires a fork"
                + (" (a consumed root requires a new execution)" if inst.id == st.root_id else ""),
            )
        n = len(inst.attempts) + 1
        if n > self.wf.limits.max_attempts:
            raise self._forbid(
                op.line,
                f"§4: attempt {n} of {op.instance!r} exceeds maxAttempts {self.wf.limits.max_attempts}",
            )
        # one shared dict per distinct assertion keeps long retry histories compact
        retry = self._retries.setdefault(op.by, op.by.as_json())
        number = self.proof_chain.closed_epochs + 1
        epoch = {
            "number": number,
            "previousProofDigest": self.proof_chain.previous_digest(),
            "kind": "retry",
            "begin": {"instance": inst.id, "number": n, "retry": retry},
            "results": [],
        }

        def mutate() -> None:
            st.push_attempt(inst, self._stub(n, retry))
            st.set_status(inst, "interrupted", None)

        self._begin_epoch(op.line, number, "retry", epoch, [(inst.id, n)], mutate)

    @staticmethod
    def _stub(number: int, retry: dict[str, str] | None) -> Attempt:
        return Attempt(number, "interrupted", None, retry, _NO_PINS).sized()

    def _begin_epoch(
        self,
        line: int,
        number: int,
        kind: str,
        epoch: dict[str, Any],
        begins: list[tuple[str, int]],
        mutate: Callable[[], None],
    ) -> None:
        st = self.branch_state
        if begins:
            head, tail = split_at_results(epoch)
            psize = self.proof_chain.size_with_open(head, tail)
        else:
            eb = control_dumps(epoch)
            psize = self.proof_chain.size_with_closed(eb)
        self._proof_size_ok(psize, line, number)
        st.begin()
        mutate()
        size = self._measure(psize, lambda: [*self._epoch_dicts, epoch])
        if not self._fits(size):
            st.rollback()
            raise Unrecordable(
                f"the {kind} epoch's begin candidate P({number},0) is {size[0]} bytes in "
                f"{size[1]} files, over the workflow limits: nothing is begun",
                line,
            )
        self._commit()
        if begins:
            self.proof_chain.open(head, tail)
            if self.settings.check:
                self._epoch_dicts.append(epoch)
            self.open = _OpenEpoch(number, kind, begins)
        else:
            self.proof_chain.append_closed(eb)
            if self.settings.check:
                self._epoch_dicts.append(epoch)
        self._record(Decision(line, number, None, kind, "begun", size, None))

    # -- observations ----------------------------------------------------------------
    def _observe(self, op: Observe) -> None:
        o = self.open
        slot = None
        if (
            o is not None
            and o.next < len(o.begins)
            and o.begins[o.next] == (op.instance, op.attempt)
        ):
            slot = o.next  # the usual case, in O(1): observations in starts order
        elif o is not None:
            for j, (i, n) in enumerate(o.begins):
                if i == op.instance and n == op.attempt:
                    slot = j
                    break
        if o is None or slot is None or slot < o.next:
            if self._is_closed_attempt(op.instance, op.attempt):
                self.custody.append(
                    CustodyItem(op.line, op.instance, op.attempt, "late", self._roles(op))
                )
                return
            raise self._forbid(
                op.line,
                f"§4: observation of {op.instance!r} attempt {op.attempt} matches no begun slot "
                "of the open epoch",
            )
        if slot in o.held:
            raise self._forbid(
                op.line, f"§2: slot {op.instance!r} attempt {op.attempt} already has an observation"
            )
        if slot > o.next:
            o.held[slot] = op  # its turn has not come: fixed starts order (§4)
            return
        self._commit_observation(op)
        self._drain()

    def _drain(self) -> None:
        o = self.open
        while o is not None and o.next in o.held:
            self._commit_observation(o.held.pop(o.next))
            o = self.open

    def _is_closed_attempt(self, instance: str, attempt: int) -> bool:
        inst = self.branch_state.instances.get(instance)
        if inst is None:
            # a retired instance's attempts are closed history
            return instance in self.branch_state.used_ids
        if attempt > len(inst.attempts):
            return False
        o = self.open
        return not (o is not None and (instance, attempt) in o.begins[o.next :])

    @staticmethod
    def _roles(op: Observe) -> dict[str, str]:
        inverse = {v: k for k, v in FILE_ROLES.items()}
        return {inverse[pin]: rel for pin, rel in op.files.items()}

    def _stop(self, op: Recover | Stop, state: str) -> None:
        o = self.open
        if o is None:
            raise self._forbid(
                op.line,
                f"§4: {'recover' if state == 'interrupted' else 'cancel'} needs an open epoch",
            )
        while self.open is not None:
            o = self.open
            held = o.held.pop(o.next, None)
            if held is not None:
                self._commit_observation(held)
                continue
            instance, number = o.begins[o.next]
            self._commit_observation(Observe(op.line, instance, number, state, None, {}))

    def _commit_observation(self, op: Observe) -> None:
        """Record one observation (admission-proof.md §5, "Observation"): receive and
        check its files and pins, then the acceptance candidate of an evaluated
        proposal, else the one candidate of its derived outcome, which must fit."""
        st, o = self.branch_state, self.open
        assert o is not None
        where = self._where(op.line)
        inst = st.instances[op.instance]
        stage = self.wf.stage(inst.stage)
        assert stage is not None
        received = self._receive(op, where)
        audit = check_pins(op.state, op.failure, received, where)
        if op.state == "suppressed" and inst.stage not in o.cutoffs:
            raise self._forbid(
                op.line,
                f"§5: suppressed is allowed only after a cutoff of stage {inst.stage!r} in this epoch",
            )
        pins = self._observation_pins(op, received)
        # the begun attempt's retry, read before any candidate replaces the attempt
        taken = _Taken(op, inst, received, pins, inst.attempts[-1].retry)
        observation = {
            "instance": op.instance,
            "number": op.attempt,
            "state": op.state,
            "failure": op.failure,
            **pins,
        }
        rb = control_dumps(observation)
        psize = self.proof_chain.size_with_result(rb)
        self._proof_size_ok(psize, op.line, o.number)
        j = o.next + 1
        view = lambda: self._view_with_result(observation)  # noqa: E731
        records = (
            output_records(audit, stage.pointer, stage.cardinality)
            if op.state == "evaluated"
            else None
        )
        acceptance: tuple[int, int] | None = None
        measured = op.state == "evaluated" and records is not None and inst.stage not in o.cutoffs
        if measured:
            assert records is not None
            accepted, acceptance = self._try_accept(taken, records, psize, view)
            if accepted:
                self._settle(observation, rb)
                self._record(
                    Decision(op.line, o.number, j, "observation", "accepted", acceptance, None)
                )
                return
        outcome, state, failure = self._derived_outcome(op, records, measured)
        st.begin()
        self._record_attempt(taken, state, failure)
        refusal = self._measure(psize, view)
        if not self._fits(refusal):
            st.rollback()
            self.custody.append(
                CustodyItem(op.line, op.instance, op.attempt, "unrecorded", self._roles(op))
            )
            raise Unrecordable(
                f"observation {j} of epoch {o.number} ({op.instance!r} attempt {op.attempt}, "
                f"{state}{'/' + failure if failure else ''}): its candidate is {refusal[0]} bytes "
                f"in {refusal[1]} files, over the workflow limits",
                op.line,
            )
        self._commit()
        if outcome == "refused":
            o.cutoffs.add(inst.stage)
        self._settle(observation, rb)
        self._record(Decision(op.line, o.number, j, "observation", outcome, acceptance, refusal))

    def _receive(self, op: Observe, where: Location) -> dict[str, bytes]:
        """The observation's files (pin -> bytes); one over its local bound cannot be
        recorded and goes to custody."""
        received: dict[str, bytes] = {}
        try:
            for pin, rel in op.files.items():
                received[pin] = read_artifact(self.artifacts, rel, where, self._artifacts_base)
        except TooLarge as exc:
            self.custody.append(
                CustodyItem(op.line, op.instance, op.attempt, "unrecorded", self._roles(op))
            )
            raise Unrecordable(str(exc), op.line) from None
        return received

    def _observation_pins(self, op: Observe, received: dict[str, bytes]) -> dict[str, str | None]:
        """The five pins; a signature sidecar belongs to one attempt (§9)."""
        pins = {p: (digest.of_bytes(received[p]) if p in received else None) for p in PINS}
        signature_pin = pins.get("auditSignaturesDigest")
        if signature_pin is not None:
            if signature_pin in self._signature_pins:
                raise self._forbid(
                    op.line,
                    "§9: a signature sidecar belongs to one attempt; these audit.sig bytes "
                    "are already pinned by another observation",
                )
            self._signature_pins.add(signature_pin)
        return pins

    def _record_attempt(self, taken: _Taken, state: str, failure: str | None) -> None:
        """What every outcome records: the received files and the attempt's new state
        (the begun attempt's retry, kept)."""
        st, inst, number = self.branch_state, taken.inst, taken.op.attempt
        for pin, data in taken.received.items():
            st.add_file(layout.attempt_file(inst.id, number, pin), data)
        pins = tuple(taken.pins.values())
        attempt = Attempt(number, state, failure, taken.retry, pins).sized()
        st.replace_last_attempt(inst, attempt)
        st.set_status(inst, state, failure)

    def _try_accept(
        self,
        taken: _Taken,
        records: list[Any],
        psize: int,
        view: Callable[[], list[dict[str, Any]]],
    ) -> tuple[bool, tuple[int, int] | None]:
        """The acceptance candidate of an evaluated proposal (local bounds first):
        (True, its size) when committed, else (False, its size if it was measured)."""
        st, lim = self.branch_state, self.wf.limits
        payloads = [canon.dumps(r) for r in records]
        local_ok = st.records_total + len(records) <= lim.max_records and all(
            len(p) <= lim.max_payload_bytes for p in payloads
        )
        if not local_ok:
            return False, None
        st.begin()
        self._record_attempt(taken, "completed" if records else "completed-zero", None)
        inst = taken.inst
        files, set_records = emitted_outputs(
            inst.stage, inst.id, taken.op.attempt, inst.parent, payloads
        )
        for path, data in files:
            st.add_file(path, data)
        st.add_records(inst, set_records)
        acceptance = self._measure(psize, view)
        if self._fits(acceptance):
            self._commit()
            return True, acceptance
        st.rollback()
        return False, acceptance

    @staticmethod
    def _derived_outcome(
        op: Observe, records: list[Any] | None, measured: bool
    ) -> tuple[str, str, str | None]:
        """(outcome, state, failure) of an observation whose proposal is not accepted."""
        if measured:
            return "refused", "failed", "limit-exceeded"
        if op.state == "evaluated" and records is not None:
            return "cut-off", "failed", "limit-exceeded"
        if op.state == "evaluated":
            return "recorded", "failed", "output-invalid"
        if op.state == "suppressed":
            # no proposal was received: not an output decision (the cutoff is checked above)
            return "recorded", "failed", "limit-exceeded"
        return "recorded", op.state, op.failure

    def _view_with_result(self, observation: dict[str, Any]) -> list[dict[str, Any]]:
        epochs = list(self._epoch_dicts)
        last = dict(epochs[-1])
        last["results"] = [*last["results"], observation]
        epochs[-1] = last
        return epochs

    def _settle(self, observation: dict[str, Any], rb: bytes) -> None:
        o = self.open
        assert o is not None
        self.proof_chain.add_result(rb)
        if self.settings.check:
            last = self._epoch_dicts[-1]
            last["results"] = [*last["results"], observation]
        o.next += 1
        if o.next == len(o.begins):
            self.proof_chain.close()
            self.open = None

    # -- finish ----------------------------------------------------------------------
    def _finish(self, op: Finish) -> None:
        where = self._where(op.line)
        files: dict[str, bytes] = {}
        for target, rel in sorted(op.files.items()):
            try:
                files[target] = read_artifact(self.artifacts, rel, where, self._artifacts_base)
            except TooLarge as exc:
                raise InputRefused(str(exc), where=where) from None
        self.finalization = files
        self.finished = op

    def pending_custody(self) -> None:
        """Held observations of an open epoch go to custody (reason: pending)."""
        if self.open is not None:
            for slot in sorted(self.open.held):
                h = self.open.held[slot]
                self.custody.append(
                    CustodyItem(h.line, h.instance, h.attempt, "pending", self._roles(h))
                )
            self.open.held.clear()

"""The accounting of one accounted run (docs/spec/export.md §5): every decision is an
operation line, applied to the proof writer's engine as the run takes it, so the
run and its proof agree by construction.

The dispatcher calls, on its scheduling thread: :meth:`Accounting.reserve` when a
mapped task expands (the selection and its group), :meth:`Accounting.may_start`
before a unit starts (a retry epoch for an instance that already had an attempt),
:meth:`Accounting.observed` when an attempt settles (the unit settles when its
observation is applied, in the epoch's ``starts`` order), and
:meth:`Accounting.close` at the end (``recover`` for an open epoch, usage.json).
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crucible.core import atomic, canon, digest, fdio
from crucible.core.errors import CrucibleError, Location, OperationalError
from crucible.proof import layout
from crucible.proof.writer._engine import Decision, Engine, EngineSettings, Forbidden, Unrecordable
from crucible.proof.writer._model import Workflow, parse_workflow
from crucible.proof.writer._ops import Observe, iter_operations, parse_operation
from crucible.run.accounting import _forms as forms

if TYPE_CHECKING:  # built by the run (crucible.run.session._runner)
    from crucible.core.plan import Plan
    from crucible.stage import StateDir

__all__ = ["Accounting", "open_accounting"]

Settle = Callable[[str | None], None]


class _PayloadSink:
    """The engine's sink at run time: the bundle is written by ``crucible-prove`` from
    the operation log, so only the payloads a projection reads back are kept."""

    kept: dict[str, bytes] | None = None

    def __init__(self) -> None:
        self.payloads: dict[str, bytes] = {}

    def write(self, files: dict[str, bytes]) -> None:
        for rel, data in files.items():
            if rel.endswith(".payload.json"):
                self.payloads[rel] = data

    def read(self, rel: str) -> bytes:
        return self.payloads[rel]


class _RunEngine(Engine):
    """The writer's engine at run time: an observation's files are the bytes this run
    just wrote (no read back); everything else is the writer's own decision code."""

    #: artifact path -> bytes of the observation being applied
    fresh: dict[str, bytes]

    def _receive(self, op: Observe, where: Location) -> dict[str, bytes]:
        received: dict[str, bytes] = {}
        for pin, rel in op.files.items():
            data = self.fresh.get(rel)
            if data is None:  # an earlier session's file (a replayed log)
                return super()._receive(op, where)
            if len(data) > layout.MAX_RECEIVED_FILE_BYTES:
                return super()._receive(op, where)  # the writer's own refusal and custody
            received[pin] = data
        return received


class _OperationLog:
    """``STATE/operations.ndjson``, appended line by line (export.md §6)."""

    def __init__(self, path: Path, lines: int) -> None:
        self.path = path
        self.lines = lines
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise OperationalError(f"cannot write {path}: {exc.strerror}") from None

    def append(self, line: bytes) -> None:
        try:
            fdio.write_all(self.fd, line)
        except OSError as exc:
            raise OperationalError(f"cannot write {self.path}: {exc.strerror}") from None
        self.lines += 1

    def sync(self) -> None:
        try:
            os.fsync(self.fd)
        except OSError as exc:
            raise OperationalError(f"cannot write {self.path}: {exc.strerror}") from None

    def close(self) -> None:
        try:
            self.sync()
        finally:
            os.close(self.fd)


def workflow_document(plan: Plan) -> bytes:
    """``STATE/workflow.json``: the record the plan carries (export.md §3)."""
    from crucible.compile import camel_limits  # the record's spelling of limits

    wf = plan.workflow
    assert wf.limits is not None and wf.record is not None  # an accounted plan's
    return canon.dumps(
        {
            "workflowVersion": 2,
            "name": wf.name,
            "limits": camel_limits(wf.limits),
            "stages": [dict(stage) for stage in wf.record],
        }
    )


class Accounting:
    """One session's accounting: the writer's engine (replayed from the log on a
    resume), the operation log it appends, and what the dispatcher waits on (held
    observations, units waiting for their retry epoch)."""

    def __init__(
        self,
        state_dir: StateDir,
        wf: Workflow,
        actor: str,
        environ: Any,
    ) -> None:
        self.state = state = state_dir.state
        self.state_dir = state_dir
        self.wf = wf
        self.actor = actor
        self.environ = environ
        self.paths = forms.StatePaths(state)
        self.engine = _RunEngine(
            wf,
            self.paths.artifacts,
            _PayloadSink(),  # type: ignore[arg-type]
            None,
            EngineSettings(ops_name=str(self.paths.operations), keep_decisions=True),
        )
        self.log: _OperationLog | None = None
        #: (instance, attempt) -> the observation waiting for its turn, its unit, its
        #: settle, and its files' bytes
        self.held: dict[tuple[str, int], tuple[dict[str, Any], Any, Settle, dict[str, bytes]]] = {}
        #: units waiting for their retry epoch (one open epoch at a time)
        self.waiting: deque[Any] = deque()
        #: producer stage -> its selection's refusal note (None: admitted)
        self.selections: dict[str, str | None] = {}
        self.refusals: list[dict[str, Any]] = []
        #: put a unit back in the ready queue (set by the dispatcher)
        self.requeue: Callable[[Any], None] = lambda unit: None
        #: drop the record of a held unit at shutdown (set by the dispatcher)
        self.unsettle: Callable[[Any], None] = lambda unit: None
        self.engine.fresh = {}
        #: the open epoch's unobserved slots, and that epoch's number
        self._slots: set[tuple[str, int]] = set()
        self._slots_of = 0
        #: the bytes of the observation being built (artifact path -> bytes)
        self._fresh: dict[str, bytes] = {}
        #: artifact names written by this session (content-addressed: written once)
        self.blobs: set[str] = set()
        self.root = wf.root.name
        self.closed = False
        #: recording became unavailable (RFC 0024 §8): the log ends at that line
        self.unavailable = False

    # -- the log ---------------------------------------------------------------------
    def _at(self) -> str:
        return forms.now_at(self.environ)

    def _apply(self, obj: dict[str, Any]) -> Decision | None:
        """Apply one operation and append its line; recording unavailable is exit 3."""
        assert self.log is not None
        line = canon.dumps(obj) + b"\n"
        number = self.log.lines + 1
        where = Location(str(self.paths.operations), number)
        op = parse_operation(obj, number, where)
        try:
            self.engine.apply(op)
        except Unrecordable as exc:
            self.log.append(line)  # prove replays it to the same partial prefix
            self.unavailable = True  # nothing follows it in the log
            raise OperationalError(
                f"recording unavailable: {exc.message}", location=where
            ) from None
        self.log.append(line)
        decisions = self.engine.decisions
        decision = decisions[-1] if decisions else None
        decisions.clear()
        return decision

    # -- opening ---------------------------------------------------------------------
    def start(self, params: dict[str, Any], resume: bool) -> None:
        p = self.paths
        try:
            p.artifacts.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OperationalError(f"cannot write {p.artifacts}: {exc.strerror}") from None
        atomic.write_bytes(p.workflow, self.wf.data, if_changed=True)
        case = canon.dumps({"params": params})
        atomic.write_bytes(p.artifacts / forms.StatePaths.ROOT_CASE, case, if_changed=True)
        lines = 0
        if resume and p.operations.is_file():
            for op in iter_operations(p.operations):
                lines = op.line
                self.engine.apply(op)
            self.engine.decisions.clear()
        else:
            p.operations.unlink(missing_ok=True)
        self.log = _OperationLog(p.operations, lines)
        if self.engine.state is None:
            execution = forms.execution_id(self.wf.digest, digest.of_bytes(case))
            self._apply(
                {
                    "op": "root",
                    "execution": execution,
                    "rootInstance": self.root,
                    "case": forms.StatePaths.ROOT_CASE,
                }
            )
            self._apply({"op": "group", "reservation": 1, "starts": [self.root], "cancelled": []})
        elif self.engine.open is not None:  # an earlier session ended without its recover
            self._apply({"op": "recover"})
        self.log.sync()

    # -- ids -------------------------------------------------------------------------
    def instance_of(self, name: str, key: str | None) -> str | None:
        return self.root if key is None else forms.child_id(name, key)

    # -- selections ------------------------------------------------------------------
    def reserve(
        self, task: str, keys: list[str], *, keys_of: Callable[[str], list[str]]
    ) -> str | None:
        """The selection of ``task``'s producer (once for all its consumers) and the
        group starting its children; the refusal note, or None when admitted."""
        stage = self.wf.stage(task)
        assert stage is not None and stage.from_stage is not None
        producer = stage.from_stage
        if producer in self.selections:
            return self.selections[producer]
        st = self.engine.branch_state
        if st.revisions[producer] > 0:  # decided in an earlier session
            note = None if st.consumed(producer) else "refused: the selection was refused earlier"
            self.selections[producer] = note
            return note
        note = self._select(producer, task, keys, keys_of)
        self.selections[producer] = note
        if note is not None:
            self.refusals.append({"task": producer, "key": None, "note": note})
        return note

    def _select(
        self, producer: str, task: str, keys: list[str], keys_of: Callable[[str], list[str]]
    ) -> str | None:
        st = self.engine.branch_state
        offered = st.set_records(producer)
        ids: list[str] = []
        for consumer in self.wf.consumers(producer):
            try:
                ks = keys if consumer.name == task else keys_of(consumer.name)
            except CrucibleError as exc:  # another consumer's keys cannot be had
                return f"accounted: cannot reserve the children of {consumer.name}: {exc}"
            if len(ks) != len(offered):
                return (
                    f"accounted: {consumer.name} has {len(ks)} instances but {producer} "
                    f"offers {len(offered)} records"
                )
            for k in ks:
                cid = forms.child_id(consumer.name, k)
                if cid is None:
                    return f"accounted: instance key {k!r} cannot be a record id"
                ids.append(cid)
        reserved_before = st.reserved
        decision = self._apply(
            {
                "op": "select",
                "stage": producer,
                "review": {"actor": self.actor, "at": self._at()},
                "selected": [{"instance": r["instance"], "output": r["output"]} for r in offered],
                "childIds": ids,
            }
        )
        assert decision is not None
        if decision.outcome != "admitted":
            self.log_sync()
            return self._selection_note(decision, reserved_before, len(ids))
        reservation = decision.epoch
        if any(not st.instances[i].attempts for i in st.reservations.get(reservation, [])):
            self._begin_group(reservation)
        self.log_sync()
        return None

    def _begin_group(self, reservation: int) -> bool:
        """A group starting every eligible slot of ``reservation`` at once."""
        st = self.engine.branch_state
        eligible = [
            i
            for i in st.reservations.get(reservation, [])
            if st.instances[i].state == "interrupted" and not st.instances[i].attempts
        ]
        if eligible:
            self._apply(
                {"op": "group", "reservation": reservation, "starts": eligible, "cancelled": []}
            )
            self.log_sync()
        return True

    def _selection_note(self, d: Decision, reserved: int, n: int) -> str:
        lim = self.wf.limits
        if d.acceptance is None:
            if reserved + n > lim.max_instances:
                return f"refused: would exceed max_instances by {reserved + n - lim.max_instances}"
            return "refused: a case would exceed max_case_bytes"
        return self._bound_note(d.acceptance)

    def _bound_note(self, size: tuple[int, int]) -> str:
        lim = self.wf.limits
        if size[0] > lim.max_bytes:
            return f"refused: would exceed max_bytes by {size[0] - lim.max_bytes}"
        return f"refused: would exceed max_files by {size[1] - lim.max_files}"

    def log_sync(self) -> None:
        if self.log is not None:
            self.log.sync()

    # -- starts and retries ----------------------------------------------------------
    def may_start(self, unit: Any) -> str | bool:
        """True: the unit may start (its slot is begun); False: it waits for its retry
        epoch (requeued later); a string: it must not run (settle it failed so)."""
        iid = self.instance_of(unit.name, unit.key)
        st = self.engine.branch_state
        inst = None if iid is None else st.instances.get(iid)
        if inst is None:
            producer = self.wf.stage(unit.name)
            up = None if producer is None else producer.from_stage
            return (up and self.selections.get(up)) or "accounted: this instance has no reservation"
        o = self.engine.open
        if inst.attempts and (inst.id, inst.attempts[-1].number) in self._unobserved():
            return True  # begun by its group (or its retry epoch), not yet observed
        if o is not None or self.held:
            self.waiting.append(unit)
            return False
        if not inst.attempts:  # reserved, never begun (a session ended before its group)
            return self._begin_group(inst.reservation)
        return self._retry(inst.id)

    def _unobserved(self) -> set[tuple[str, int]]:
        """The open epoch's begun slots not yet observed (kept per epoch: O(1) a look)."""
        o = self.engine.open
        if o is None:
            return set()
        if self._slots_of != o.number:
            self._slots = set(o.begins[o.next :])
            self._slots_of = o.number
        return self._slots

    def _retry(self, iid: str) -> str | bool:
        inst = self.engine.branch_state.instances[iid]
        if len(inst.attempts) + 1 > self.wf.limits.max_attempts:
            return f"refused: would exceed max_attempts ({self.wf.limits.max_attempts})"
        try:
            self._apply({"op": "retry", "instance": iid, "actor": self.actor, "at": self._at()})
        except Forbidden as exc:
            return f"accounted: cannot retry {iid}: {exc.message}"
        self.log_sync()
        return True

    def _release_waiting(self) -> None:
        if self.waiting and self.engine.open is None and not self.held:
            # one at a time: may_start begins its epoch when the unit is taken
            self.requeue(self.waiting.popleft())

    # -- observations ----------------------------------------------------------------
    def observed(
        self,
        unit: Any,
        kind: str,
        exit_code: int | None,
        reason: str,
        settle: Settle,
        *,
        output: Any = None,
    ) -> None:
        """An attempt settled: ``kind`` is ``evaluated`` (passed capture), ``failed``
        (exit, timeout, capture) or ``acquisition`` (never started). ``settle`` is
        called with the refusal note (or None) once its observation is applied."""
        iid = self.instance_of(unit.name, unit.key)
        st = self.engine.branch_state
        inst = None if iid is None else st.instances.get(iid)
        if (
            inst is None
            or not inst.attempts
            or (inst.id, inst.attempts[-1].number) not in self._unobserved()
        ):
            settle(None)  # no begun slot: nothing of it is recorded
            return
        n = inst.attempts[-1].number
        self._fresh = {}
        obj = self._observation(unit, inst.id, n, kind, exit_code, reason, output)
        self.held[(inst.id, n)] = (obj, unit, settle, self._fresh)
        self._drain()

    def _observation(
        self,
        unit: Any,
        iid: str,
        n: int,
        kind: str,
        exit_code: int | None,
        reason: str,
        output: Any,
    ) -> dict[str, Any]:
        if kind == "acquisition":
            return self._observe(iid, n, "failed", "acquisition-failed", {})
        files = {
            "run": forms.run_file(self._at(), exit_code),
            "preparation": forms.preparation_file(unit.name),
        }
        if kind == "evaluated":
            # the worker's reply carries the captured result; else it is read back
            files["audit"] = forms.audit_file(self._output(unit) if output is None else output)
            return self._observe(iid, n, "evaluated", None, self._write(files))
        files["evaluationError"] = forms.evaluation_error_file(exit_code, reason)
        return self._observe(iid, n, "failed", "evaluation-error", self._write(files))

    @staticmethod
    def _observe(
        iid: str, n: int, state: str, failure: str | None, files: dict[str, str]
    ) -> dict[str, Any]:
        return {
            "op": "observe",
            "instance": iid,
            "attempt": n,
            "state": state,
            "failure": failure,
            "files": files,
        }

    def _write(self, files: dict[str, bytes]) -> dict[str, str]:
        """Each file once in the content-addressed store (export.md §6): role -> path."""
        out = {}
        for role, data in files.items():
            rel = forms.StatePaths.blob(data)
            if rel not in self.blobs:
                path = os.path.join(self.paths.artifacts, rel)
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
                    try:
                        fdio.write_all(fd, data)
                    finally:
                        os.close(fd)
                except OSError as exc:
                    raise OperationalError(f"cannot write {path}: {exc.strerror}") from None
                self.blobs.add(rel)
            self._fresh[rel] = data
            out[role] = rel
        return out

    def _output(self, unit: Any) -> Any:
        """The captured result object of the unit's passed attempt (its audit)."""
        if unit.key is None:
            record = self.state_dir.load_result(unit.name)
        else:  # the task's packed records, read once (one parse per new line)
            record = self.state_dir.load_all(unit.name).get(unit.key)
        return {} if record is None else record.get("output", {})

    def _drain(self) -> None:
        while (o := self.engine.open) is not None:
            slot = o.begins[o.next]
            if slot not in self.held:
                break
            obj, unit, settle, fresh = self.held.pop(slot)
            self._unobserved().discard(slot)
            self.engine.fresh = fresh
            decision = self._apply(obj)
            self.engine.fresh = {}
            note = None if decision is None else self._observation_note(decision, obj, unit)
            if note is not None:
                self.refusals.append({"task": unit.name, "key": unit.key, "note": note})
            settle(note)
        if self.engine.open is None:
            self.log_sync()
            self._release_waiting()

    def _observation_note(self, d: Decision, obj: dict[str, Any], unit: Any) -> str | None:
        stage = self.wf.stage(unit.name)
        assert stage is not None
        if d.outcome == "refused":
            if d.acceptance is not None:
                return self._bound_note(d.acceptance)
            return self._local_note(stage.name)
        if d.outcome == "cut-off":
            return f"refused: cut off after an earlier refusal in stage {stage.name}"
        inst = self.engine.branch_state.instances.get(obj["instance"])
        if obj["state"] == "evaluated" and inst is not None and inst.failure == "output-invalid":
            shape = "an array of objects" if stage.cardinality == "many" else "an object"
            return f"refused: output-invalid (output {stage.pointer!r} is not {shape})"
        return None

    def _local_note(self, stage: str) -> str:
        lim = self.wf.limits
        st = self.engine.branch_state
        if st.records_total >= lim.max_records:
            return f"refused: would exceed max_records ({lim.max_records})"
        return f"refused: a record would exceed max_payload_bytes ({lim.max_payload_bytes})"

    # -- closing ---------------------------------------------------------------------
    def close(self) -> None:
        """Shutdown: a held finisher is unsettled, an open epoch is recovered, the log
        synced and usage.json written."""
        if self.closed or self.log is None:
            return
        self.closed = True
        try:
            for _obj, unit, _settle, _fresh in self.held.values():
                self.unsettle(unit)
            self.held.clear()
            if self.engine.open is not None and not self.unavailable:
                # recording unavailable: the log keeps its last complete prefix
                with contextlib.suppress(OperationalError):
                    self._apply({"op": "recover"})
            self._write_usage()
        finally:
            self.log.close()

    def discard(self, *, fresh: bool) -> None:
        """The session could not start: close the log; a fresh run leaves nothing of
        its accounting behind (nothing half-written)."""
        if self.log is not None:
            with contextlib.suppress(OSError):
                os.close(self.log.fd)
            self.log = None
        if fresh and self.engine.state is None:
            import shutil  # only on this error path

            self.paths.operations.unlink(missing_ok=True)
            self.paths.workflow.unlink(missing_ok=True)
            shutil.rmtree(self.paths.proof, ignore_errors=True)

    def usage(self) -> dict[str, Any]:
        st = self.engine.branch_state
        size, files = st.measure(self.engine.proof_chain.size())
        lim = self.wf.limits
        return {
            "usageVersion": 1,
            "limits": {
                "maxBytes": lim.max_bytes,
                "maxFiles": lim.max_files,
                "maxInstances": lim.max_instances,
                "maxRecords": lim.max_records,
            },
            "used": {
                "bytes": size,
                "files": files,
                "instances": st.reserved,
                "records": st.records_total,
            },
            "refusals": self.refusals,
        }

    def _write_usage(self) -> None:
        if self.engine.state is None or self.engine.proof is None:
            return
        earlier: list[Any] = []
        with contextlib.suppress(OSError, ValueError, AttributeError):
            earlier = list(canon.loads(self.paths.usage.read_bytes()).get("refusals", []))
        usage = self.usage()
        usage["refusals"] = [*earlier, *self.refusals]
        atomic.write_bytes(self.paths.usage, canon.dumps(usage))


def open_accounting(
    plan: Plan,
    state_dir: StateDir,
    params: dict[str, Any],
    *,
    actor: str | None,
    resume: bool,
    environ: Any,
) -> Accounting:
    """The accounting of an accounted plan's session, its log opened (or replayed)."""
    data = workflow_document(plan)
    wf = parse_workflow(data, "workflow.json")
    book = Accounting(
        state_dir,
        wf,
        forms.check_actor(actor) if actor is not None else forms.default_actor(environ),
        environ,
    )
    try:
        book.start(params, resume)
    except BaseException:
        book.discard(fresh=not resume)
        raise
    return book

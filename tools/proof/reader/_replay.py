"""Phase 4: replay every epoch, and every observation, once, in proof order.

The reader keeps two derived values (RFC 0024 §7): the active logical state and
the immutable retained-file map (path -> size). At each decision it measures the
complete candidate export — retained files, the files the decision adds, the
control files rebuilt from the hypothetical state, the proof prefix and its
sidecar — and derives the outcome itself. The outcome is never read from the
bundle; the bundle's evidence (a selection's ``refusal`` member, the presence of
output files, the final execution) is then checked against it.

Control-file sizes are kept incrementally (the sum of member sizes plus
separators), so each decision costs O(what it changes), not O(history).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import orjson

from crucible.core import canon, digest
from crucible.core.structs import dataclass, field
from crucible.proof import layout
from crucible.proof.reader._bundle import BundleTree
from crucible.proof.reader._chain import PrefixHasher, split_results
from crucible.proof.reader._findings import Problem
from crucible.proof.reader._model import (
    PINS,
    Attempt,
    Instance,
    StageDef,
    control_dumps,
    set_json,
)

__all__ = ["Context", "Replay"]

_SIDECAR_BYTES = 72  # "sha256:" + 64 hex + "\n"


@dataclass
class Context:
    """What phases 1-3 established, handed to the replay."""

    tree: BundleTree
    limits: dict[str, int]
    stages: list[StageDef]
    proof: dict[str, Any]
    #: the epochs in proof order (iterable more than once)
    epochs: Iterable[dict[str, Any]]
    #: (stage, revision) -> (parsed selection, refusal-bearing?)
    selections: dict[tuple[str, int], tuple[dict[str, Any], bool]]
    file_ceiling: int = layout.MAX_RECEIVED_FILE_BYTES
    by_name: dict[str, StageDef] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_name = {s.name: s for s in self.stages}


def _inv(
    msg: str, epoch: int | None = None, obs: int | None = None, path: str | None = None
) -> Problem:
    return Problem("inventory-mismatch", 4, msg, path=path, epoch=epoch, observation=obs)


def _resolve_pointer(doc: Any, pointer: str) -> tuple[bool, Any]:
    if pointer == "":
        return True, doc
    cur = doc
    for raw in pointer[1:].split("/"):
        tok = raw.replace("~1", "/").replace("~0", "~")
        if type(cur) is dict:
            if tok not in cur:
                return False, None
            cur = cur[tok]
        elif type(cur) is list:
            if not tok.isdigit() or (tok != "0" and tok.startswith("0")) or int(tok) >= len(cur):
                return False, None
            cur = cur[int(tok)]
        else:
            return False, None
    return True, cur


class Replay:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.limits = ctx.limits
        self.tree = ctx.tree
        self.inst: dict[str, Instance] = {}
        self.by_stage: dict[str, list[str]] = {s.name: [] for s in ctx.stages}
        self.set_state: dict[str, str] = {s.name: "blocked" for s in ctx.stages}
        self.selection: dict[str, dict[str, Any] | None] = {s.name: None for s in ctx.stages}
        #: emitted records of each active instance; a set is their concatenation in
        #: execution instance order (workflow.md §6), whatever order they were accepted in
        self.inst_records: dict[str, list[dict[str, Any]]] = {}
        self.record_count: dict[str, int] = {s.name: 0 for s in ctx.stages}
        self.record_size: dict[str, int] = {s.name: 0 for s in ctx.stages}
        self.max_rev: dict[str, int] = {s.name: 0 for s in ctx.stages}
        self.used_ids: set[str] = set()
        self.reserved = 0
        self.records_total = 0
        self.retained: dict[str, int] = {}
        self.retained_bytes = 0
        self.reservations: dict[int, list[str]] = {}
        self.inst_total = 0
        #: each active instance's canonical size as counted in inst_total
        self.sizes: dict[str, int] = {}
        self.sig_owner: dict[str, tuple[str, int]] = {}
        self.hasher = PrefixHasher(ctx.proof)
        self.open_epoch = False
        #: every decision as measured: epoch, observation, kind, outcome, and the
        #: [bytes, files] of its acceptance and refusal candidates (None: not built)
        self.trace: list[dict[str, Any]] = []
        self._set_base = {s.name: len(control_dumps(set_json(s.name, []))) for s in ctx.stages}
        # output files present in the bundle, by attempt directory
        self.output_dirs: dict[str, int] = {}
        for p in self.tree.sizes:
            if p.startswith("outputs/"):
                d = p.rsplit("/", 1)[0] + "/"
                self.output_dirs[d] = self.output_dirs.get(d, 0) + 1

    # ------------------------------------------------------------------ sizes

    def stages_json(
        self,
        sel: dict[str, dict[str, Any] | None] | None = None,
        sets: dict[str, str] | None = None,
    ) -> list[dict[str, Any]]:
        sel = sel or {}
        sets = sets or {}
        return [
            {
                "stage": s.name,
                "set": sets.get(s.name, self.set_state[s.name]),
                "selection": sel[s.name] if s.name in sel else self.selection[s.name],
            }
            for s in self.ctx.stages
        ]

    def execution_json(self, proof_digest: str, *, with_instances: bool = True) -> dict[str, Any]:
        insts = (
            [self.inst[i].to_json() for s in self.ctx.stages for i in self.by_stage[s.name]]
            if with_instances
            else []
        )
        return {
            "executionVersion": 2,
            "execution": self.ctx.proof["execution"],
            "workflowDigest": self.ctx.proof["workflowDigest"],
            "admissionProofDigest": proof_digest,
            "frozen": self.frozen,
            "stages": self.stages_json(),
            "instances": insts,
        }

    def execution_digest(self, proof_digest: str) -> str:
        """Digest of the reconstructed execution, streamed instance by instance."""
        full = self.execution_json(proof_digest, with_instances=False)
        body = control_dumps(full)
        cut = body.index(b'"instances":[]') + len(b'"instances":[')
        h = hashlib.sha256(body[:cut])
        sep = b""
        for s in self.ctx.stages:
            for i in self.by_stage[s.name]:
                h.update(sep + control_dumps(self.inst[i].to_json()))
                sep = b","
        h.update(body[cut:])
        return "sha256:" + h.hexdigest()

    def _exec_size(self, stages: list[dict[str, Any]], inst_total: int, n: int) -> int:
        base = {
            "executionVersion": 2,
            "execution": self.ctx.proof["execution"],
            "workflowDigest": self.ctx.proof["workflowDigest"],
            "admissionProofDigest": "sha256:" + "0" * 64,  # every digest is 71 bytes
            "frozen": self.frozen,
            "stages": stages,
            "instances": [],
        }
        return len(control_dumps(base)) + inst_total + max(n - 1, 0)

    def _sets_size(self, extra: dict[str, tuple[int, int]] | None = None) -> int:
        """Sum of set-file sizes; ``extra`` maps stage -> (added bytes, added records)."""
        total = 0
        for s in self.ctx.stages:
            size = self.record_size[s.name]
            n = self.record_count[s.name]
            if extra and s.name in extra:
                size += extra[s.name][0]
                n += extra[s.name][1]
            total += self._set_base[s.name] + size + max(n - 1, 0)
        return total

    def fits(
        self,
        *,
        proof_size: int,
        new_bytes: int,
        new_files: int,
        stages: list[dict[str, Any]] | None = None,
        inst_total: int | None = None,
        n_inst: int | None = None,
        set_extra: dict[str, tuple[int, int]] | None = None,
    ) -> tuple[bool, int, int]:
        exec_size = self._exec_size(
            stages if stages is not None else self.stages_json(),
            self.inst_total if inst_total is None else inst_total,
            len(self.inst) if n_inst is None else n_inst,
        )
        size = (
            self.retained_bytes
            + new_bytes
            + exec_size
            + self._sets_size(set_extra)
            + proof_size
            + _SIDECAR_BYTES
        )
        files = len(self.retained) + new_files + 1 + len(self.ctx.stages) + 2
        ok = size <= self.limits["maxBytes"] and files <= self.limits["maxFiles"]
        return ok, size, files

    def _trace(
        self,
        epoch: int,
        obs: int | None,
        kind: str,
        outcome: str,
        acceptance: tuple[int, int] | None,
        refusal: tuple[int, int] | None,
    ) -> None:
        self.trace.append(
            {
                "epoch": epoch,
                "observation": obs,
                "kind": kind,
                "outcome": outcome,
                "acceptance": None if acceptance is None else list(acceptance),
                "refusal": None if refusal is None else list(refusal),
            }
        )

    def retain(self, path: str, size: int, epoch: int, obs: int | None = None) -> None:
        if path in self.retained:
            raise _inv("a second value at an immutable path", epoch, obs, path)
        self.retained[path] = size
        self.retained_bytes += size

    def _set_instance(self, inst: Instance) -> None:
        old = self.sizes.get(inst.id, 0)
        self.inst[inst.id] = inst
        self.sizes[inst.id] = inst.measure()
        self.inst_total += self.sizes[inst.id] - old

    def offered(self, stage: str) -> list[dict[str, Any]]:
        """The stage's offered set: its active instances' records in execution order."""
        return [r for i in self.by_stage[stage] for r in self.inst_records.get(i, ())]

    def _read(self, path: str) -> bytes:
        return self.tree.read(path, self.ctx.file_ceiling)

    def _check_retained(
        self,
        path: str,
        data: bytes,
        code: str,
        message: str,
        epoch: int,
        observation: int | None = None,
    ) -> None:
        """Phase 4: the bundle holds ``path`` with exactly ``data``, the bytes replay derived."""
        if path not in self.tree.sizes or self._read(path) != data:
            raise Problem(code, 4, message, path=path, epoch=epoch, observation=observation)

    # ----------------------------------------------------------------- replay

    def run(self) -> None:
        self.frozen = [
            {"stage": s.name, "digest": digest.of_bytes(canon.dumps(self._stage_obj(s)))}
            for s in self.ctx.stages
        ]
        for e in self.ctx.epochs:
            kind = e["kind"]
            if kind == "root":
                self.root(e)
            elif kind in ("selection", "fork"):
                self.select(e)
            elif kind == "group":
                self.group(e)
            else:
                self.retry(e)

    def _stage_obj(self, s: StageDef) -> dict[str, Any]:
        return {
            "name": s.name,
            "input": {
                "fromStage": s.from_stage,
                "fields": s.fields,
                "admitMaxBytes": s.admit_max_bytes,
            },
            "output": {"pointer": s.pointer, "cardinality": s.cardinality},
        }

    def root(self, e: dict[str, Any]) -> None:
        k = e["number"]
        proof = self.ctx.proof
        root_stage = self.ctx.stages[0].name
        paths = [layout.WORKFLOW, layout.ROOT_CASE, layout.case_path(proof["rootInstance"])]
        paths += [layout.frozen_path(s.name) for s in self.ctx.stages]
        for p in paths:
            if p not in self.tree.sizes:
                raise _inv("root material missing", k, path=p)
            self.retain(p, self.tree.sizes[p], k)
        rid = proof["rootInstance"]
        self._set_instance(
            Instance(rid, root_stage, None, None, proof["rootCaseDigest"], reservation=k)
        )
        self.by_stage[root_stage].append(rid)
        self.set_state[root_stage] = "closed"
        self.used_ids.add(rid)
        self.reserved = 1
        self.reservations[k] = [rid]
        epoch_bytes = control_dumps(e)
        ok, size, files = self.fits(
            proof_size=self.hasher.open_size(len(epoch_bytes)), new_bytes=0, new_files=0
        )
        if not ok:
            raise _inv(
                f"the root candidate ({size} bytes, {files} files) does not fit: unrecordable", k
            )
        self._trace(k, None, "root", "admitted", (size, files), None)
        self.hasher.close(epoch_bytes)

    def _descendants(self, stage: str) -> list[str]:
        out: list[str] = []
        frontier = [stage]
        while frontier:
            s = frontier.pop(0)
            for c in self.ctx.by_name[s].consumers:
                out.append(c)
                frontier.append(c)
        return out

    def select(self, e: dict[str, Any]) -> None:
        """A selection or fork epoch, in verify.md's order: the selection-mismatch checks,
        the fork effects, the derivation (count rule, ids, projection, measurement),
        then the evidence against the derived outcome."""
        k, kind, u, rev = e["number"], e["kind"], e["stage"], e["revision"]
        sel_path = layout.selection_path(u, rev)
        sel, refused_file, index = self._check_selection(e, sel_path)
        self.max_rev[u] = rev
        # Fork effects come first and hold in both candidates (admission-proof.md §5).
        if kind == "fork":
            self._fork_effects(u)
        core = {k2: v for k2, v in sel.items() if k2 != "refusal"}
        core_bytes = canon.dumps(core)
        proof_size = self.hasher.open_size(len(control_dumps(e)))
        outcome, acceptance, children = self._derive_selection(
            e, sel, index, core_bytes, proof_size, sel_path
        )
        if e["childIds"]:
            self.used_ids.update(e["childIds"])
        if outcome == "refused":
            refusal_bytes = canon.dumps({**core, "refusal": "limit-exceeded"})
            self._settle_refused_selection(
                e, refused_file, refusal_bytes, proof_size, sel_path, acceptance
            )
        else:
            self._settle_admitted_selection(e, refused_file, core_bytes, children, sel_path)
            self._trace(k, None, kind, "admitted", acceptance, None)
        self.hasher.close(control_dumps(e))

    def _check_selection(
        self, e: dict[str, Any], sel_path: str
    ) -> tuple[dict[str, Any], bool, dict[tuple[str, int], dict[str, Any]]]:
        """``selection-mismatch``: the stage, its state, the revision, the file's own
        stage/revision and offered digest, the selected members. Returns the selection,
        whether it is refusal-bearing, and the offered records by (instance, output)."""
        k, kind, u, rev = e["number"], e["kind"], e["stage"], e["revision"]

        def bad(msg: str) -> Problem:
            return Problem("selection-mismatch", 4, msg, path=sel_path, epoch=k)

        if u not in self.ctx.by_name:
            raise bad(f"stage {u!r} is not in the workflow")
        if self.set_state[u] != "closed":
            raise bad(f"stage {u!r} is blocked: its set is not closed")
        consumed = self.selection[u] is not None
        if kind == "selection" and consumed:
            raise bad(f"stage {u!r} is consumed: a new selection requires a fork")
        if kind == "fork" and not consumed:
            raise bad(f"stage {u!r} is unconsumed: a fork replaces a consumed selection")
        if rev != self.max_rev[u] + 1:
            raise bad(f"revision {rev} where {self.max_rev[u] + 1} is due")
        sel, refused_file = self.ctx.selections[(u, rev)]
        if sel["stage"] != u or sel["revision"] != rev:
            raise bad("the selection names another stage or revision")
        offered = self.offered(u)
        if sel["offeredDigest"] != digest.of_bytes(control_dumps(offered)):
            raise bad("offeredDigest is not the digest of the stage's offered set at this epoch")
        index = {(r["instance"], r["output"]): r for r in offered}
        seen: set[tuple[str, int]] = set()
        for m in sel["selected"]:
            key = (m["instance"], m["output"])
            if key in seen:
                raise bad(f"selected repeats {key}")
            if key not in index:
                raise bad(f"selected {key} is not in the offered set")
            seen.add(key)
        return sel, refused_file, index

    def _fork_effects(self, u: str) -> None:
        """Retire every strict descendant: instances leave, sets empty, blocked."""
        for d in self._descendants(u):
            for i in self.by_stage[d]:
                del self.inst[i]
                self.inst_total -= self.sizes.pop(i)
                self.inst_records.pop(i, None)
            self.by_stage[d] = []
            self.record_count[d] = 0
            self.record_size[d] = 0
            self.set_state[d] = "blocked"
            self.selection[d] = None

    def _derive_selection(
        self,
        e: dict[str, Any],
        sel: dict[str, Any],
        index: dict[tuple[str, int], dict[str, Any]],
        core_bytes: bytes,
        proof_size: int,
        sel_path: str,
    ) -> tuple[str, tuple[int, int] | None, list[tuple[Instance, bytes | None]]]:
        """The derivation: the count rule, the ids, every slot's projection, then the
        acceptance candidate measured. Returns the outcome, the acceptance size when
        measured, and the projected children."""
        k, u, rev = e["number"], e["stage"], e["revision"]
        consumers = self.ctx.by_name[u].consumers
        slots = [(c, m) for c in consumers for m in sel["selected"]]
        child_ids = e["childIds"]
        children: list[tuple[Instance, bytes | None]] = []
        if self.reserved + len(slots) > self.limits["maxInstances"]:
            if child_ids is not None:
                raise _inv("the count refusal applies: childIds must be null", k, path=sel_path)
            return "refused", None, children
        if child_ids is None:
            raise _inv(
                "childIds is null although the reservation fits maxInstances", k, path=sel_path
            )
        if len(child_ids) != len(slots):
            raise _inv(f"{len(child_ids)} childIds for {len(slots)} child slots", k)
        if len(set(child_ids)) != len(child_ids):
            raise _inv("childIds repeats an id", k)
        for cid in child_ids:
            if cid in self.used_ids:
                raise _inv(f"child id {cid!r} is not fresh across the retained history", k)
        local_over = False
        for cid, (c, m) in zip(child_ids, slots, strict=True):
            inst, case = self._project(cid, c, m, u, index, k, rev)
            children.append((inst, case))
            if case is not None and len(case) > self.limits["maxCaseBytes"]:
                local_over = True
        if local_over:
            return "refused", None, children
        sel_digest = {"revision": rev, "digest": digest.of_bytes(core_bytes)}
        stages = self.stages_json({u: sel_digest}, {c: "closed" for c in consumers})
        new_bytes = len(core_bytes) + sum(len(cb) for _, cb in children if cb is not None)
        new_files = 1 + sum(1 for _, cb in children if cb is not None)
        sizes = sum(ch.measure() for ch, _ in children)
        ok, asize, afiles = self.fits(
            proof_size=proof_size,
            new_bytes=new_bytes,
            new_files=new_files,
            stages=stages,
            inst_total=self.inst_total + sizes,
            n_inst=len(self.inst) + len(children),
        )
        return ("admitted" if ok else "refused"), (asize, afiles), children

    def _settle_refused_selection(
        self,
        e: dict[str, Any],
        refused_file: bool,
        refusal_bytes: bytes,
        proof_size: int,
        sel_path: str,
        acceptance: tuple[int, int] | None,
    ) -> None:
        """A refusal: its carrier must fit and the file must be refusal-bearing."""
        k, kind, u = e["number"], e["kind"], e["stage"]
        carrier_sel: dict[str, dict[str, Any] | None] = {u: None} if kind == "fork" else {}
        ok, size, files = self.fits(
            proof_size=proof_size,
            new_bytes=len(refusal_bytes),
            new_files=1,
            stages=self.stages_json(carrier_sel),
        )
        if not ok:
            raise _inv(
                f"the refusal carrier ({size} bytes, {files} files) does not fit: unrecordable",
                k,
                path=sel_path,
            )
        if not refused_file:
            raise Problem(
                "selection-mismatch",
                4,
                "the derived outcome is a refusal but the selection is retained as admitted",
                path=sel_path,
                epoch=k,
            )
        if kind == "fork":
            self.selection[u] = None
        self.retain(sel_path, len(refusal_bytes), k)
        self._trace(k, None, kind, "refused", acceptance, (size, files))

    def _settle_admitted_selection(
        self,
        e: dict[str, Any],
        refused_file: bool,
        core_bytes: bytes,
        children: list[tuple[Instance, bytes | None]],
        sel_path: str,
    ) -> None:
        """An admission: the file must not be refusal-bearing, every case file must be
        the projected bytes (none for a projection-invalid slot); then apply it."""
        k, u, rev = e["number"], e["stage"], e["revision"]
        if refused_file:
            raise Problem(
                "selection-mismatch",
                4,
                "the complete acceptance candidate fits, yet the selection is retained as refused",
                path=sel_path,
                epoch=k,
            )
        for ch, case in children:
            cpath = layout.case_path(ch.id)
            if case is None:
                if cpath in self.tree.sizes:
                    raise Problem(
                        "case-mismatch",
                        4,
                        "a projection-invalid child has a case file",
                        path=cpath,
                        epoch=k,
                    )
                continue
            self._check_retained(
                cpath, case, "case-mismatch", "the retained case differs from the projected case", k
            )
        self.retain(sel_path, len(core_bytes), k)
        for ch, case in children:
            if case is not None:
                self.retain(layout.case_path(ch.id), len(case), k)
            self._set_instance(ch)
            self.by_stage[ch.stage].append(ch.id)
        for c in self.ctx.by_name[u].consumers:
            self.set_state[c] = "closed"
        self.selection[u] = {"revision": rev, "digest": digest.of_bytes(core_bytes)}
        self.reserved += len(children)
        self.reservations[k] = [ch.id for ch, _ in children]

    def _project(
        self,
        cid: str,
        consumer: str,
        m: dict[str, Any],
        u: str,
        index: dict[tuple[str, int], dict[str, Any]],
        k: int,
        rev: int,
    ) -> tuple[Instance, bytes | None]:
        rec = index[(m["instance"], m["output"])]
        ppath = layout.payload_path(u, m["instance"], rec["attempt"], m["output"])
        payload = orjson.loads(self._read(ppath))
        cdef = self.ctx.by_name[consumer]
        parent = {"instance": m["instance"], "output": m["output"]}
        selection = {"stage": u, "revision": rev}
        projected: Any
        if cdef.fields is None:
            projected = payload
        elif type(payload) is dict and all(f in payload for f in cdef.fields):
            projected = {f: payload[f] for f in cdef.fields}
        else:
            inst = Instance(cid, consumer, parent, selection, None, reservation=k)
            inst.base_state, inst.base_failure = "failed", "projection-invalid"
            return inst, None
        case = canon.dumps(
            {
                "caseVersion": 1,
                "stage": consumer,
                "instance": cid,
                "parent": parent,
                "input": projected,
            }
        )
        inst = Instance(cid, consumer, parent, selection, digest.of_bytes(case), reservation=k)
        if cdef.admit_max_bytes is not None and len(canon.dumps(projected)) > cdef.admit_max_bytes:
            inst.base_state, inst.base_failure = "failed", "admission-refused"
        return inst, case

    def _begin_candidate(self, k: int, e: dict[str, Any]) -> tuple[bytes, list[bytes], bytes]:
        head, results, tail = split_results(e)
        size = self.hasher.open_size(len(head) + len(tail))
        ok, total, files = self.fits(proof_size=size, new_bytes=0, new_files=0)
        if not ok:
            raise _inv(
                f"the begin candidate P({k},0) ({total} bytes, {files} files) does not fit: unrecordable",
                k,
            )
        self._trace(k, None, e["kind"], "begun", (total, files), None)
        return head, results, tail

    def group(self, e: dict[str, Any]) -> None:
        k, r = e["number"], e["reservation"]
        if r not in self.reservations:
            raise _inv(f"reservation {r} names no root or admitted selection/fork epoch", k)
        active = [i for i in self.reservations[r] if i in self.inst]
        if not active:
            raise _inv(f"reservation {r}: its instances are retired", k)
        order = {i: n for n, i in enumerate(active)}
        starts = [b["instance"] for b in e["starts"]]
        cancelled = [c["instance"] for c in e["cancelled"]]
        deferred = list(e["deferred"])
        named = starts + deferred + cancelled
        for i in named:
            if i in order and self.inst[i].derived_failure is not None:
                raise Problem(
                    "influence-mismatch",
                    4,
                    f"instance {i!r} is derived {self.inst[i].derived_failure}: it is not an eligible slot",
                    epoch=k,
                )
        if len(set(named)) != len(named):
            raise _inv("starts, deferred and cancelled repeat an instance", k)
        eligible = {
            i for i in active if self.inst[i].state == "interrupted" and not self.inst[i].attempts
        }
        if set(named) != eligible:
            extra = sorted(set(named) - eligible)
            missing = sorted(eligible - set(named))
            raise _inv(
                f"not a partition of the eligible slots: not eligible {extra}, omitted {missing}", k
            )
        for what, ids in (("starts", starts), ("deferred", deferred), ("cancelled", cancelled)):
            idx = [order[i] for i in ids]
            if idx != sorted(idx):
                raise _inv(f"{what} is not in reservation order", k)
        if not starts and not cancelled:
            raise _inv("a defer-only group is invalid", k)
        for i in starts + cancelled:
            if self.selection[self.inst[i].stage] is not None:
                raise _inv(
                    f"instance {i!r}: its stage's offered set is consumed (a fork is required)", k
                )
        for b in e["starts"]:
            if b["number"] != 1:
                raise _inv(f"instance {b['instance']!r}: a first begin has number 1", k)
        for b in e["starts"]:
            inst = self.inst[b["instance"]]
            inst.attempts.append(Attempt(1, "interrupted", None, None, dict.fromkeys(PINS)))
            self._set_instance(inst)
        for i in cancelled:
            inst = self.inst[i]
            inst.base_state, inst.base_failure = "cancelled", None
            self._set_instance(inst)
        head, results, tail = self._begin_candidate(k, e)
        self._observe_all(k, e, e["starts"], head, results, tail)

    def retry(self, e: dict[str, Any]) -> None:
        k, b = e["number"], e["begin"]
        i = b["instance"]
        inst = self.inst.get(i)
        if inst is None:
            raise _inv(f"retry of {i!r}: not an active instance", k)
        if inst.state not in ("failed", "interrupted") or not inst.attempts:
            raise _inv(f"retry of {i!r}: only a begun failed or interrupted instance is retried", k)
        if self.selection[inst.stage] is not None:
            raise _inv(
                f"retry of {i!r}: its stage's offered set is consumed (a fork is required)", k
            )
        if b["number"] != len(inst.attempts) + 1:
            raise _inv(
                f"retry of {i!r}: attempt {b['number']} where {len(inst.attempts) + 1} is next", k
            )
        if b["number"] > self.limits["maxAttempts"]:
            raise _inv(f"retry of {i!r}: attempt {b['number']} exceeds maxAttempts", k)
        inst.attempts.append(
            Attempt(b["number"], "interrupted", None, b["retry"], dict.fromkeys(PINS))
        )
        self._set_instance(inst)
        head, results, tail = self._begin_candidate(k, e)
        self._observe_all(k, e, [b], head, results, tail)

    def _observe_all(
        self,
        k: int,
        e: dict[str, Any],
        begins: list[dict[str, Any]],
        head: bytes,
        results: list[bytes],
        tail: bytes,
    ) -> None:
        cutoff: set[str] = set()
        body = len(head) + len(tail)
        for j, (obs, raw) in enumerate(zip(e["results"], results, strict=False), 1):
            body += len(raw) + (1 if j > 1 else 0)
            self.observe(k, j, obs, begins[j - 1], cutoff, self.hasher.open_size(body))
        if len(e["results"]) == len(begins):
            self.hasher.close(head + b",".join(results) + tail)
        else:
            self.open_epoch = True

    def observe(
        self,
        k: int,
        j: int,
        o: dict[str, Any],
        begin: dict[str, Any],
        cutoff: set[str],
        proof_size: int,
    ) -> None:
        """Observation j of epoch k, in verify.md's order: it names the next begin, its
        pins follow the pin table, its sidecar belongs to one attempt; the outcome is
        derived (an evaluated proposal measured), its candidate must fit, and the
        retained outputs must be exactly the accepted ones."""
        if o["instance"] != begin["instance"] or o["number"] != begin["number"]:
            raise _inv(
                f"observation names {o['instance']!r}/{o['number']} where "
                f"{begin['instance']!r}/{begin['number']} is the next begin",
                k,
                j,
            )
        inst = self.inst[o["instance"]]
        stage = self.ctx.by_name[inst.stage]
        n = o["number"]
        state, failure = o["state"], o["failure"]
        present = {p for p in PINS if o[p] is not None}
        self._check_pins(state, failure, present, k, j, o, cutoff, stage.name)
        self._claim_sidecar(o, inst.id, k, j)
        received = [
            (path, self.tree.sizes[path])
            for path in (layout.attempt_file(inst.id, n, p) for p in PINS if o[p] is not None)
        ]
        new_bytes = sum(size for _, size in received)
        pins = {p: o[p] for p in PINS}
        accepted: list[tuple[str, bytes]] = []
        acceptance: tuple[int, int] | None = None
        outcome = "recorded"
        final: tuple[str, str | None]
        if state == "evaluated":
            final, outcome, accepted, acceptance = self._evaluate(
                k, j, inst, n, stage, pins, received, cutoff, proof_size
            )
        elif state == "suppressed":
            final = ("failed", "limit-exceeded")
        else:
            final = (state, failure)
        att = inst.attempts[-1]
        att.state, att.failure, att.pins = final[0], final[1], pins
        self._set_instance(inst)
        if outcome != "accepted":
            # the one candidate for this outcome (a refusal carrier included) must fit
            ok, size, nfiles = self.fits(
                proof_size=proof_size, new_bytes=new_bytes, new_files=len(received)
            )
            if not ok:
                raise _inv(
                    f"the {final[0]}/{final[1]} candidate ({size} bytes, {nfiles} files) does not fit: "
                    "unrecordable, so no valid export holds it",
                    k,
                    j,
                )
            self._trace(k, j, "observation", outcome, acceptance, (size, nfiles))
        else:
            self._trace(k, j, "observation", outcome, acceptance, None)
        for path, size in received:
            self.retain(path, size, k, j)
        self._check_outputs(k, j, f"outputs/{stage.name}/{inst.id}/{n}/", accepted, final)

    def _claim_sidecar(self, o: dict[str, Any], instance: str, k: int, j: int) -> None:
        """One signature sidecar, one attempt (our choice, verify.md "Resolutions")."""
        sig = o["auditSignaturesDigest"]
        if sig is None:
            return
        if sig in self.sig_owner:
            owner = self.sig_owner[sig]
            raise _inv(
                f"the audit signature sidecar belongs to {owner[0]!r} attempt {owner[1]}: one sidecar, one attempt",
                k,
                j,
                layout.attempt_file(instance, o["number"], "auditSignaturesDigest"),
            )
        self.sig_owner[sig] = (instance, o["number"])

    def _outputs_of(
        self, stage: StageDef, inst: Instance, n: int, proposal: list[bytes]
    ) -> tuple[list[tuple[str, bytes]], list[dict[str, Any]]]:
        """Payload and envelope files of a proposal, and the set records they add."""
        files: list[tuple[str, bytes]] = []
        records: list[dict[str, Any]] = []
        # independent of the writer on purpose: the envelope form is built again here,
        # not taken from writer/_derive.py; the reader derives every file it expects
        # from the spec alone (DESIGN.md)
        for idx, payload in enumerate(proposal):
            pd = digest.of_bytes(payload)
            env = control_dumps(
                {
                    "envelopeVersion": 1,
                    "stage": stage.name,
                    "instance": inst.id,
                    "attempt": n,
                    "output": idx,
                    "payloadDigest": pd,
                    "parent": inst.parent,
                }
            )
            files.append((layout.payload_path(stage.name, inst.id, n, idx), payload))
            files.append((layout.envelope_path(stage.name, inst.id, n, idx), env))
            records.append(
                {
                    "instance": inst.id,
                    "attempt": n,
                    "output": idx,
                    "payloadDigest": pd,
                    "envelopeDigest": digest.of_bytes(env),
                }
            )
        return files, records

    def _evaluate(
        self,
        k: int,
        j: int,
        inst: Instance,
        n: int,
        stage: StageDef,
        pins: dict[str, Any],
        received: list[tuple[str, int]],
        cutoff: set[str],
        proof_size: int,
    ) -> tuple[tuple[str, str | None], str, list[tuple[str, bytes]], tuple[int, int] | None]:
        """An evaluated audit's outcome: output-invalid, cut off, or its acceptance
        candidate measured (local bounds first). Returns (final state/failure, outcome,
        the accepted files, the acceptance size when measured)."""
        proposal = self._proposal(inst.id, n, stage, k, j)
        if proposal is None:
            return ("failed", "output-invalid"), "recorded", [], None
        if stage.name in cutoff:
            return ("failed", "limit-exceeded"), "cut-off", [], None
        files, records = self._outputs_of(stage, inst, n, proposal)
        final: tuple[str, str | None] = (
            ("completed", None) if proposal else ("completed-zero", None)
        )
        local_ok = self.records_total + len(proposal) <= self.limits["maxRecords"] and all(
            len(pl) <= self.limits["maxPayloadBytes"] for pl in proposal
        )
        ok = False
        acceptance: tuple[int, int] | None = None
        if local_ok:
            att = inst.attempts[-1]
            att.state, att.failure, att.pins = final[0], None, pins
            new_size = inst.measure()
            rec_bytes = sum(len(control_dumps(r)) for r in records)
            ok, asize, afiles = self.fits(
                proof_size=proof_size,
                new_bytes=sum(size for _, size in received) + sum(len(b) for _, b in files),
                new_files=len(received) + len(files),
                inst_total=self.inst_total - self.sizes[inst.id] + new_size,
                set_extra={stage.name: (rec_bytes, len(records))},
            )
            acceptance = (asize, afiles)
        if not ok:
            cutoff.add(stage.name)
            return ("failed", "limit-exceeded"), "refused", [], acceptance
        if records:
            self.inst_records[inst.id] = records
            self.record_count[stage.name] += len(records)
            self.record_size[stage.name] += rec_bytes
            self.records_total += len(records)
        return final, "accepted", files, acceptance

    def _check_outputs(
        self,
        k: int,
        j: int,
        odir: str,
        accepted: list[tuple[str, bytes]],
        final: tuple[str, str | None],
    ) -> None:
        """The writer's evidence must agree with the derived outcome (output-mismatch)."""
        have = self.output_dirs.get(odir, 0)
        if accepted and have == 0:
            raise Problem(
                "output-mismatch",
                4,
                "the complete acceptance candidate fits, yet the bundle holds none of its outputs "
                "(a refusal the retained inputs do not justify)",
                path=accepted[0][0],
                epoch=k,
                observation=j,
            )
        if not accepted and have:
            raise Problem(
                "output-mismatch",
                4,
                f"outputs are retained for a proposal derived {final[0]}/{final[1]}",
                path=odir,
                epoch=k,
                observation=j,
            )
        if accepted and have != len(accepted):
            raise Problem(
                "output-mismatch",
                4,
                f"{have} output files where the derived proposal has {len(accepted)}",
                path=odir,
                epoch=k,
                observation=j,
            )
        for path, data in accepted:
            self._check_retained(
                path,
                data,
                "output-mismatch",
                "the retained output differs from the derived one",
                k,
                j,
            )
            self.retain(path, len(data), k, j)

    def _check_pins(
        self,
        state: str,
        failure: str | None,
        present: set[str],
        k: int,
        j: int,
        o: dict[str, Any],
        cutoff: set[str],
        stage: str,
    ) -> None:
        """workflow.md §9's table, run/audit/error/signature columns (phase 3 owns preparation)."""
        run = "runDigest" in present
        audit = "auditDigest" in present
        err = "evaluationErrorDigest" in present
        sig = "auditSignaturesDigest" in present
        if sig and not audit:
            raise _inv("a signature sidecar requires an audit", k, j)
        rules: dict[tuple[str, str | None], tuple[bool | None, bool, bool]] = {
            # (run required? None = optional, audit allowed, error allowed)
            ("evaluated", None): (True, True, False),
            ("failed", "acquisition-failed"): (None, False, False),
            ("failed", "preparation-failed"): (True, False, False),
            ("failed", "admission-refused"): (True, False, False),
            ("failed", "evaluation-error"): (True, False, True),
            ("interrupted", None): (None, False, False),
            ("cancelled", None): (None, False, False),
            ("suppressed", None): (False, False, False),
        }
        need_run, audit_ok, err_ok = rules[(state, failure)]
        if need_run is True and not run:
            raise _inv(f"{state}/{failure} requires a run export", k, j)
        if need_run is False and run:
            raise _inv(f"{state} has no run export", k, j)
        if state == "evaluated" and not audit:
            raise _inv("evaluated requires an audit", k, j)
        if audit and not audit_ok:
            raise _inv(
                f"{state}/{failure} cannot carry an audit (a complete evaluation is not concealed)",
                k,
                j,
            )
        if err != err_ok:
            raise _inv(
                f"{state}/{failure}: evaluation-error pin {'required' if err_ok else 'not allowed'}",
                k,
                j,
            )
        if state == "suppressed" and stage not in cutoff:
            raise _inv("suppressed requires an earlier cutoff of the stage in this epoch", k, j)

    def _proposal(
        self, inst_id: str, n: int, stage: StageDef, k: int, j: int
    ) -> list[bytes] | None:
        """The ordered payload bytes of a valid output proposal, or None for a bad shape."""
        path = layout.attempt_file(inst_id, n, "auditDigest")
        audit = orjson.loads(self._read(path))
        found, value = _resolve_pointer(audit, stage.pointer)
        if not found:
            return None
        if stage.cardinality == "one":
            return [canon.dumps(value)] if type(value) is dict else None
        if type(value) is not list or any(type(v) is not dict for v in value):
            return None
        return [canon.dumps(v) for v in value]

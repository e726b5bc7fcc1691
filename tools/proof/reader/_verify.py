"""The five phases of RFC 0024 §8, in order; the first problem ends the reading.

Phase 1 (forms and bounds) reads every file of the bundle once, bounded and
without following links, and records each file's digest. Phase 2 checks pins and
the proof chain, phase 3 the preparation claims, phase 4 replays the epochs
(:mod:`crucible.proof.reader._replay`), phase 5 compares the reconstruction with
the supplied control files and inventory. See docs/spec/verify.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crucible.core import canon, digest
from crucible.proof import layout
from crucible.proof.reader import _forms as forms
from crucible.proof.reader._bundle import BundleTree, walk_bundle
from crucible.proof.reader._chain import PrefixHasher
from crucible.proof.reader._findings import Problem
from crucible.proof.reader._model import PINS, StageDef, control_dumps
from crucible.proof.reader._proofstream import Proof, load_proof
from crucible.proof.reader._replay import Context, Replay
from crucible.proof.reader._report import Counts, Reading, Report
from crucible.proof.reader._strict import JsonBounds, parse_json

__all__ = ["VerifyOptions", "verify_bundle"]

#: phase-1 precedence among refusal codes (RFC 0024 §8)
_PRECEDENCE = (
    "input-over-bound",
    "input-malformed",
    "version-unread",
    "inventory-mismatch",
    "kind-unread",
)
#: the proof's structural ceilings (admission-proof.md §1) and those of every other JSON
#: file (our choice: nesting 64 as workflow.md §1; containers bounded by maxBytes)
_PROOF_BOUNDS = JsonBounds(depth=64, members=layout.MAX_PROOF_ARRAY, string_bytes=65536)
_FILE_BOUNDS = JsonBounds(depth=64, members=1 << 22, string_bytes=layout.MAX_RECEIVED_FILE_BYTES)
#: control files are bounded by maxBytes (checked from the walk) and this hard cap
_CONTROL_CAP = 1 << 30
#: a walk never visits more entries than this (our choice; far above any maxFiles we accept)
MAX_ENTRIES = 1 << 20


@dataclass(frozen=True)
class VerifyOptions:
    expect: dict[str, Any] | None = None
    #: the proof's byte ceiling (RFC 0024 §1: 8 MiB); raised only by the benchmark
    proof_ceiling: int = layout.MAX_PROOF_BYTES


class _Collector:
    """Phase-1 problems, so the most senior code is reported whatever is met first."""

    def __init__(self) -> None:
        self.first: dict[str, Problem] = {}

    def note(self, p: Problem) -> None:
        self.first.setdefault(p.code, p)

    def settle(self) -> None:
        for code in _PRECEDENCE:
            if code in self.first:
                raise self.first[code]


@dataclass
class _Loaded:
    tree: BundleTree
    workflow: dict[str, Any]
    #: the proof's root members (without epochBlocks)
    proof: dict[str, Any]
    #: the supplied execution's members except its instances (compared in phase 5)
    execution: dict[str, Any]
    epochs: Proof
    digests: dict[str, str]
    selections: dict[tuple[str, int], tuple[dict[str, Any], bool]]
    stages: list[StageDef]
    partial: dict[str, Any] | None


def verify_bundle(root: Path, options: VerifyOptions | None = None) -> Report:
    """Read ``root`` to a verdict. Raises :class:`Inability` when no verdict is reachable."""
    options = options or VerifyOptions()
    try:
        loaded = _phase1(root, options)
        _phase2(loaded, options)
        _phase3(loaded)
        replay = Replay(
            Context(
                tree=loaded.tree,
                limits=loaded.workflow["limits"],
                stages=loaded.stages,
                proof=loaded.proof,
                epochs=loaded.epochs,
                selections=loaded.selections,
            )
        )
        replay.run()
        reading = _phase5(loaded, replay)
    except Problem as problem:
        return Report(problem=problem)
    return Report(reading=reading)


# ---------------------------------------------------------------- phase 1


def _stage_defs(wf: dict[str, Any]) -> list[StageDef]:
    defs = [
        StageDef(
            s["name"],
            s["input"]["fromStage"],
            s["input"]["fields"],
            s["input"]["admitMaxBytes"],
            s["output"]["pointer"],
            s["output"]["cardinality"],
        )
        for s in wf["stages"]
    ]
    by = {d.name: d for d in defs}
    for d in defs:
        if d.from_stage is not None:
            by[d.from_stage].consumers.append(d.name)
    return defs


def _is_control(path: str) -> bool:
    return path == layout.EXECUTION or (path.startswith("sets/") and path.count("/") == 1)


def _ceiling(path: str, options: VerifyOptions) -> int:
    if path == layout.ADMISSION_PROOF:
        return options.proof_ceiling
    if path.endswith("/audit.sig"):
        return layout.MAX_SIGNATURE_BYTES
    if _is_control(path):
        return _CONTROL_CAP
    return layout.MAX_RECEIVED_FILE_BYTES


def _phase1(root: Path, options: VerifyOptions) -> _Loaded:
    col = _Collector()
    tree = walk_bundle(root, max_entries=MAX_ENTRIES)
    for path, size in tree.sizes.items():
        ceiling = _ceiling(path, options)
        if size > ceiling:
            col.note(
                Problem(
                    "input-over-bound",
                    1,
                    f"{size} bytes exceed the ceiling of {ceiling}",
                    path=path,
                )
            )
    if "input-over-bound" in col.first:
        col.settle()  # refused from sizes alone, before any byte is read
    if tree.irregular is not None:
        col.note(
            Problem(
                "input-malformed",
                1,
                "not a regular file or directory (links are never followed)",
                path=tree.irregular,
            )
        )
    if tree.bad_name is not None:
        col.note(Problem("input-malformed", 1, "not a portable file name", path=tree.bad_name))
    for p in (
        layout.WORKFLOW,
        layout.ADMISSION_PROOF,
        layout.ADMISSION_PROOF_DIGEST,
        layout.EXECUTION,
        layout.ROOT_CASE,
    ):
        if p not in tree.sizes:
            col.note(Problem("inventory-mismatch", 1, "a required file is missing", path=p))
    if layout.WORKFLOW not in tree.sizes or layout.ADMISSION_PROOF not in tree.sizes:
        col.settle()

    digests: dict[str, str] = {}

    def load(path: str, *, canonical: bool) -> Any:
        data = tree.read(path, _ceiling(path, options))
        digests[path] = digest.of_bytes(data)
        bounds = _PROOF_BOUNDS if path == layout.ADMISSION_PROOF else _FILE_BOUNDS
        return parse_json(data, path, bounds, canonical=canonical)

    parsed: dict[str, Any] = {}
    limits: dict[str, int] | None = None
    try:
        parsed[layout.WORKFLOW] = load(layout.WORKFLOW, canonical=True)
        forms.check_workflow(parsed[layout.WORKFLOW], layout.WORKFLOW)
        limits = parsed[layout.WORKFLOW]["limits"]
    except Problem as exc:
        col.note(exc)
    # The supplied total is a bound (input-over-bound), senior to every malformed file.
    # partial.json is a label, never charged (admission-proof.md §9)
    label = tree.sizes.get(layout.PARTIAL)
    supplied_bytes = tree.total_bytes - (label or 0)
    supplied_files = len(tree.sizes) - (label is not None)
    if limits is not None and (
        supplied_bytes > limits["maxBytes"] or supplied_files > limits["maxFiles"]
    ):
        col.note(
            Problem(
                "input-over-bound",
                1,
                f"the export holds {supplied_bytes} bytes in {supplied_files} files "
                f"(maxBytes {limits['maxBytes']}, maxFiles {limits['maxFiles']})",
            )
        )
        col.settle()
    # The execution first, reduced to its top-level members at once: its instances are
    # rebuilt and compared in phase 5, so the parsed copy never coexists with the proof.
    if layout.EXECUTION in tree.sizes:
        try:
            supplied = load(layout.EXECUTION, canonical=True)
            forms.check_execution(supplied)
            parsed[layout.EXECUTION] = {k: v for k, v in supplied.items() if k != "instances"}
        except Problem as exc:
            col.note(exc)
        supplied = None
    if layout.ADMISSION_PROOF in tree.sizes:
        try:
            data = tree.read(layout.ADMISSION_PROOF, options.proof_ceiling)
            digests[layout.ADMISSION_PROOF] = digest.of_bytes(data)
            parsed[layout.ADMISSION_PROOF] = load_proof(data, layout.ADMISSION_PROOF, _PROOF_BOUNDS)
        except Problem as exc:
            col.note(exc)
    if layout.ADMISSION_PROOF not in parsed or limits is None:
        col.settle()  # without the workflow's limits nothing further can be bounded
    wf, proof = parsed[layout.WORKFLOW], parsed[layout.ADMISSION_PROOF]
    try:
        forms.check_proof_root(proof.root, proof.blocks, layout.ADMISSION_PROOF)
    except Problem as exc:
        col.note(exc)
    if any(c in col.first for c in ("input-over-bound", "input-malformed", "version-unread")):
        col.settle()

    epochs: Proof = proof
    for number, e in enumerate(epochs, 1):
        try:
            forms.check_epoch(e, number)
        except Problem as exc:
            col.note(exc)
            if exc.code != "kind-unread":
                break
            continue
        if number < len(epochs) and e["kind"] in ("group", "retry"):
            begins = len(e["starts"]) if e["kind"] == "group" else 1
            if len(e["results"]) < begins:
                col.note(
                    Problem(
                        "input-malformed",
                        1,
                        "an open epoch admits no later epoch",
                        path=layout.ADMISSION_PROOF,
                        epoch=number,
                    )
                )
                break

    if layout.ADMISSION_PROOF_DIGEST in tree.sizes:
        side = tree.read(layout.ADMISSION_PROOF_DIGEST, 4096)
        digests[layout.ADMISSION_PROOF_DIGEST] = digest.of_bytes(side)
        if (
            len(side) != 72
            or not digest.is_digest(side[:-1].decode("ascii", "replace"))
            or side[-1:] != b"\n"
        ):
            col.note(
                Problem(
                    "input-malformed",
                    1,
                    "not sha256:<64 hex> and a newline",
                    path=layout.ADMISSION_PROOF_DIGEST,
                )
            )
    execution: dict[str, Any] = parsed.get(layout.EXECUTION, {})

    stages = _stage_defs(wf) if "input-malformed" not in col.first else []
    stage_names = {s.name for s in stages}
    selections: dict[tuple[str, int], tuple[dict[str, Any], bool]] = {}
    partial: dict[str, Any] | None = None
    run_finished: dict[str, Any] = {}
    for path in tree.sizes:
        if path in parsed or path == layout.ADMISSION_PROOF_DIGEST:
            continue
        try:
            kind = _classify(path, stage_names)
            if kind == "raw":
                digests[path] = digest.of_bytes(tree.read(path, _ceiling(path, options)))
            elif kind == "sig":
                data = tree.read(path, _ceiling(path, options))
                digests[path] = digest.of_bytes(data)
                if not data:
                    col.note(Problem("input-malformed", 1, "an empty signature sidecar", path=path))
            elif kind == "unknown":
                col.note(
                    Problem(
                        "inventory-mismatch",
                        1,
                        "the path matches no row of the closed path table (workflow.md §10)",
                        path=path,
                    )
                )
            else:
                value = load(path, canonical=kind in ("canonical", "selection", "partial", "audit"))
                if kind in ("strict-object", "audit", "run") and type(value) is not dict:
                    col.note(Problem("input-malformed", 1, "not a JSON object", path=path))
                elif kind == "selection":
                    refused = forms.check_selection(value, path)
                    parts = path.split("/")
                    selections[(parts[1], int(parts[2][: -len(".json")]))] = (value, refused)
                elif kind == "run":
                    run_finished[path] = forms.check_run(value, path)
                elif kind == "partial":
                    forms.check_partial(value, path)
                    partial = value
        except Problem as exc:
            col.note(exc)
    if (
        "input-over-bound" in col.first
        or "input-malformed" in col.first
        or "version-unread" in col.first
    ):
        col.settle()

    # Missing non-null pinned artifacts, and the finishedAt rule (RFC 0024 §5).
    root_case = layout.case_path(proof.root["rootInstance"])
    if root_case not in tree.sizes:
        col.note(Problem("inventory-mismatch", 1, "the root case is missing", path=root_case))
    for s in stages:
        for p in (layout.frozen_path(s.name), layout.set_path(s.name)):
            if p not in tree.sizes:
                col.note(Problem("inventory-mismatch", 1, "a required file is missing", path=p))
    for e in epochs:
        k = e.get("number")
        if e.get("kind") in ("selection", "fork"):
            p = layout.selection_path(e["stage"], e["revision"])
            if p not in tree.sizes:
                col.note(
                    Problem(
                        "inventory-mismatch",
                        1,
                        "the epoch's selection file is missing",
                        path=p,
                        epoch=k,
                    )
                )
        if e.get("kind") not in ("group", "retry"):
            continue
        for j, o in enumerate(e["results"], 1):
            for pin in PINS:
                if o[pin] is None:
                    continue
                p = layout.attempt_file(o["instance"], o["number"], pin)
                if p not in tree.sizes:
                    col.note(
                        Problem(
                            "inventory-mismatch",
                            1,
                            f"{pin} is pinned but its file is missing",
                            path=p,
                            epoch=k,
                            observation=j,
                        )
                    )
            run_path = layout.attempt_file(o["instance"], o["number"], "runDigest")
            needs_time = o["failure"] == "preparation-failed" or (
                o["failure"] == "admission-refused" and o["preparationDigest"] is None
            )
            if needs_time and run_path in run_finished and run_finished[run_path] is None:
                col.note(
                    Problem(
                        "input-malformed",
                        1,
                        f"{o['failure']} without a preparation needs finishedAt: the instant of the failing check",
                        path=run_path,
                        epoch=k,
                        observation=j,
                    )
                )
    col.settle()
    return _Loaded(
        tree=tree,
        workflow=wf,
        proof=proof.root,
        execution=execution,
        epochs=epochs,
        digests=digests,
        selections=selections,
        stages=stages,
        partial=partial,
    )


def _classify(path: str, stages: set[str]) -> str:
    """How a bundle path is read in phase 1 (workflow.md §10); "unknown" is an inventory refusal."""
    parts = path.split("/")
    if path == layout.ROOT_CASE:
        return "canonical"
    if path == layout.PARTIAL:
        return "partial"
    if path in ("README.md",) or path.startswith(layout.AUX_DIR):
        return "raw"
    if path in ("trust.json", "expected-report.json"):
        return "strict"
    if len(parts) == 2 and parts[0] in ("frozen", "sets") and parts[1].endswith(".json"):
        return "canonical"
    if len(parts) == 3 and parts[0] == "selections" and parts[2].endswith(".json"):
        rev = parts[2][: -len(".json")]
        if rev.isdigit() and not rev.startswith("0") and len(rev) <= 2:
            return "selection"
        return "unknown"
    if len(parts) == 3 and parts[0] == "instances" and parts[2] == "case.json":
        return "canonical"
    if len(parts) == 5 and parts[0] == "instances" and parts[2] == "attempts":
        return {
            "run.json": "run",
            "preparation.json": "strict-object",
            "audit.json": "audit",
            "evaluation-error.json": "strict-object",
            "audit.sig": "sig",
        }.get(parts[4], "unknown")
    if (
        len(parts) == 5
        and parts[0] == "outputs"
        and parts[4].endswith((".payload.json", ".envelope.json"))
    ):
        return "canonical"
    return "unknown"


# ---------------------------------------------------------------- phase 2


def _mismatch(
    msg: str, path: str | None = None, epoch: int | None = None, obs: int | None = None
) -> Problem:
    return Problem("digest-mismatch", 2, msg, path=path, epoch=epoch, observation=obs)


def _phase2(ld: _Loaded, options: VerifyOptions) -> None:
    proof, ex, d = ld.proof, ld.execution, ld.digests
    proof_digest = d[layout.ADMISSION_PROOF]
    expect = options.expect or {}
    held = {
        "admissionProofDigest": proof_digest,
        "workflowDigest": d[layout.WORKFLOW],
        "rootCaseDigest": d.get(layout.ROOT_CASE),
        "frozenDigest": proof["frozenDigest"],
        "execution": proof["execution"],
        "epochs": len(ld.epochs),
    }
    for key, value in expect.items():
        if held[key] != value:
            raise _mismatch(
                f"{key} is {held[key]!r}, the independently held expectation is {value!r}"
            )
    # in the order of admission-proof.md §10: workflow, proof pin, chain, frozen, root case
    if proof["workflowDigest"] != d[layout.WORKFLOW]:
        raise _mismatch("workflowDigest is not the workflow's digest", layout.ADMISSION_PROOF)
    if ex["workflowDigest"] != d[layout.WORKFLOW]:
        raise _mismatch("workflowDigest is not the workflow's digest", layout.EXECUTION)
    if ex["execution"] != proof["execution"]:
        raise _mismatch("the execution id differs from the proof's", layout.EXECUTION)
    if ex["admissionProofDigest"] != proof_digest:
        raise _mismatch("admissionProofDigest is not the proof's digest", layout.EXECUTION)
    sidecar = ld.tree.read(layout.ADMISSION_PROOF_DIGEST, 4096)
    if sidecar != (proof_digest + "\n").encode():
        raise _mismatch(
            "the sidecar does not hold the proof's digest", layout.ADMISSION_PROOF_DIGEST
        )
    # the chain: each epoch names the digest of the preceding closed prefix
    hasher = PrefixHasher(proof)
    for e, raw in zip(ld.epochs, ld.epochs.epoch_bytes(), strict=True):
        k = e["number"]
        if e["previousProofDigest"] != hasher.digest():
            raise _mismatch(
                f"previousProofDigest does not name P({k - 1}), the preceding closed prefix",
                layout.ADMISSION_PROOF,
                k,
            )
        hasher.close(raw)
    frozen = [{"stage": s.name, "digest": d[layout.frozen_path(s.name)]} for s in ld.stages]
    if digest.of_json(frozen) != proof["frozenDigest"]:
        raise _mismatch(
            "frozenDigest is not the digest of the frozen stage pins", layout.ADMISSION_PROOF
        )
    if ex["frozen"] != frozen:
        raise _mismatch(
            "the execution's frozen pins differ from the frozen files", layout.EXECUTION
        )
    for p in (layout.ROOT_CASE, layout.case_path(proof["rootInstance"])):
        if d[p] != proof["rootCaseDigest"]:
            raise _mismatch("the root case is not the pinned rootCaseDigest", p)
    # every retained artifact pin, retired ones included
    for e in ld.epochs:
        k = e["number"]
        if e["kind"] in ("selection", "fork"):
            p = layout.selection_path(e["stage"], e["revision"])
            sel = ld.selections.get((e["stage"], e["revision"]))
            if sel is None:
                raise Problem(
                    "inventory-mismatch",
                    1,
                    "the epoch's selection file is missing",
                    path=p,
                    epoch=k,
                )
            core = {m: v for m, v in sel[0].items() if m != "refusal"}
            if digest.of_json(core) != e["selectionCoreDigest"]:
                raise _mismatch("the selection core is not the pinned selectionCoreDigest", p, k)
        elif e["kind"] in ("group", "retry"):
            for j, o in enumerate(e["results"], 1):
                for pin in PINS:
                    if o[pin] is not None:
                        p = layout.attempt_file(o["instance"], o["number"], pin)
                        if d.get(p) != o[pin]:
                            raise _mismatch(f"the file is not the pinned {pin}", p, k, j)
    # frozen binding: each frozen file is its stage exactly as the workflow defines it
    for i, s in enumerate(ld.workflow["stages"]):
        p = layout.frozen_path(s["name"])
        if ld.tree.read(p, layout.MAX_RECEIVED_FILE_BYTES) != canon.dumps(s):
            raise Problem(
                "stage-binding-mismatch",
                2,
                f"frozen stage {i} differs from the workflow's definition",
                path=p,
            )


# ---------------------------------------------------------------- phase 3


def _phase3(ld: _Loaded) -> None:
    """Preparation claims (docs/spec/verify.md, "Phase 3"): the preparation column of
    workflow.md §9's table, in begin-epoch then member order. Preparations are opaque
    in our profile, so their content, profiles and verifiedAt are out of reach."""
    for e in ld.epochs:
        if e["kind"] not in ("group", "retry"):
            continue
        k = e["number"]
        for j, o in enumerate(e["results"], 1):
            prep = o["preparationDigest"] is not None
            claim = (o["state"], o["failure"])
            path = layout.attempt_file(o["instance"], o["number"], "preparationDigest")

            def bad(msg: str, path: str = path, k: int = k, j: int = j) -> Problem:
                return Problem("preparation-mismatch", 3, msg, path=path, epoch=k, observation=j)

            if prep and o["runDigest"] is None:
                raise bad("a preparation requires its run export")
            if prep and claim in (
                ("failed", "acquisition-failed"),
                ("failed", "preparation-failed"),
                ("suppressed", None),
            ):
                raise bad(f"a retained preparation contradicts {claim[0]}/{claim[1]}")
            if not prep and claim in (("evaluated", None), ("failed", "evaluation-error")):
                raise bad(f"{claim[0]}/{claim[1]} requires a valid preparation")


# ---------------------------------------------------------------- phase 5


def _phase5(ld: _Loaded, rp: Replay) -> Reading:
    proof_digest = ld.digests[layout.ADMISSION_PROOF]
    if rp.execution_digest(proof_digest) != ld.digests[layout.EXECUTION]:
        derived = rp.execution_json(proof_digest)
        supplied = canon.loads(ld.tree.read(layout.EXECUTION, _CONTROL_CAP))
        raise Problem(
            "inventory-mismatch", 5, _first_difference(derived, supplied), path=layout.EXECUTION
        )
    for s in ld.stages:
        p = layout.set_path(s.name)
        want = control_dumps({"setVersion": 1, "stage": s.name, "records": rp.offered(s.name)})
        if ld.tree.read(p, layout.MAX_RECEIVED_FILE_BYTES) != want:
            raise Problem(
                "inventory-mismatch",
                5,
                "the set differs from the reconstructed offered set",
                path=p,
            )
    controls = {layout.EXECUTION, layout.ADMISSION_PROOF, layout.ADMISSION_PROOF_DIGEST}
    controls.update(layout.set_path(s.name) for s in ld.stages)
    for p in rp.retained:
        if p not in ld.tree.sizes:
            raise Problem("inventory-mismatch", 5, "required history is missing", path=p)
    for p in ld.tree.sizes:
        if p in rp.retained or p in controls or layout.is_finalization_path(p):
            continue
        raise Problem("inventory-mismatch", 5, "a file no transition derived", path=p)
    if rp.open_epoch and ld.partial is None:
        raise Problem(
            "inventory-mismatch",
            5,
            "the export ends at an open epoch but does not say it is partial",
            path=layout.PARTIAL,
        )
    if ld.partial is not None and ld.partial["reason"] == "open-epoch" and not rp.open_epoch:
        raise Problem(
            "inventory-mismatch",
            5,
            "partial.json claims an open epoch; the last epoch is closed",
            path=layout.PARTIAL,
        )
    complete = (
        not rp.open_epoch
        and ld.partial is None
        and all(st == "closed" for st in rp.set_state.values())
        and all(rp.selection[s.name] is not None for s in ld.stages if s.consumers)
        and all(i.state in ("completed", "completed-zero") for i in rp.inst.values())
    )
    counts = Counts(
        stages=sum(1 for st in rp.set_state.values() if st == "closed"),
        instances=len(rp.inst),
        outputs=sum(rp.record_count.values()),
        selections=sum(1 for v in rp.selection.values() if v is not None),
    )
    return Reading(
        completion="complete" if complete else "partial",
        counts=counts,
        epochs=len(ld.epochs),
        proof_digest=proof_digest,
    )


def _first_difference(derived: dict[str, Any], supplied: dict[str, Any]) -> str:
    for key in derived:
        if derived[key] == supplied.get(key):
            continue
        if key == "instances" and type(supplied.get(key)) is list:
            got = {
                i["id"]: i for i in supplied[key] if type(i) is dict and type(i.get("id")) is str
            }
            for inst in derived[key]:
                if got.get(inst["id"]) != inst:
                    if inst["id"] not in got:
                        return f"active instance {inst['id']!r} is missing"
                    return (
                        f"instance {inst['id']!r} differs from the reconstruction "
                        f"(derived {inst['state']}/{inst['failure']}, supplied "
                        f"{got[inst['id']].get('state')}/{got[inst['id']].get('failure')})"
                    )
            return "the active instances differ from the reconstruction (extra or reordered)"
        return f"member {key!r} differs from the reconstruction"
    return "the bytes differ from the reconstruction"

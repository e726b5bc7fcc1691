"""The five phases of RFC 0024 §8, in order; the first problem ends the reading.

Phase 1 (:mod:`._read`: bounds, forms, versions, inventory, kinds) reads every file
of the bundle once, bounded and without following links, and records each file's
digest. Phase 2 checks the pins and the proof chain, phase 3 the preparation claims,
phase 4 replays the epochs (:mod:`._replay`), phase 5 compares the reconstruction with
the supplied control files and inventory. See docs/spec/verify.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crucible.core import canon, digest
from crucible.proof import layout
from crucible.proof.reader._chain import PrefixHasher
from crucible.proof.reader._findings import Problem
from crucible.proof.reader._model import PINS, control_dumps
from crucible.proof.reader._read import CONTROL_CAP, Loaded, VerifyOptions, read_bundle
from crucible.proof.reader._replay import Context, Replay
from crucible.proof.reader._report import Counts, Reading, Report

__all__ = ["VerifyOptions", "verify_bundle"]


def verify_bundle(root: Path, options: VerifyOptions | None = None) -> Report:
    """Read ``root`` to a verdict. Raises :class:`Inability` when no verdict is reachable."""
    options = options or VerifyOptions()
    try:
        loaded = read_bundle(root, options)  # phase 1
        check_pins(loaded, options)  # phase 2
        check_preparations(loaded)  # phase 3
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
        replay.run()  # phase 4
        reading = compare_reconstruction(loaded, replay)  # phase 5
    except Problem as problem:
        return Report(problem=problem)
    return Report(reading=reading)


# ---------------------------------------------------------------- phase 2


def _mismatch(
    msg: str, path: str | None = None, epoch: int | None = None, obs: int | None = None
) -> Problem:
    return Problem("digest-mismatch", 2, msg, path=path, epoch=epoch, observation=obs)


def check_pins(ld: Loaded, options: VerifyOptions) -> None:
    """Phase 2, in verify.md's order: the --expect values, the control pins, the chain,
    frozen and root-case pins, every retained artifact pin, then the frozen binding."""
    _check_expectations(ld, options.expect or {})
    _check_control_pins(ld)
    _check_chain(ld)
    _check_frozen_and_root_case(ld)
    _check_history_pins(ld)
    _check_frozen_binding(ld)


def _check_expectations(ld: Loaded, expect: dict[str, Any]) -> None:
    proof, d = ld.proof, ld.digests
    held = {
        "admissionProofDigest": d[layout.ADMISSION_PROOF],
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


def _check_control_pins(ld: Loaded) -> None:
    """In the order of admission-proof.md §10: workflow, then the proof pin."""
    proof, ex, d = ld.proof, ld.execution, ld.digests
    proof_digest = d[layout.ADMISSION_PROOF]
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


def _check_chain(ld: Loaded) -> None:
    """Each epoch names the digest of the preceding closed prefix."""
    hasher = PrefixHasher(ld.proof)
    for e, raw in zip(ld.epochs, ld.epochs.epoch_bytes(), strict=True):
        k = e["number"]
        if e["previousProofDigest"] != hasher.digest():
            raise _mismatch(
                f"previousProofDigest does not name P({k - 1}), the preceding closed prefix",
                layout.ADMISSION_PROOF,
                k,
            )
        hasher.close(raw)


def _check_frozen_and_root_case(ld: Loaded) -> None:
    proof, d = ld.proof, ld.digests
    frozen = [{"stage": s.name, "digest": d[layout.frozen_path(s.name)]} for s in ld.stages]
    if digest.of_json(frozen) != proof["frozenDigest"]:
        raise _mismatch(
            "frozenDigest is not the digest of the frozen stage pins", layout.ADMISSION_PROOF
        )
    if ld.execution["frozen"] != frozen:
        raise _mismatch(
            "the execution's frozen pins differ from the frozen files", layout.EXECUTION
        )
    for p in (layout.ROOT_CASE, layout.case_path(proof["rootInstance"])):
        if d[p] != proof["rootCaseDigest"]:
            raise _mismatch("the root case is not the pinned rootCaseDigest", p)


def _check_history_pins(ld: Loaded) -> None:
    """Every retained artifact pin, retired ones included."""
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
                        if ld.digests.get(p) != o[pin]:
                            raise _mismatch(f"the file is not the pinned {pin}", p, k, j)


def _check_frozen_binding(ld: Loaded) -> None:
    """Each frozen file is its stage exactly as the workflow defines it."""
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


def check_preparations(ld: Loaded) -> None:
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


def compare_reconstruction(ld: Loaded, rp: Replay) -> Reading:
    """Phase 5: the supplied control files and inventory against the replay."""
    proof_digest = ld.digests[layout.ADMISSION_PROOF]
    if rp.execution_digest(proof_digest) != ld.digests[layout.EXECUTION]:
        derived = rp.execution_json(proof_digest)
        supplied = canon.loads(ld.tree.read(layout.EXECUTION, CONTROL_CAP))
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

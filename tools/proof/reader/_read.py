"""Phase 1 of RFC 0024 §8: bounds, forms, versions, inventory, kinds
(docs/spec/verify.md, "Phase 1", whose numbered checks are the methods below).

Every file of the bundle is read once, bounded and without following links, and its
digest recorded. Problems are collected, the first of each code, and the most senior
code is reported (:class:`_Collector`); the reading stops early only where nothing
further can be checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crucible.core import digest
from crucible.core.structs import dataclass
from crucible.proof import layout
from crucible.proof.reader import _forms as forms
from crucible.proof.reader._bundle import BundleTree, walk_bundle
from crucible.proof.reader._findings import Problem, over_bound
from crucible.proof.reader._model import PINS, StageDef
from crucible.proof.reader._proofstream import Proof, load_proof
from crucible.proof.reader._strict import JsonBounds, parse_json

__all__ = ["CONTROL_CAP", "MAX_ENTRIES", "Loaded", "VerifyOptions", "read_bundle"]


@dataclass(frozen=True)
class VerifyOptions:
    """What a reading is checked against (crucible.proof.reader._verify re-exports
    it; defined here because phase 1 already reads it)."""

    expect: dict[str, Any] | None = None
    #: the proof's byte ceiling (RFC 0024 §1: 8 MiB); raised only by the benchmark
    proof_ceiling: int = layout.MAX_PROOF_BYTES


#: phase-1 precedence among refusal codes (RFC 0024 §8)
_PRECEDENCE = (
    "input-over-bound",
    "input-malformed",
    "version-unread",
    "inventory-mismatch",
    "kind-unread",
)
#: codes after which the later checks of phase 1 cannot be trusted to run
_SENIOR = ("input-over-bound", "input-malformed", "version-unread")
#: the proof's structural ceilings (admission-proof.md §1) and those of every other JSON
#: file (our choice: nesting 64 as workflow.md §1; containers bounded by maxBytes)
_PROOF_BOUNDS = JsonBounds(depth=64, members=layout.MAX_PROOF_ARRAY, string_bytes=65536)
_FILE_BOUNDS = JsonBounds(depth=64, members=1 << 22, string_bytes=layout.MAX_RECEIVED_FILE_BYTES)
#: control files are bounded by maxBytes (checked from the walk) and this hard cap
CONTROL_CAP = 1 << 30
#: a walk never visits more entries than this (our choice; far above any maxFiles we accept)
MAX_ENTRIES = 1 << 20
#: attempt file name -> how it is read (workflow.md §9, §10)
_ATTEMPT_KINDS = {
    "run.json": "run",
    "preparation.json": "strict-object",
    "audit.json": "audit",
    "evaluation-error.json": "strict-object",
    "audit.sig": "sig",
}


class _Collector:
    """Phase-1 problems, so the most senior code is reported whatever is met first."""

    def __init__(self) -> None:
        self.first: dict[str, Problem] = {}

    def note(self, p: Problem) -> None:
        self.first.setdefault(p.code, p)

    def any(self, *codes: str) -> bool:
        return any(c in self.first for c in codes)

    def settle(self) -> None:
        for code in _PRECEDENCE:
            if code in self.first:
                raise self.first[code]


@dataclass
class Loaded:
    """What phase 1 read, for the later phases."""

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


def read_bundle(root: Path, options: VerifyOptions) -> Loaded:
    """Phase 1: raise the most senior refusal, else return what was read."""
    return _BundleRead(root, options).run()


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


def _classify(path: str, stages: set[str]) -> str:
    """How a bundle path is read in phase 1 (workflow.md §10); "unknown" is an inventory
    refusal. The reader's own reading of the table (the writer checks path forms with
    ``layout.is_bundle_path``; the reader decides from the bundle alone)."""
    parts = path.split("/")
    if path in (layout.ROOT_CASE,):
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
        return _ATTEMPT_KINDS.get(parts[4], "unknown")
    if (
        len(parts) == 5
        and parts[0] == "outputs"
        and parts[4].endswith((".payload.json", ".envelope.json"))
    ):
        return "canonical"
    return "unknown"


class _BundleRead:
    """The checks of verify.md's phase 1, one method per numbered step (or pair)."""

    def __init__(self, root: Path, options: VerifyOptions) -> None:
        self.root = root
        self.options = options
        self.col = _Collector()
        self.digests: dict[str, str] = {}
        self.parsed: dict[str, Any] = {}
        self.limits: dict[str, int] | None = None
        self.selections: dict[tuple[str, int], tuple[dict[str, Any], bool]] = {}
        self.partial: dict[str, Any] | None = None
        #: run.json path -> its finishedAt (None when null)
        self.run_finished: dict[str, Any] = {}
        self.tree = BundleTree(root=root)

    def run(self) -> Loaded:
        self.walk()  # 1-3
        self.read_workflow()  # 4
        self.check_supplied_total()  # 5
        self.read_execution()  # 6
        proof = self.read_proof()  # 6
        self.check_epoch_forms(proof)  # 6
        self.read_sidecar()  # 7
        stages = (
            _stage_defs(self.parsed[layout.WORKFLOW]) if not self.col.any("input-malformed") else []
        )
        self.read_other_files({s.name for s in stages})  # 8
        if self.col.any(*_SENIOR):
            self.col.settle()
        self.check_pinned_artifacts(proof, stages)  # 9
        self.col.settle()
        return Loaded(
            tree=self.tree,
            workflow=self.parsed[layout.WORKFLOW],
            proof=proof.root,
            execution=self.parsed.get(layout.EXECUTION, {}),
            epochs=proof,
            digests=self.digests,
            selections=self.selections,
            stages=stages,
            partial=self.partial,
        )

    # -- helpers -----------------------------------------------------------------------
    def ceiling(self, path: str) -> int:
        if path == layout.ADMISSION_PROOF:
            return self.options.proof_ceiling
        if path.endswith("/audit.sig"):
            return layout.MAX_SIGNATURE_BYTES
        if _is_control(path):
            return CONTROL_CAP
        return layout.MAX_RECEIVED_FILE_BYTES

    def read(self, path: str) -> bytes:
        data = self.tree.read(path, self.ceiling(path))
        self.digests[path] = digest.of_bytes(data)
        return data

    def load(self, path: str, *, canonical: bool) -> Any:
        bounds = _PROOF_BOUNDS if path == layout.ADMISSION_PROOF else _FILE_BOUNDS
        return parse_json(self.read(path), path, bounds, canonical=canonical)

    # -- 1-3: walk, byte ceilings, kinds of entry, names, required files ----------------
    def walk(self) -> None:
        col = self.col
        self.tree = tree = walk_bundle(self.root, max_entries=MAX_ENTRIES)
        for path, size in tree.sizes.items():
            ceiling = self.ceiling(path)
            if size > ceiling:
                col.note(over_bound(f"{size} bytes exceed the ceiling of {ceiling}", path))
        if col.any("input-over-bound"):
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
        for p in layout.REQUIRED_FILES:
            if p not in tree.sizes:
                col.note(Problem("inventory-mismatch", 1, "a required file is missing", path=p))
        if layout.WORKFLOW not in tree.sizes or layout.ADMISSION_PROOF not in tree.sizes:
            col.settle()

    # -- 4: workflow.json --------------------------------------------------------------
    def read_workflow(self) -> None:
        try:
            wf = self.parsed[layout.WORKFLOW] = self.load(layout.WORKFLOW, canonical=True)
            forms.check_workflow(wf, layout.WORKFLOW)
            self.limits = wf["limits"]
        except Problem as exc:
            self.col.note(exc)

    # -- 5: the supplied total -----------------------------------------------------------
    def check_supplied_total(self) -> None:
        """A bound (input-over-bound), senior to every malformed file; partial.json is a
        label, never charged (admission-proof.md §9)."""
        limits, tree = self.limits, self.tree
        label = tree.sizes.get(layout.PARTIAL)
        supplied_bytes = tree.total_bytes - (label or 0)
        supplied_files = len(tree.sizes) - (label is not None)
        if limits is not None and (
            supplied_bytes > limits["maxBytes"] or supplied_files > limits["maxFiles"]
        ):
            self.col.note(
                over_bound(
                    f"the export holds {supplied_bytes} bytes in {supplied_files} files "
                    f"(maxBytes {limits['maxBytes']}, maxFiles {limits['maxFiles']})"
                )
            )
            self.col.settle()

    # -- 6: execution.json, admission-proof.json, each epoch's form --------------------
    def read_execution(self) -> None:
        """Reduced to its top-level members at once: its instances are rebuilt and
        compared in phase 5, so the parsed copy never coexists with the proof."""
        if layout.EXECUTION not in self.tree.sizes:
            return
        try:
            supplied = self.load(layout.EXECUTION, canonical=True)
            forms.check_execution(supplied)
            self.parsed[layout.EXECUTION] = {k: v for k, v in supplied.items() if k != "instances"}
        except Problem as exc:
            self.col.note(exc)

    def read_proof(self) -> Proof:
        col = self.col
        if layout.ADMISSION_PROOF in self.tree.sizes:
            try:
                data = self.read(layout.ADMISSION_PROOF)
                self.parsed[layout.ADMISSION_PROOF] = load_proof(
                    data, layout.ADMISSION_PROOF, _PROOF_BOUNDS
                )
            except Problem as exc:
                col.note(exc)
        if layout.ADMISSION_PROOF not in self.parsed or self.limits is None:
            col.settle()  # without the workflow's limits nothing further can be bounded
        proof: Proof = self.parsed[layout.ADMISSION_PROOF]
        try:
            forms.check_proof_root(proof.root, proof.blocks, layout.ADMISSION_PROOF)
        except Problem as exc:
            col.note(exc)
        if col.any(*_SENIOR):
            col.settle()
        return proof

    def check_epoch_forms(self, epochs: Proof) -> None:
        col = self.col
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

    # -- 7: admission-proof.digest -------------------------------------------------------
    def read_sidecar(self) -> None:
        if layout.ADMISSION_PROOF_DIGEST not in self.tree.sizes:
            return
        side = self.tree.read(layout.ADMISSION_PROOF_DIGEST, 4096)
        self.digests[layout.ADMISSION_PROOF_DIGEST] = digest.of_bytes(side)
        if (
            len(side) != 72
            or not digest.is_digest(side[:-1].decode("ascii", "replace"))
            or side[-1:] != b"\n"
        ):
            self.col.note(
                Problem(
                    "input-malformed",
                    1,
                    "not sha256:<64 hex> and a newline",
                    path=layout.ADMISSION_PROOF_DIGEST,
                )
            )

    # -- 8: every other file, by its row of the closed path table -----------------------
    def read_other_files(self, stage_names: set[str]) -> None:
        for path in self.tree.sizes:
            if path in self.parsed or path == layout.ADMISSION_PROOF_DIGEST:
                continue
            try:
                self.read_by_kind(path, _classify(path, stage_names))
            except Problem as exc:
                self.col.note(exc)

    def read_by_kind(self, path: str, kind: str) -> None:
        col = self.col
        if kind == "raw":
            self.read(path)
        elif kind == "sig":
            if not self.read(path):
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
            value = self.load(
                path, canonical=kind in ("canonical", "selection", "partial", "audit")
            )
            if kind in ("strict-object", "audit", "run") and type(value) is not dict:
                col.note(Problem("input-malformed", 1, "not a JSON object", path=path))
            elif kind == "selection":
                refused = forms.check_selection(value, path)
                parts = path.split("/")
                self.selections[(parts[1], int(parts[2][: -len(".json")]))] = (value, refused)
            elif kind == "run":
                self.run_finished[path] = forms.check_run(value, path)
            elif kind == "partial":
                forms.check_partial(value, path)
                self.partial = value

    # -- 9: pinned artifacts present, and the finishedAt rule (RFC 0024 §5) -------------
    def check_pinned_artifacts(self, proof: Proof, stages: list[StageDef]) -> None:
        col, sizes = self.col, self.tree.sizes
        root_case = layout.case_path(proof.root["rootInstance"])
        if root_case not in sizes:
            col.note(Problem("inventory-mismatch", 1, "the root case is missing", path=root_case))
        for s in stages:
            for p in (layout.frozen_path(s.name), layout.set_path(s.name)):
                if p not in sizes:
                    col.note(Problem("inventory-mismatch", 1, "a required file is missing", path=p))
        for e in proof:
            if e.get("kind") in ("selection", "fork"):
                p = layout.selection_path(e["stage"], e["revision"])
                if p not in sizes:
                    col.note(
                        Problem(
                            "inventory-mismatch",
                            1,
                            "the epoch's selection file is missing",
                            path=p,
                            epoch=e.get("number"),
                        )
                    )
            elif e.get("kind") in ("group", "retry"):
                for j, o in enumerate(e["results"], 1):
                    self.check_observation_files(o, e.get("number"), j)

    def check_observation_files(self, o: dict[str, Any], k: int | None, j: int) -> None:
        col, sizes = self.col, self.tree.sizes
        for pin in PINS:
            if o[pin] is None:
                continue
            p = layout.attempt_file(o["instance"], o["number"], pin)
            if p not in sizes:
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
        if needs_time and run_path in self.run_finished and self.run_finished[run_path] is None:
            col.note(
                Problem(
                    "input-malformed",
                    1,
                    f"{o['failure']} without a preparation needs finishedAt: "
                    "the instant of the failing check",
                    path=run_path,
                    epoch=k,
                    observation=j,
                )
            )

"""The recorded bundles under tests/vectors/proof/: how each case is built.

Each case writes its inputs (workflow.json, operations.ndjson, artifacts/) with
:class:`Scenario`; ``crucible-prove`` then produces ``bundle/``. Byte boundaries are
*measured* first (a scratch run with the limit written into the workflow, iterated
to a fixed point because maxBytes is itself serialized), never assumed. Mutation
cases take a recorded bundle and change it the way the RFC's negative cases
describe; their expected outcome is the reader's first rejection.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crucible.core import canon, digest
from tests.proof.writer.prove_helpers import (
    AT,
    Scenario,
    evaluated_root,
    people,
    stage,
    two_children,
)

Build = Callable[[Path], Scenario]


@dataclass
class Case:
    name: str
    description: str
    build: Build
    #: mutate(bundle_dir) after the writer ran; the expected reader outcome follows
    mutate: Callable[[Path], None] | None = None
    reader: dict[str, Any] | None = None
    base: str | None = None
    notes: list[str] = field(default_factory=list)


CASES: dict[str, Case] = {}


def case(name: str, description: str, **kw: Any) -> Callable[[Build], Build]:
    def register(fn: Build) -> Build:
        CASES[name] = Case(name, description, fn, **kw)
        return fn

    return register


def _scratch(tag: str) -> Path:
    import tempfile

    return Path(tempfile.mkdtemp(prefix=f"crucible-vector-{tag}-"))


def fixed_point(make: Callable[[Path, int], Scenario], pick: Callable[[Any], int]) -> int:
    """maxBytes M whose own workflow makes the picked measured size exactly M."""
    work = _scratch("fp")
    try:
        m = 1_000_000
        for i in range(12):
            s = make(work / str(i), m)
            size = pick(s.prove(check=False))
            if size == m:
                return m
            m = size
    finally:
        shutil.rmtree(work, ignore_errors=True)
    raise AssertionError("no fixed point")


def measure_once(make: Callable[[Path, int], Scenario], limit: int) -> Any:
    """Prove a scratch copy once (to measure) and remove it."""
    work = _scratch("once")
    try:
        return make(work / "x", limit).prove(check=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def obs(result: Any, n: int = -1) -> Any:
    return [d for d in result.decisions if d.kind == "observation"][n]


# -- positive and boundary recordings ----------------------------------------------


@case("complete", "Root, selection of two parents, a group of two children, all evaluated.")
def complete(d: Path) -> Scenario:
    s = Scenario(d)
    two_children(s)
    s.evaluated("a", 1, people("Ann"))
    s.evaluated("b", 1, people("Bob", "Bea"))
    s.finish()
    return s


def _ids_case(ids: tuple[str, str]) -> Build:
    def make(d: Path, max_bytes: int, child_ids: tuple[str, str] = ("a", "b")) -> Scenario:
        s = Scenario(d, limits={"maxBytes": max_bytes})
        evaluated_root(s, "Acme", "Globex")
        s.select("org", [("r", 0), ("r", 1)], list(child_ids))
        s.finish()
        return s

    def build(d: Path) -> Scenario:
        m = fixed_point(make, lambda r: r.decisions[-1].acceptance[0])
        return make(d, m, ids)

    return build


LONG = ("p" * 63 + "1", "p" * 63 + "2")
case(
    "ids-short-admitted",
    "Two selected parents, 1-character child ids; maxBytes equals the measured acceptance "
    "candidate, so the reservation is admitted at equality.",
)(_ids_case(("a", "b")))
case(
    "ids-long-refused",
    "The same inputs and the same maxBytes with 64-character child ids: the acceptance "
    "candidate is 378 bytes larger, the selection is refused and the refusal carrier fits.",
)(_ids_case(LONG))


@case(
    "duplicate-paths",
    "Siblings a and b receive byte-identical run/preparation/audit files and emit equal "
    "payloads. maxBytes is one byte below b's acceptance candidate: a digest-keyed store "
    "would fit, the per-path measurement does not, so b's output is refused.",
)
def duplicate_paths(d: Path) -> Scenario:
    def make(d: Path, max_bytes: int) -> Scenario:
        s = Scenario(d, limits={"maxBytes": max_bytes})
        two_children(s)
        shared = {
            "run": s.file("same/run.json", {"exportVersion": 3, "finishedAt": AT}),
            "preparation": s.file("same/preparation.json", {"prepared": True}),
            "audit": s.file("same/audit.json", people("Pat")),
        }
        for iid in ("a", "b"):
            s.op(
                op="observe", instance=iid, attempt=1, state="evaluated", failure=None, files=shared
            )
        s.finish()
        return s

    # refusal carrier of b at equality: b's acceptance is then over the limit
    m = fixed_point(
        make, lambda r: obs(r).refusal[0] if obs(r).refusal else obs(r).acceptance[0] - 1
    )
    return make(d, m)


def _order_records(order: tuple[str, str]) -> Build:
    def build(d: Path) -> Scenario:
        s = Scenario(d, limits={"maxRecords": 2 + 10})
        two_children(s)
        for iid in order:
            s.evaluated(iid, 1, people(*[f"{iid}-{k}" for k in range(6)]))
        s.finish()
        return s

    return build


case(
    "order-records-ab",
    "Two siblings each offer six records with ten remaining (maxRecords); results arrive "
    "a then b: a is admitted, b refused (count bound), cutoff established.",
)(_order_records(("a", "b")))
case(
    "order-records-ba",
    "As order-records-ab with arrival order b then a: the bundle is byte-identical.",
)(_order_records(("b", "a")))


def _order_bytes(order: tuple[str, str]) -> Build:
    def make(d: Path, max_bytes: int) -> Scenario:
        s = Scenario(d, limits={"maxBytes": max_bytes})
        two_children(s)
        for iid in order:
            s.evaluated(iid, 1, people(*[f"{iid}-{k}" for k in range(6)]))
        s.finish()
        return s

    def build(d: Path) -> Scenario:
        # maxBytes = b's refusal carrier (measured): a fits, b's outputs do not
        m = fixed_point(
            make, lambda r: obs(r).refusal[0] if obs(r).refusal else obs(r).acceptance[0] - 1
        )
        return make(d, m)

    return build


case(
    "order-bytes-ab",
    "The actual-byte version: maxBytes equals b's measured refusal carrier; a's outputs "
    "fit, b's do not; all acquired material is retained.",
)(_order_bytes(("a", "b")))
case(
    "order-bytes-ba",
    "As order-bytes-ab with arrival order b then a: byte-identical bundle.",
)(_order_bytes(("b", "a")))


def _sibling_retry(b_fits: bool) -> Build:
    def make(d: Path, max_records: int) -> Scenario:
        s = Scenario(d, limits={"maxRecords": max_records})
        two_children(s)
        s.failed("a", 1)
        s.evaluated("b", 1, people("B1", "B2"))
        s.retry("a")
        s.evaluated("a", 2, people("A1"))
        s.finish()
        return s

    def build(d: Path) -> Scenario:
        return make(d, 2 + (2 + 1 if b_fits else 1))

    return build


case(
    "sibling-retry",
    "A's first attempt fails, B's outputs are refused (maxRecords), then A is explicitly "
    "retried in a new epoch and completes. B's epoch is unchanged; B stays failed/limit-exceeded.",
)(_sibling_retry(False))
case(
    "sibling-retry-b-fits",
    "As sibling-retry, but B's candidate fits and B completes; A is retried afterwards.",
)(_sibling_retry(True))


@case(
    "selection-revision",
    "Three stages. The people selection revision 1 is refused (its projected case exceeds "
    "maxCaseBytes); unrelated later work (a retry of a failed sibling) changes the offered "
    "set; revision 2 is admitted with fresh ids. Both revisions are retained and counted.",
)
def selection_revision(d: Path) -> Scenario:
    stages = [
        stage("org", None, "/orgs", "many"),
        stage("team", "org", "/people", "many"),
        stage("person", "team", "/bio", "one"),
    ]
    s = Scenario(d, limits={"maxCaseBytes": 200}, stages=stages)
    two_children(s, ("t1", "t2"))
    s.failed("t1", 1)
    s.evaluated("t2", 1, {"people": [{"name": "B" * 150}, {"name": "Bo"}]})
    s.select("team", [("t2", 0)], ["p1"])  # case too large: refused, p1 retained
    s.retry("t1")
    s.evaluated("t1", 2, people("Ann"))
    s.select("team", [("t1", 0), ("t2", 1)], ["p2", "p3"])
    s.finish()
    return s


@case(
    "file-limit-refused",
    "maxFiles equals the files of b's refusal carrier: b's three outputs (six files) exceed "
    "the file bound while its bytes would fit; b is failed/limit-exceeded.",
)
def file_limit(d: Path) -> Scenario:
    def make(d: Path, max_files: int) -> Scenario:
        s = Scenario(d, limits={"maxFiles": max_files})
        two_children(s)
        s.evaluated("a", 1, people("Ann"))
        s.evaluated("b", 1, people("B1", "B2", "B3"))
        s.finish()
        return s

    probe = measure_once(make, 100_000)
    acceptance = obs(probe).acceptance
    return make(d, acceptance[1] - 6)


@case(
    "refusal-carrier-unrecordable",
    "b's received audit alone overflows maxBytes: neither its acceptance candidate nor its "
    "refusal carrier fits. Recording is unavailable (writer exit 3); the bundle is the last "
    "complete prefix (an open epoch), labelled partial; b's material is in custody.",
)
def carrier_unrecordable(d: Path) -> Scenario:
    def make(d: Path, max_bytes: int) -> Scenario:
        s = Scenario(d, limits={"maxBytes": max_bytes})
        two_children(s)
        s.evaluated("a", 1, people("Ann"))
        s.evaluated("b", 1, {"people": [{"name": "x" * 4000}]})
        s.finish()
        return s

    probe = measure_once(make, 1_000_000)
    return make(d, obs(probe, -2).acceptance[0] + 2000)


@case(
    "proof-bytes-unrecordable",
    "maxBytes equals the candidate after b's result; the explicit retry of a adds only its "
    "begin (proof bytes and a stub attempt) and that no longer fits: recording unavailable "
    "at the retry, exit 3, partial bundle of the closed prefix.",
)
def proof_bytes(d: Path) -> Scenario:
    def make(d: Path, max_bytes: int) -> Scenario:
        s = Scenario(d, limits={"maxBytes": max_bytes})
        two_children(s)
        s.failed("a", 1)
        s.evaluated("b", 1, people("Bob"))
        s.retry("a")
        s.evaluated("a", 2, people("Ann"))
        s.finish()
        return s

    m = fixed_point(
        make, lambda r: [x for x in r.decisions if x.kind == "observation"][2].acceptance[0]
    )
    return make(d, m)


@case(
    "interrupted-after-reservation",
    "The log stops right after the atomic reservation of two children (no finish): a partial "
    "export with both children interrupted and no attempt.",
)
def after_reservation(d: Path) -> Scenario:
    s = Scenario(d)
    evaluated_root(s, "Acme", "Globex")
    s.select("org", [("r", 0), ("r", 1)], ["a", "b"])
    return s


@case(
    "interrupted-open-group",
    "Begins of a and b are committed; b's result arrives first and is held for a's turn; the "
    "log ends. The export ends at the open epoch P(4,0), labelled partial; b's material is "
    "in custody, not in the export.",
)
def open_group(d: Path) -> Scenario:
    s = Scenario(d)
    two_children(s)
    s.evaluated("b", 1, people("Bob"))
    s.finish()
    return s


@case(
    "resume-recover-retry",
    "As interrupted-open-group, then recovery without acquisition: b's held result is "
    "processed (evaluated), a is closed interrupted; a late response for a's first attempt "
    "goes to custody; a is explicitly retried and completes.",
)
def resume(d: Path) -> Scenario:
    s = Scenario(d)
    two_children(s)
    s.evaluated("b", 1, people("Bob"))
    s.op(op="recover")
    s.evaluated("a", 1, people("late"), tag="-late")
    s.retry("a")
    s.evaluated("a", 2, people("Ann"))
    s.finish()
    return s


@case(
    "pre-attempt-stop",
    "A group starts b and cancels a before any attempt: a is cancelled with no attempt "
    "(no acquisition invented, no attempt allowance used).",
)
def pre_attempt_stop(d: Path) -> Scenario:
    s = Scenario(d)
    two_children(s)
    s.ops[-1] = {
        "op": "group",
        "reservation": 3,
        "starts": ["b"],
        "cancelled": [{"instance": "a", "actor": "operator", "at": AT}],
    }
    s.evaluated("b", 1, people("Bob"))
    s.finish()
    return s


THREE = [
    stage("org", None, "/orgs", "many"),
    stage("people", "org", "/people", "many"),
    stage("bio", "people", "/bio", "one"),
]


@case(
    "deferred-consumed-fork",
    "Start a and defer b; consume people's offered set downstream (bio selection). A first "
    "begin of b is then forbidden (the writer refuses it); instead a fork of org revision 2 "
    "retires a, b and x, reserves fresh a2/b2, and b2 is started and completes.",
)
def deferred_fork(d: Path) -> Scenario:
    s = Scenario(d, stages=THREE)
    evaluated_root(s, "Acme", "Globex")
    s.select("org", [("r", 0), ("r", 1)], ["a", "b"])
    s.group(3, ["a"])
    s.evaluated("a", 1, people("Ann"))
    s.select("people", [("a", 0)], ["x"])
    s.select("org", [("r", 0), ("r", 1)], ["a2", "b2"], fork=True)
    s.group(6, ["b2"])
    s.evaluated("b2", 1, people("Bob"))
    s.finish()
    return s


@case(
    "consumed-empty-root-selection",
    "The root's selection is empty: childIds [], the consumer closes with zero instances and "
    "the root is consumed (a root retry would need a new execution).",
)
def empty_root_selection(d: Path) -> Scenario:
    s = Scenario(d)
    evaluated_root(s, "Acme")
    s.select("org", [], [])
    s.finish()
    return s


@case(
    "carry-consumed-deferred",
    "org has two consumers (left, right). A group starts left's x1 and defers x2, y1, y2; "
    "left is consumed downstream (leaf selection); a later group on the same reservation "
    "starts y1, y2 while the consumed deferred slot x2 is carried unchanged in deferred.",
)
def carry_deferred(d: Path) -> Scenario:
    stages = [
        stage("org", None, "/orgs", "many"),
        stage("left", "org", "/people", "many"),
        stage("right", "org", "/people", "many"),
        stage("leaf", "left", "/bio", "one"),
    ]
    s = Scenario(d, stages=stages)
    evaluated_root(s, "Acme", "Globex")
    s.select("org", [("r", 0), ("r", 1)], ["x1", "x2", "y1", "y2"])
    s.group(3, ["x1"])
    s.evaluated("x1", 1, people("Xena"))
    s.select("left", [("x1", 0)], ["z1"])
    s.group(3, ["y1", "y2"])
    s.evaluated("y1", 1, people("Yan"))
    s.evaluated("y2", 1, people())
    s.finish()
    return s


@case(
    "signatures",
    "Two siblings with byte-identical audits, each retaining its own audit signature sidecar "
    "(audit.sig) under its observation pin; the sidecars count at each attempt's prefix.",
)
def signatures(d: Path) -> Scenario:
    s = Scenario(d)
    two_children(s)
    s.evaluated("a", 1, people("Pat"), signature=b"signature-of-a\n")
    s.evaluated("b", 1, people("Pat"), signature=b"signature-of-b\n")
    s.finish()
    return s


@case(
    "failure-states",
    "Every derivable state in one run: projection-invalid and admission-refused slots "
    "(no attempt), evaluation-error, preparation-failed (run finishedAt), admission-refused "
    "with a preparation, output-invalid (bad shape), completed-zero and completed.",
)
def failure_states(d: Path) -> Scenario:
    stages = [
        stage("org", None, "/orgs", "many"),
        stage("people", "org", "/people", "many", fields=["name"], admit=24),
    ]
    s = Scenario(d, stages=stages)
    s.root_op()
    s.group(1, ["r"])
    names = [{"name": f"O{i}"} for i in range(6)] + [{"site": "x"}, {"name": "N" * 30}]
    s.evaluated("r", 1, {"orgs": names})
    s.select("org", [("r", i) for i in range(8)], [f"c{i}" for i in range(8)])
    s.group(3, [f"c{i}" for i in range(6)])
    run = s.file("fs/run.json", {"exportVersion": 2, "finishedAt": AT})
    prep = s.file("fs/prep.json", {"prepared": True})
    err = s.file("fs/error.json", {"error": "core evaluation error"})
    s.observe(
        "c0",
        1,
        "failed",
        "evaluation-error",
        {"run": run, "preparation": prep, "evaluationError": err},
    )
    s.observe("c1", 1, "failed", "preparation-failed", {"run": run})
    s.observe("c2", 1, "failed", "admission-refused", {"run": run, "preparation": prep})
    s.evaluated("c3", 1, {"people": {"not": "an array"}})
    s.evaluated("c4", 1, people())
    s.evaluated("c5", 1, people("Eve"))
    s.finish()
    return s


@case(
    "cutoff-suppressed",
    "maxRecords leaves room for two records: a's three are refused (cutoff for people in "
    "this epoch); b's valid one-record proposal is cut off although it would fit; c never "
    "acquired and is recorded suppressed. A later retry of b starts a new epoch with no "
    "cutoff and is accepted.",
)
def cutoff_suppressed(d: Path) -> Scenario:
    s = Scenario(d, limits={"maxRecords": 3 + 2})
    evaluated_root(s, "Acme", "Globex", "Initech")
    s.select("org", [("r", 0), ("r", 1), ("r", 2)], ["a", "b", "c"])
    s.group(3, ["a", "b", "c"])
    s.evaluated("a", 1, people("A1", "A2", "A3"))
    s.evaluated("b", 1, people("B1"))
    s.observe("c", 1, "suppressed")
    s.retry("b")
    s.evaluated("b", 2, people("B1"), tag="-retry")
    s.finish()
    return s


@case(
    "fork-refused",
    "A fork of org whose reservation exceeds maxInstances (retired identities still count): "
    "childIds null, the consumers stay blocked, org becomes unconsumed, and a later "
    "selection revision 3 reserves a single fresh child.",
)
def fork_refused(d: Path) -> Scenario:
    s = Scenario(d, limits={"maxInstances": 4})
    evaluated_root(s, "Acme", "Globex")
    s.select("org", [("r", 0), ("r", 1)], ["a", "b"])
    s.select("org", [("r", 0), ("r", 1)], ["a2", "b2"], fork=True)
    s.select("org", [("r", 1)], ["b3"])
    s.group(5, ["b3"])
    s.evaluated("b3", 1, people("Bob"))
    s.finish()
    return s


# -- mutations: negative cases a reader must reject --------------------------------


def _repin_proof(bundle: Path, proof: dict[str, Any], relink: bool) -> None:
    """Rewrite the proof canonically; relink previousProofDigest; repin sidecar+execution."""
    epochs = [e for b in proof["epochBlocks"] for e in b]
    if relink:
        for k, e in enumerate(epochs, start=1):
            e["number"] = k
            blocks = [epochs[: k - 1][i : i + 4096] for i in range(0, k - 1, 4096)]
            e["previousProofDigest"] = digest.of_json({**proof, "epochBlocks": blocks})
    proof["epochBlocks"] = [epochs[i : i + 4096] for i in range(0, len(epochs), 4096)]
    raw = canon.dumps(proof)
    (bundle / "admission-proof.json").write_bytes(raw)
    d = digest.of_bytes(raw)
    (bundle / "admission-proof.digest").write_bytes(d.encode() + b"\n")
    ex = canon.loads((bundle / "execution.json").read_bytes())
    ex["admissionProofDigest"] = d
    (bundle / "execution.json").write_bytes(canon.dumps(ex))


def _load(bundle: Path, rel: str) -> Any:
    return canon.loads((bundle / rel).read_bytes())


def _broken_link(bundle: Path) -> None:
    proof = _load(bundle, "admission-proof.json")
    proof["epochBlocks"][0][-1]["previousProofDigest"] = "sha256:" + "0" * 64
    _repin_proof(bundle, proof, relink=False)


def _false_refusal(bundle: Path) -> None:
    """Mark b (whose candidate fit) failed/limit-exceeded and drop its outputs."""
    ex = _load(bundle, "execution.json")
    for inst in ex["instances"]:
        if inst["id"] == "b":
            inst["state"], inst["failure"] = "failed", "limit-exceeded"
            inst["attempts"][-1]["state"] = "failed"
            inst["attempts"][-1]["failure"] = "limit-exceeded"
    (bundle / "execution.json").write_bytes(canon.dumps(ex))
    sets = _load(bundle, "sets/people.json")
    sets["records"] = [r for r in sets["records"] if r["instance"] != "b"]
    (bundle / "sets/people.json").write_bytes(canon.dumps(sets))
    shutil.rmtree(bundle / "outputs" / "people" / "b")


def _aux_overflow(bundle: Path) -> None:
    wf = _load(bundle, "workflow.json")
    total = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    aux = bundle / "aux" / "notes.txt"
    aux.parent.mkdir()
    aux.write_bytes(b"x" * (wf["limits"]["maxBytes"] - total + 1))


def _audit_changed(bundle: Path) -> None:
    path = bundle / "instances/a/attempts/1/audit.json"
    path.write_bytes(canon.dumps(people("Anna")))


def _missing_pinned(bundle: Path) -> None:
    (bundle / "instances/a/attempts/1/audit.json").unlink()


def _noncanonical_proof(bundle: Path) -> None:
    raw = (bundle / "admission-proof.json").read_bytes()
    (bundle / "admission-proof.json").write_bytes(raw.replace(b",", b", ", 1))


def _run_version_5(bundle: Path) -> None:
    path = bundle / "instances/a/attempts/1/run.json"
    run = canon.loads(path.read_bytes())
    run["exportVersion"] = 5
    path.write_bytes(canon.dumps(run))


def _workflow_version_1(bundle: Path) -> None:
    wf = _load(bundle, "workflow.json")
    wf["workflowVersion"] = 1
    (bundle / "workflow.json").write_bytes(canon.dumps(wf))


def _swapped_signatures(bundle: Path) -> None:
    a = bundle / "instances/a/attempts/1/audit.sig"
    b = bundle / "instances/b/attempts/1/audit.sig"
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)


def _extra_file(bundle: Path) -> None:
    (bundle / "instances/a/attempts/1/extra.json").write_bytes(b"{}")


def _omitted_epoch(bundle: Path) -> None:
    """Drop the group epoch of the children and relink/repin: structurally invalid."""
    proof = _load(bundle, "admission-proof.json")
    proof["epochBlocks"][0] = [e for e in proof["epochBlocks"][0] if e["number"] != 4]
    _repin_proof(bundle, proof, relink=True)


MUTATIONS: list[tuple[str, str, str, Callable[[Path], None], dict[str, Any]]] = [
    (
        "mut-broken-link",
        "complete",
        "The last epoch's previousProofDigest names a wrong prefix (sidecar and execution repinned).",
        _broken_link,
        {"outcome": "rejected", "code": "digest-mismatch", "phase": 2, "epoch": 4},
    ),
    (
        "mut-false-refusal",
        "sibling-retry-b-fits",
        "B's complete acceptance candidate fit, but B is marked failed/limit-exceeded and its "
        "outputs are removed (proof unchanged). A's later retry bytes must not justify it.",
        _false_refusal,
        {
            "outcome": "rejected",
            "code": "output-mismatch",
            "phase": 4,
            "epoch": 4,
            "observation": 2,
        },
    ),
    (
        "mut-aux-overflow",
        "ids-short-admitted",
        "Only a finalization auxiliary (aux/notes.txt) makes the supplied bundle one byte over maxBytes.",
        _aux_overflow,
        {"outcome": "rejected", "code": "input-over-bound", "phase": 1},
    ),
    (
        "mut-audit-changed",
        "complete",
        "a's retained audit.json is replaced by other canonical bytes; its observation pin disagrees.",
        _audit_changed,
        {
            "outcome": "rejected",
            "code": "digest-mismatch",
            "phase": 2,
            "epoch": 4,
            "observation": 1,
        },
    ),
    (
        "mut-missing-pinned",
        "complete",
        "a's pinned audit.json is deleted.",
        _missing_pinned,
        {"outcome": "rejected", "code": "inventory-mismatch", "phase": 1},
    ),
    (
        "mut-noncanonical-proof",
        "complete",
        "admission-proof.json gains one insignificant space (sidecar not repinned).",
        _noncanonical_proof,
        {"outcome": "rejected", "code": "input-malformed", "phase": 1},
    ),
    (
        "mut-run-version-5",
        "complete",
        "a's retained run export says exportVersion 5.",
        _run_version_5,
        {"outcome": "rejected", "code": "version-unread", "phase": 1},
    ),
    (
        "mut-workflow-version-1",
        "complete",
        "workflow.json says workflowVersion 1.",
        _workflow_version_1,
        {"outcome": "rejected", "code": "version-unread", "phase": 1},
    ),
    (
        "mut-swapped-signatures",
        "signatures",
        "Equal audits, but each attempt carries the other attempt's signature sidecar.",
        _swapped_signatures,
        {
            "outcome": "rejected",
            "code": "digest-mismatch",
            "phase": 2,
            "epoch": 4,
            "observation": 1,
        },
    ),
    (
        "mut-extra-file",
        "complete",
        "An unexplained file inside an attempt directory (outside the closed path table).",
        _extra_file,
        {"outcome": "rejected", "code": "inventory-mismatch", "phase": 1},
    ),
    (
        "mut-omitted-epoch",
        "complete",
        "The children's group epoch is removed and the chain relinked and repinned: every digest "
        "agrees, but a and b hold attempts no epoch began.",
        _omitted_epoch,
        {"outcome": "rejected", "code": "inventory-mismatch", "phase": 5},
    ),
]

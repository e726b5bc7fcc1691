"""``crucible-prove probe``: our synthetic accounting experiment (RFC 0024, Conformance).

Two fixed examples are proved for real (temporary bundles, full candidate
cross-check on), and the boundary is located by measurement, never asserted:

* one-output: a root instance whose audit yields one record. At maxBytes equal to
  the measured acceptance candidate it is accepted; one byte less, it is refused and
  the refusal carrier (measured) fits.
* two-stage ids: two selected parents reserve two children with 1-character or
  64-character proposed ids. At maxBytes equal to the short-id candidate the short
  reservation is admitted and the long one refused with a fitting carrier.

maxBytes is itself serialized in workflow.json, so the boundary is found as a fixed
point: the candidate measured *with* that limit written into the workflow.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from crucible.core import canon
from crucible.core.structs import dataclass

__all__ = [
    "PROBE_VERSION",
    "Boundary",
    "measure",
    "one_output",
    "probe_json",
    "probe_text",
    "run_probe",
    "two_stage_ids",
]

_AT = "2026-10-17T09:00:00Z"

#: the format version of ``probe --json`` (docs/schemas/prove-probe.json)
PROBE_VERSION = 1


@dataclass(frozen=True)
class Boundary:
    name: str
    #: (bytes, files) of the acceptance candidate at the boundary
    acceptance: tuple[int, int]
    #: outcome with maxBytes = acceptance bytes
    at_limit: str
    #: outcome and (bytes, files) of the refusal carrier with one byte less / long ids
    below: str
    refusal: tuple[int, int] | None
    proof_bytes: int
    detail: dict[str, Any]


def _stage(name: str, src: str | None, pointer: str, card: str) -> dict[str, Any]:
    return {
        "name": name,
        "input": {"fromStage": src, "fields": None, "admitMaxBytes": None},
        "output": {"pointer": pointer, "cardinality": card},
    }


def _limits(max_bytes: int) -> dict[str, int]:
    return {
        "maxBytes": max_bytes,
        "maxFiles": 1000,
        "maxInstances": 100,
        "maxAttempts": 4,
        "maxRecords": 100,
        "maxCaseBytes": 65536,
        "maxPayloadBytes": 65536,
    }


def _run(
    root: Path,
    stages: list[dict[str, Any]],
    max_bytes: int,
    ops: list[dict[str, Any]],
    files: dict[str, bytes],
) -> Any:
    # lazy: proof.writer is not loaded with this module; only _run() needs it
    from crucible.proof.writer import ProveOptions, prove

    if root.exists():
        shutil.rmtree(root)
    art = root / "artifacts"
    art.mkdir(parents=True)
    for rel, data in files.items():
        (art / rel).parent.mkdir(parents=True, exist_ok=True)
        (art / rel).write_bytes(data)
    wf = root / "workflow.json"
    wf.write_bytes(
        canon.dumps(
            {"workflowVersion": 2, "name": "probe", "limits": _limits(max_bytes), "stages": stages}
        )
    )
    log = root / "operations.ndjson"
    log.write_bytes(b"".join(canon.dumps(o) + b"\n" for o in ops))
    return prove(ProveOptions(wf, log, art, root / "bundle", check_candidates=True))


def _evaluated(instance: str, audit: dict[str, Any]) -> tuple[dict[str, Any], dict[str, bytes]]:
    files = {
        f"{instance}/run.json": canon.dumps({"exportVersion": 3, "finishedAt": _AT}),
        f"{instance}/preparation.json": canon.dumps({"prepared": instance}),
        f"{instance}/audit.json": canon.dumps(audit),
    }
    op = {
        "op": "observe",
        "instance": instance,
        "attempt": 1,
        "state": "evaluated",
        "failure": None,
        "files": {
            "run": f"{instance}/run.json",
            "preparation": f"{instance}/preparation.json",
            "audit": f"{instance}/audit.json",
        },
    }
    return op, files


def _fixed_point(measure: Any, start: int = 1_000_000) -> int:
    """The maxBytes M whose own workflow makes the measured candidate exactly M."""
    m = start
    for _ in range(10):
        s = int(measure(m))
        if s == m:
            return m
        m = s
    raise AssertionError("no fixed point for the candidate size")


def _boundary(name: str, at: Any, below: Any, root: Path, detail: dict[str, Any]) -> Boundary:
    """The boundary of one example from its two decisions; the proof size is that
    of the last bundle written under ``root`` (plus the 72-byte digest sidecar)."""
    proof = (root / "bundle" / "admission-proof.json").stat().st_size + 72
    return Boundary(name, at.acceptance, at.outcome, below.outcome, below.refusal, proof, detail)


def one_output(work: Path) -> Boundary:
    stages = [_stage("doc", None, "/result", "one")]
    obs, files = _evaluated("r", {"result": {"title": "Synthetic report", "score": 7}})
    files["root-case.json"] = canon.dumps({"question": "synthetic"})
    ops: list[dict[str, Any]] = [
        {"op": "root", "execution": "probe-1", "rootInstance": "r", "case": "root-case.json"},
        {"op": "group", "reservation": 1, "starts": ["r"], "cancelled": []},
        obs,
    ]

    def decision(m: int) -> Any:
        return _run(work / "one", stages, m, ops, files).decisions[-1]

    m = _fixed_point(lambda m: decision(m).acceptance[0])
    return _boundary("one-output", decision(m), decision(m - 1), work / "one", {"maxBytes": m})


def two_stage_ids(work: Path) -> Boundary:
    stages = [_stage("org", None, "/orgs", "many"), _stage("people", "org", "/people", "many")]
    obs, files = _evaluated("r", {"orgs": [{"name": "Acme"}, {"name": "Globex"}]})
    files["root-case.json"] = canon.dumps({"question": "organisations"})

    def ops(ids: list[str]) -> list[dict[str, Any]]:
        return [
            {"op": "root", "execution": "probe-2", "rootInstance": "r", "case": "root-case.json"},
            {"op": "group", "reservation": 1, "starts": ["r"], "cancelled": []},
            obs,
            {
                "op": "select",
                "stage": "org",
                "review": {"actor": "reviewer", "at": _AT},
                "selected": [{"instance": "r", "output": 0}, {"instance": "r", "output": 1}],
                "childIds": ids,
            },
        ]

    short, long = ["a", "b"], ["p" * 63 + "1", "p" * 63 + "2"]

    def decision(m: int, ids: list[str]) -> Any:
        return _run(work / "two", stages, m, ops(ids), files).decisions[-1]

    m = _fixed_point(lambda m: decision(m, short).acceptance[0])
    at = decision(m, short)
    below = decision(m, long)
    return _boundary(
        "two-stage-ids",
        at,
        below,
        work / "two",
        {
            "maxBytes": m,
            "longAcceptance": below.acceptance,
            "longIdLength": len(long[0]),
            "shortIdLength": len(short[0]),
        },
    )


def measure() -> tuple[Boundary, Boundary]:
    """Both examples, proved in a temporary directory removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="crucible-probe-") as tmp:
        return one_output(Path(tmp)), two_stage_ids(Path(tmp))


def _fits(refusal: tuple[int, int] | None, max_bytes: int) -> bool:
    return refusal is not None and refusal[0] <= max_bytes


def probe_text(one: Boundary, two: Boundary) -> str:
    """The report for people (the text ``probe`` prints)."""
    r1 = one.refusal or (0, 0)
    r2 = two.refusal or (0, 0)
    long = two.detail["longAcceptance"]
    m1, m2 = one.detail["maxBytes"], two.detail["maxBytes"]
    fits1 = "fits" if _fits(one.refusal, m1 - 1) else "does not fit"
    fits2 = "fits" if _fits(two.refusal, m2) else "does not fit"
    lines = [
        "one-output example (1 stage, 1 record):",
        f"  acceptance candidate: {one.acceptance[0]} bytes in {one.acceptance[1]} files "
        f"(proof + digest sidecar: {one.proof_bytes} bytes)",
        f"  maxBytes {m1}: {one.at_limit} (equality fits)",
        f"  maxBytes {m1 - 1}: {one.below}; refusal carrier {r1[0]} bytes in {r1[1]} files {fits1}",
        "two-stage example (2 selected parents, 2 child ids):",
        f"  {two.detail['shortIdLength']}-character ids: acceptance candidate "
        f"{two.acceptance[0]} bytes in {two.acceptance[1]} files",
        f"  {two.detail['longIdLength']}-character ids: acceptance candidate {long[0]} bytes in "
        f"{long[1]} files",
        f"  maxBytes {m2}: short ids {two.at_limit}; long ids {two.below}, "
        f"refusal carrier {r2[0]} bytes in {r2[1]} files {fits2}",
    ]
    return "\n".join(lines) + "\n"


def _size(measured: tuple[int, int] | None) -> dict[str, int] | None:
    return None if measured is None else {"bytes": measured[0], "files": measured[1]}


def probe_json(one: Boundary, two: Boundary) -> dict[str, Any]:
    """The same facts for scripts, one member each (docs/schemas/prove-probe.json)."""
    m1, m2 = one.detail["maxBytes"], two.detail["maxBytes"]
    return {
        "probeVersion": PROBE_VERSION,
        "oneOutput": {
            "stages": 1,
            "records": 1,
            "maxBytes": m1,
            "acceptance": _size(one.acceptance),
            "proofBytes": one.proof_bytes,
            "atLimit": one.at_limit,
            "below": {
                "maxBytes": m1 - 1,
                "outcome": one.below,
                "refusal": _size(one.refusal),
                "fits": _fits(one.refusal, m1 - 1),
            },
        },
        "twoStageIds": {
            "selectedParents": 2,
            "childIds": 2,
            "maxBytes": m2,
            "short": {
                "idLength": two.detail["shortIdLength"],
                "acceptance": _size(two.acceptance),
                "outcome": two.at_limit,
            },
            "long": {
                "idLength": two.detail["longIdLength"],
                "acceptance": _size(two.detail["longAcceptance"]),
                "outcome": two.below,
                "refusal": _size(two.refusal),
                "fits": _fits(two.refusal, m2),
            },
        },
    }


def run_probe(as_json: bool = False) -> bytes:
    """What ``probe`` prints: the text report, or one canonical JSON object and a newline."""
    one, two = measure()
    if as_json:
        return canon.dumps(probe_json(one, two)) + b"\n"
    return probe_text(one, two).encode("utf-8")

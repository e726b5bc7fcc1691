"""Bundle file layout: path constants and path-forming functions only.

No decision logic lives here; both the writer and the independent reader import it
(docs/spec/workflow.md §10). Ids and stage names are validated by the callers
before they reach these functions; the patterns are here so both sides agree.
"""

from __future__ import annotations

import re

__all__ = [
    "ADMISSION_PROOF",
    "ADMISSION_PROOF_DIGEST",
    "ATTEMPT_FILES",
    "AUX_DIR",
    "CUSTODY_SUFFIX",
    "EXECUTION",
    "FINALIZATION_FILES",
    "ID_RE",
    "LIMIT_NAMES",
    "MAX_BLOCKS",
    "MAX_EPOCHS_PER_BLOCK",
    "MAX_PROOF_ARRAY",
    "MAX_PROOF_BYTES",
    "MAX_RECEIVED_FILE_BYTES",
    "MAX_REVISIONS",
    "MAX_SIGNATURE_BYTES",
    "PARTIAL",
    "REQUIRED_FILES",
    "ROOT_CASE",
    "STAGE_RE",
    "TIMESTAMP_RE",
    "WORKFLOW",
    "attempt_file",
    "case_path",
    "envelope_path",
    "frozen_path",
    "is_bundle_path",
    "is_finalization_path",
    "payload_path",
    "selection_path",
    "set_path",
]

WORKFLOW = "workflow.json"
EXECUTION = "execution.json"
ROOT_CASE = "root-case.json"
ADMISSION_PROOF = "admission-proof.json"
ADMISSION_PROOF_DIGEST = "admission-proof.digest"
PARTIAL = "partial.json"
#: present in every bundle (workflow.md §10, "always"), in the order a reader names a
#: missing one
REQUIRED_FILES = (WORKFLOW, ADMISSION_PROOF, ADMISSION_PROOF_DIGEST, EXECUTION, ROOT_CASE)
FINALIZATION_FILES = ("README.md", "trust.json", "expected-report.json", PARTIAL)
AUX_DIR = "aux/"
CUSTODY_SUFFIX = ".custody"

#: observation pin member -> file name inside instances/<id>/attempts/<n>/
ATTEMPT_FILES: dict[str, str] = {
    "runDigest": "run.json",
    "preparationDigest": "preparation.json",
    "auditDigest": "audit.json",
    "evaluationErrorDigest": "evaluation-error.json",
    "auditSignaturesDigest": "audit.sig",
}

STAGE_RE = re.compile(r"\A[a-z][a-z0-9-]{0,31}\Z")
ID_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
TIMESTAMP_RE = re.compile(r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z\Z")

_STAGE = r"[a-z][a-z0-9-]{0,31}"
_ID = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_N = r"[1-9][0-9]*"
#: workflow.md §10's closed path table as path forms (the writer checks an --out
#: directory against it before replacing it; admission-proof.md §9)
_BUNDLE_PATH_RE = re.compile(
    rf"""\A(?:
      workflow\.json | root-case\.json | execution\.json
    | admission-proof\.json | admission-proof\.digest
    | README\.md | trust\.json | expected-report\.json | partial\.json | aux/[^/].*
    | (?:frozen|sets)/{_STAGE}\.json
    | selections/{_STAGE}/{_N}\.json
    | instances/{_ID}/case\.json
    | instances/{_ID}/attempts/{_N}/(?:run\.json|preparation\.json|audit\.json
                                    |evaluation-error\.json|audit\.sig)
    | outputs/{_STAGE}/{_ID}/{_N}/(?:0|{_N})\.(?:payload|envelope)\.json
    )\Z""",
    re.VERBOSE | re.DOTALL,
)

#: workflow.json's ``limits`` member names, in their order (workflow.md §2): the
#: writer loads them and the reader checks them, so both sides agree on the form
LIMIT_NAMES = (
    "maxBytes",
    "maxFiles",
    "maxInstances",
    "maxAttempts",
    "maxRecords",
    "maxCaseBytes",
    "maxPayloadBytes",
)

MAX_BLOCKS = 32
MAX_EPOCHS_PER_BLOCK = 4096
MAX_PROOF_ARRAY = 4096
MAX_PROOF_BYTES = 8 * 1024 * 1024
MAX_REVISIONS = 16
MAX_RECEIVED_FILE_BYTES = 8 * 1024 * 1024
MAX_SIGNATURE_BYTES = 65536


def frozen_path(stage: str) -> str:
    return f"frozen/{stage}.json"


def set_path(stage: str) -> str:
    return f"sets/{stage}.json"


def selection_path(stage: str, revision: int) -> str:
    return f"selections/{stage}/{revision}.json"


def case_path(instance: str) -> str:
    return f"instances/{instance}/case.json"


def attempt_file(instance: str, number: int, pin: str) -> str:
    """Path of the file pinned by observation member ``pin`` (e.g. ``auditDigest``)."""
    return f"instances/{instance}/attempts/{number}/{ATTEMPT_FILES[pin]}"


def payload_path(stage: str, instance: str, attempt: int, output: int) -> str:
    return f"outputs/{stage}/{instance}/{attempt}/{output}.payload.json"


def envelope_path(stage: str, instance: str, attempt: int, output: int) -> str:
    return f"outputs/{stage}/{instance}/{attempt}/{output}.envelope.json"


def is_finalization_path(path: str) -> bool:
    """True for the optional finalization files (never part of a candidate)."""
    return path in FINALIZATION_FILES or (path.startswith(AUX_DIR) and len(path) > len(AUX_DIR))


def is_bundle_path(path: str) -> bool:
    """True when ``path`` has the form of a row of the closed path table."""
    return _BUNDLE_PATH_RE.match(path) is not None

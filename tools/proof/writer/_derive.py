"""Pure derivations from retained inputs (docs/spec/workflow.md §3, §5).

Projection of a child's case from its parent payload, and the files and set records
of an accepted output proposal. No state, no I/O: the engine decides, these build.
"""

from __future__ import annotations

from typing import Any

from crucible.core import canon, digest
from crucible.core.structs import dataclass
from crucible.proof import layout
from crucible.proof.writer._model import Stage
from crucible.proof.writer._state import control_dumps

__all__ = ["Projection", "emitted_outputs", "project"]


@dataclass(frozen=True)
class Projection:
    """A reserved child slot: its state, failure and case bytes (None: no case)."""

    state: str
    failure: str | None
    case: bytes | None


def project(consumer: Stage, payload: Any, child: str, parent: dict[str, Any]) -> Projection:
    """Project the parent payload into the child's case; derive projection/admission."""
    if consumer.fields is None:
        projected = payload
    else:
        if not isinstance(payload, dict) or not all(f in payload for f in consumer.fields):
            return Projection("failed", "projection-invalid", None)
        projected = {f: payload[f] for f in consumer.fields}
    case = canon.dumps(
        {
            "caseVersion": 1,
            "stage": consumer.name,
            "instance": child,
            "parent": parent,
            "input": projected,
        }
    )
    if (
        consumer.admit_max_bytes is not None
        and len(canon.dumps(projected)) > consumer.admit_max_bytes
    ):
        return Projection("failed", "admission-refused", case)
    return Projection("interrupted", None, case)


def emitted_outputs(
    stage: str,
    instance: str,
    attempt: int,
    parent: dict[str, Any] | None,
    payloads: list[bytes],
) -> tuple[list[tuple[str, bytes]], list[dict[str, Any]]]:
    """Payload/envelope files (in output order) and the set records they add."""
    files: list[tuple[str, bytes]] = []
    records: list[dict[str, Any]] = []
    # reader/_replay.py builds the same envelope form, independent of the writer on
    # purpose (the reader imports no writer code, DESIGN.md); workflow.md §5 defines both
    for k, payload in enumerate(payloads):
        payload_digest = digest.of_bytes(payload)
        envelope = control_dumps(
            {
                "envelopeVersion": 1,
                "stage": stage,
                "instance": instance,
                "attempt": attempt,
                "output": k,
                "payloadDigest": payload_digest,
                "parent": parent,
            }
        )
        files.append((layout.payload_path(stage, instance, attempt, k), payload))
        files.append((layout.envelope_path(stage, instance, attempt, k), envelope))
        records.append(
            {
                "instance": instance,
                "attempt": attempt,
                "output": k,
                "payloadDigest": payload_digest,
                "envelopeDigest": digest.of_bytes(envelope),
            }
        )
    return files, records

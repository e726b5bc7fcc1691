"""Pure derivations: projection/admission of child slots and emitted output files."""

from __future__ import annotations

from crucible.core import canon, digest
from crucible.proof.writer._derive import emitted_outputs, project
from crucible.proof.writer._model import parse_workflow
from tests.proof.writer.prove_helpers import BIG_LIMITS, stage

WF = parse_workflow(
    canon.dumps(
        {
            "workflowVersion": 2,
            "name": "w",
            "limits": BIG_LIMITS,
            "stages": [
                stage("org", None, "/orgs"),
                stage("all", "org", "/x"),
                stage("named", "org", "/x", fields=["name"], admit=20),
            ],
        }
    )
)
PARENT = {"instance": "r", "output": 0}


def test_whole_payload_projection() -> None:
    slot = project(WF.stages[1], {"name": "Acme", "n": 1}, "c", PARENT)
    assert (slot.state, slot.failure) == ("interrupted", None)
    assert slot.case == canon.dumps(
        {
            "caseVersion": 1,
            "stage": "all",
            "instance": "c",
            "parent": PARENT,
            "input": {"name": "Acme", "n": 1},
        }
    )


def test_field_projection_invalid_and_admission_refused() -> None:
    named = WF.stages[2]
    assert project(named, {"site": "x"}, "c", PARENT).failure == "projection-invalid"
    assert project(named, {"site": "x"}, "c", PARENT).case is None
    refused = project(named, {"name": "N" * 20}, "c", PARENT)
    assert (refused.state, refused.failure) == ("failed", "admission-refused")
    assert refused.case is not None  # an admission-refused slot keeps its case
    ok = project(named, {"name": "Ann", "extra": 1}, "c", PARENT)
    assert canon.loads(ok.case or b"{}")["input"] == {"name": "Ann"}


def test_emitted_outputs_pair_payloads_with_envelopes() -> None:
    payloads = [canon.dumps({"a": 1}), canon.dumps({"a": 1})]
    files, records = emitted_outputs("people", "p", 2, PARENT, payloads)
    assert [f for f, _ in files] == [
        "outputs/people/p/2/0.payload.json",
        "outputs/people/p/2/0.envelope.json",
        "outputs/people/p/2/1.payload.json",
        "outputs/people/p/2/1.envelope.json",
    ]
    env = canon.loads(files[1][1])
    assert env == {
        "envelopeVersion": 1,
        "stage": "people",
        "instance": "p",
        "attempt": 2,
        "output": 0,
        "payloadDigest": digest.of_bytes(payloads[0]),
        "parent": PARENT,
    }
    assert canon.dumps(env) == files[1][1]
    assert records[1]["envelopeDigest"] == digest.of_bytes(files[3][1])
    assert files[0][1] == files[2][1]  # equal payloads stay two files

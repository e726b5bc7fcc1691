"""The epoch-by-epoch proof scan agrees with a whole parse, on both of its paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from crucible.core import canon
from crucible.proof.reader import Problem, verify_bundle
from crucible.proof.reader._proofstream import load_proof
from crucible.proof.reader._strict import JsonBounds
from tests.proof.reader.bundlegen import rich, write_files
from tests.proof.reader.mutate import PROOF, Bundle

BOUNDS = JsonBounds(depth=64, members=4096, string_bytes=65536)


def test_stream_and_whole_parse_agree() -> None:
    data = rich().exported()[PROOF]
    value = canon.loads(data)
    proof = load_proof(data, PROOF, BOUNDS)
    assert list(proof) == [e for b in value["epochBlocks"] for e in b]
    assert proof.root == {k: v for k, v in value.items() if k != "epochBlocks"}
    assert proof.blocks == [len(b) for b in value["epochBlocks"]]
    assert b"".join(proof.epoch_bytes()) == b"".join(
        canon.dumps(e) for b in value["epochBlocks"] for e in b
    )


def test_non_ascii_actor_takes_the_whole_parse_and_reads(tmp_path: Path) -> None:
    b = Bundle(rich().exported())
    group = next(e for e in b.epochs if e["kind"] == "group" and e["cancelled"])
    group["cancelled"][0]["actor"] = "rëviewer 🔍"
    files = b.finish()
    data = files[PROOF]
    proof = load_proof(data, PROOF, BOUNDS)
    assert [e["number"] for e in proof] == list(range(1, len(b.epochs) + 1))
    report = verify_bundle(write_files(tmp_path / "b", files))
    assert report.problem is None, str(report.problem)


@pytest.mark.parametrize(
    ("edit", "code"),
    [
        (lambda d: d.replace(b'"kind":"root"', b'"kind" : "root"'), "input-malformed"),
        (lambda d: d.replace(b'"number":1,', b'"number":1,"number":1,', 1), "input-malformed"),
        (
            lambda d: d.replace(b'"kind":"root"', b'"kind":' + b"[" * 80 + b"]" * 80),
            "input-over-bound",
        ),
        (lambda d: d[:-1], "input-malformed"),
    ],
)
def test_damaged_proof(edit, code) -> None:  # type: ignore[no-untyped-def]
    data = edit(rich().exported()[PROOF])
    with pytest.raises(Problem) as exc:
        load_proof(data, PROOF, BOUNDS)
    assert exc.value.code == code

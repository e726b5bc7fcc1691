"""Two full blocks and more: the block boundary of the proof chain, at 8,192 epochs.

The bundle comes from the benchmark's spec-based generator (benchmarks/bench_verify.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from crucible.core import canon, digest
from crucible.proof.reader import verify_bundle

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import bench_verify


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("scale") / "b"
    bench_verify.generate(root, 8192)
    return root


def test_8192_epochs_read(big: Path) -> None:
    report = verify_bundle(big)
    assert report.problem is None, str(report.problem)
    assert report.reading is not None
    assert report.reading.epochs == 8192
    assert report.reading.counts.instances == 257
    assert report.reading.completion == "complete"


def test_link_across_the_block_boundary(big: Path, tmp_path: Path) -> None:
    proof = canon.loads((big / "admission-proof.json").read_bytes())
    assert [len(b) for b in proof["epochBlocks"]] == [4096, 4096]
    first_of_block_two = proof["epochBlocks"][1][0]
    first_of_block_two["previousProofDigest"] = digest.of_bytes(b"elsewhere")
    data = canon.dumps(proof)
    target = tmp_path / "b"
    import shutil

    shutil.copytree(big, target)
    (target / "admission-proof.json").write_bytes(data)
    pd = digest.of_bytes(data)
    (target / "admission-proof.digest").write_bytes((pd + "\n").encode())
    ex = canon.loads((target / "execution.json").read_bytes())
    ex["admissionProofDigest"] = pd
    (target / "execution.json").write_bytes(canon.dumps(ex))
    p = verify_bundle(target).problem
    assert p is not None and (p.code, p.phase, p.epoch) == ("digest-mismatch", 2, 4097)

"""The incremental proof chain equals full canonical serialization at every prefix."""

from __future__ import annotations

import io
import random

from crucible.core import canon, digest
from crucible.proof.writer._proofchain import ProofChain, split_at_results

ROOT = {
    "workflowDigest": "sha256:" + "1" * 64,
    "execution": "exec-1",
    "rootCaseDigest": "sha256:" + "2" * 64,
    "frozenDigest": "sha256:" + "3" * 64,
    "rootInstance": "r",
}


def full(epochs: list[dict[str, object]]) -> bytes:
    blocks = [epochs[i : i + 4096] for i in range(0, len(epochs), 4096)]
    return canon.dumps({"admissionProofVersion": 1, **ROOT, "epochBlocks": blocks})


def test_p0_is_the_root_with_no_blocks() -> None:
    chain = ProofChain(ROOT)
    assert chain.p0_digest == digest.of_bytes(full([]))
    assert chain.size() == len(full([]))


def test_split_at_results_rebuilds_canonical_bytes() -> None:
    epoch = {
        "number": 7,
        "previousProofDigest": "sha256:" + "a" * 64,
        "kind": "group",
        "reservation": 3,
        "starts": [{"instance": "a", "number": 1, "retry": None}],
        "deferred": ["b"],
        "cancelled": [],
        "results": [],
    }
    head, tail = split_at_results(epoch)
    results = [{"instance": "a", "number": 1, "state": "interrupted"}]
    assert head + b",".join(canon.dumps(r) for r in results) + tail == canon.dumps(
        {**epoch, "results": results}
    )
    retry = {
        "number": 2,
        "previousProofDigest": "x",
        "kind": "retry",
        "begin": {"i": 1},
        "results": [],
    }
    head, tail = split_at_results(retry)
    assert head + tail == canon.dumps(retry)


def test_every_prefix_across_block_boundaries_matches_full_serialization() -> None:
    rng = random.Random(7)
    spool = io.BytesIO()
    chain = ProofChain(ROOT, spool)
    epochs: list[dict[str, object]] = []
    check_at = {1, 2, 4095, 4096, 4097, 4098, 8192, 8193, 8200}
    for n in range(1, 8201):
        if n % 977 == 0:  # an open group epoch with a few results
            epoch: dict[str, object] = {
                "number": n,
                "kind": "group",
                "starts": [1, 2],
                "results": [],
            }
            head, tail = split_at_results(epoch)
            assert chain.size_with_open(head, tail) == len(full([*epochs, epoch]))
            chain.open(head, tail)
            results: list[object] = []
            for j in range(2):
                result = {"j": j, "x": "y" * rng.randrange(5)}
                assert chain.size_with_result(canon.dumps(result)) == len(
                    full([*epochs, {**epoch, "results": [*results, result]}])
                )
                chain.add_result(canon.dumps(result))
                results = [*results, result]
                epoch = {**epoch, "results": results}
                if j == 0:
                    prefix = full([*epochs, epoch])
                    assert chain.size() == len(prefix)
                    assert chain.digest() == digest.of_bytes(prefix)
            chain.close()
            epochs.append(epoch)
        else:
            epoch = {"number": n, "kind": "root", "pad": "z" * rng.randrange(3)}
            eb = canon.dumps(epoch)
            if n in check_at:
                assert chain.size_with_closed(eb) == len(full([*epochs, epoch]))
            chain.append_closed(eb)
            epochs.append(epoch)
        if n in check_at:
            prefix = full(epochs)
            assert chain.size() == len(prefix)
            assert chain.digest() == digest.of_bytes(prefix)
            assert chain.previous_digest() == digest.of_bytes(prefix)
    assert spool.getvalue() + chain.finishing_bytes() == full(epochs)

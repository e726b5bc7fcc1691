"""Hostile bundles are refused in phase 1, early: before large reads, with the seed's codes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from crucible.core import canon
from crucible.proof.reader import Inability, Problem, verify_bundle
from crucible.proof.reader import _bundle as bundle_mod
from crucible.proof.reader._strict import JsonBounds, parse_json
from tests.proof.reader.bundlegen import org_people, write_files
from tests.proof.reader.mutate import PROOF, Bundle


@pytest.fixture
def valid(tmp_path: Path) -> Path:
    return write_files(tmp_path / "b", org_people().exported())


def code(root: Path) -> tuple[str, int] | None:
    p = verify_bundle(root).problem
    return None if p is None else (p.code, p.phase)


def test_oversized_proof_is_never_read(valid: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open(valid / PROOF, "ab") as f:
        f.truncate(8 * 1024 * 1024 + 1)
    reads: list[str] = []
    real = bundle_mod.BundleTree.read

    def spy(self: Any, rel: str, ceiling: int) -> bytes:
        reads.append(rel)
        return real(self, rel, ceiling)

    monkeypatch.setattr(bundle_mod.BundleTree, "read", spy)
    p = verify_bundle(valid).problem
    assert p is not None and (p.code, p.phase, p.path) == ("input-over-bound", 1, PROOF)
    assert reads == []  # refused from the walk's sizes, before any byte was read


def test_over_bound_wins_over_malformed(valid: Path) -> None:
    (valid / "execution.json").write_bytes(b"{not json")
    with open(valid / PROOF, "ab") as f:
        f.truncate(8 * 1024 * 1024 + 1)
    assert code(valid) == ("input-over-bound", 1)


def test_malformed_wins_over_version(valid: Path) -> None:
    wf = canon.loads((valid / "workflow.json").read_bytes())
    wf["workflowVersion"] = 3
    (valid / "workflow.json").write_bytes(canon.dumps(wf))
    (valid / "execution.json").write_bytes(b'{"a":1,"a":2}')
    assert code(valid) == ("input-malformed", 1)


def test_version_wins_over_missing_artifact(valid: Path) -> None:
    wf = canon.loads((valid / "workflow.json").read_bytes())
    wf["workflowVersion"] = 3
    (valid / "workflow.json").write_bytes(canon.dumps(wf))
    os.unlink(valid / "instances/p-acme/attempts/1/audit.json")
    assert code(valid) == ("version-unread", 1)


def test_symlinked_file_is_not_followed(valid: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_bytes(b'{"secret":true}')
    os.unlink(valid / "sets/people.json")
    os.symlink(secret, valid / "sets/people.json")
    p = verify_bundle(valid).problem
    assert p is not None and (p.code, p.phase, p.path) == ("input-malformed", 1, "sets/people.json")


def test_symlinked_directory_is_not_followed(valid: Path, tmp_path: Path) -> None:
    os.symlink(tmp_path, valid / "aux")
    assert code(valid) == ("input-malformed", 1)


def test_read_refuses_a_link_swapped_in_after_the_walk(valid: Path, tmp_path: Path) -> None:
    tree = bundle_mod.walk_bundle(valid, max_entries=1000)
    os.unlink(valid / "workflow.json")
    os.symlink(tmp_path / "elsewhere", valid / "workflow.json")
    with pytest.raises(Problem) as exc:
        tree.read("workflow.json", 1 << 20)
    assert exc.value.code == "input-malformed"


def test_too_many_entries(valid: Path) -> None:
    with pytest.raises(Problem) as exc:
        bundle_mod.walk_bundle(valid, max_entries=5)
    assert exc.value.code == "input-over-bound"


def test_not_a_directory_is_an_inability(tmp_path: Path) -> None:
    with pytest.raises(Inability):
        verify_bundle(tmp_path / "missing")


def test_4097_epochs_and_33_blocks(valid: Path) -> None:
    b = Bundle(org_people().exported())
    root = canon.loads(b.files[PROOF])
    for blocks in ([[b.epochs[0]] * 4097], [[b.epochs[0]]] * 33):
        (valid / PROOF).write_bytes(canon.dumps({**root, "epochBlocks": blocks}))
        assert code(valid) == ("input-over-bound", 1)


def test_full_block_rule(valid: Path) -> None:
    b = Bundle(org_people().exported())
    root = canon.loads(b.files[PROOF])
    (valid / PROOF).write_bytes(
        canon.dumps({**root, "epochBlocks": [[b.epochs[0]], [b.epochs[1]]]})
    )
    assert code(valid) == ("input-malformed", 1)


def test_missing_required_file(valid: Path) -> None:
    os.unlink(valid / "execution.json")
    assert code(valid) == ("inventory-mismatch", 1)


def test_id_over_its_form(valid: Path) -> None:
    b = Bundle(org_people().exported())
    b.epochs[-1]["starts"][0]["instance"] = "x" * 129
    write_files(valid, b.finish())
    assert code(valid) == ("input-malformed", 1)


@pytest.mark.parametrize("name", ["a\nb", "a\x01b", "a\x1fb", "a\x7fb", "\x7f"])
def test_non_portable_name(valid: Path, name: str) -> None:
    (valid / "aux").mkdir()
    (valid / "aux" / name).write_bytes(b"x")
    problem = verify_bundle(valid).problem
    assert problem is not None and (problem.code, problem.phase) == ("input-malformed", 1)
    assert "not a portable file name" in problem.message


def test_portable_names_match_the_writer() -> None:
    # the writer refuses C0 controls and DEL in names; the reader refuses the same set
    assert not any(bundle_mod._portable(f"a{chr(c)}b") for c in [*range(0x20), 0x7F])
    assert all(
        bundle_mod._portable(f"a{chr(c)}b") for c in range(0x20, 0x7F) if chr(c) not in "/\\"
    )
    assert bundle_mod._portable("caf\u00e9") and bundle_mod._portable("\u0080")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"[" * 2000 + b"]" * 2000, "input-over-bound"),
        (b"[" * 65 + b"]" * 65, "input-over-bound"),
        (b"[" * 64 + b"]" * 64, None),
        (b'{"a":1,"a":1}', "input-malformed"),
        (b'{"a":9007199254740992}', "input-malformed"),
        (b'{"a":NaN}', "input-malformed"),
        (b'"\xff"', "input-malformed"),
        (b"[" + b",".join([b"1"] * 4097) + b"]", "input-over-bound"),
        (b'"' + b"x" * 65537 + b'"', "input-over-bound"),
        (b'{"b":1,"a":2}', "input-malformed"),
        (b'{"a":2,"b":1}', None),
    ],
)
def test_strict_json(data: bytes, expected: str | None) -> None:
    bounds = JsonBounds(depth=64, members=4096, string_bytes=65536)
    if expected is None:
        parse_json(data, "f.json", bounds, canonical=True)
        return
    with pytest.raises(Problem) as exc:
        parse_json(data, "f.json", bounds, canonical=True)
    assert (exc.value.code, exc.value.phase) == (expected, 1)

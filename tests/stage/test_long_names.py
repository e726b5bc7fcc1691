"""The longest legal task name and the longest escaped key fit every file the
tools name after them (issue 14; docs/spec/manifest.md, "Names"): 255 bytes is
the file-name limit, and a name's longest suffix is subtracted from it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crucible.core import contract
from crucible.core.errors import InputRefused
from crucible.stage import (
    KEY_COMPONENT_MAX,
    StateDir,
    StateLayout,
    escape_key,
)
from tests.stage.stageplans import consume, finish, plan, settle, task

LONGEST = "t" * contract.NAME_MAX_BYTES
LONG_KEY = "k" * KEY_COMPONENT_MAX  # escapes to itself: the longest unshortened key


def _components(path: Path, state: Path) -> list[int]:
    return [len(c.encode()) for c in path.relative_to(state).parts]


def test_the_limits_are_the_file_name_limit_less_the_longest_suffix() -> None:
    assert contract.FILE_NAME_MAX == 255
    assert contract.NAME_MAX_BYTES == 255 - len(".jsonl") == 249
    assert contract.IDENT_MAX_BYTES == KEY_COMPONENT_MAX == 255 - len(".json") == 250
    assert escape_key(LONG_KEY) == LONG_KEY


def test_every_state_path_of_the_longest_names_fits_the_file_name_limit(tmp_path: Path) -> None:
    layout = StateLayout(tmp_path)
    paths = [
        layout.result_path(LONGEST),
        layout.result_path(LONGEST, "k"),
        layout.packed_path(LONGEST),
        layout.instances_path(LONGEST),
        layout.files_dir(LONGEST),
        layout.work_dir(LONGEST),
    ]
    for key in (None, LONG_KEY, "é" * 200):  # the last one is shortened by escaping
        paths += [
            layout.output_path(LONGEST, key, 1),
            layout.log_path(LONGEST, key),
            layout.prompt_path(LONGEST, key),
            layout.files_dir(LONGEST, key),
            layout.work_dir(LONGEST, key),
        ]
    for path in paths:
        assert max(_components(path, tmp_path)) <= contract.FILE_NAME_MAX, path
    # and each suffix the layout appends is one the contract subtracts
    suffixes = {p.name[len(LONGEST) :] for p in paths if p.name.startswith(LONGEST)}
    assert suffixes - {""} <= set(contract.TASK_NAME_SUFFIXES)


def test_one_byte_more_is_refused_by_the_layout(tmp_path: Path) -> None:
    with pytest.raises(InputRefused, match="249"):
        StateLayout(tmp_path).packed_path(LONGEST + "t")


def _tamper_through(ws: Path, rel: str) -> None:
    victim = ws / "inputs" / rel
    if victim.stat().st_nlink == 1:
        pytest.skip("reflinked: every consumer has a private copy")
    victim.chmod(0o644)
    with open(victim, "r+b") as f:
        f.write(b"EVIL")


def test_a_longest_named_units_tampered_list_fits(state: Path) -> None:
    """The replaced inodes of the longest-named unit are listed in
    ``shared/@tampered/<task>``: ``shared/<task>.tampered.jsonl`` was 264 bytes
    long, so the restore failed with ENAMETOOLONG instead of naming the file."""
    p = plan(
        task(LONGEST, emits_files=["o"]), task("a", needs=[LONGEST]), task("b", needs=[LONGEST])
    )
    settle(p, state, LONGEST, None, files={"o": b"captured"})
    a = consume(p, state, "a")
    _tamper_through(a, f"{LONGEST}/o")
    rec = finish(p, state, "a")
    assert rec["status"] == "failed" and "changed while a held it" in rec["note"]
    assert (state / "shared" / "@tampered" / LONGEST).stat().st_size > 0
    b = consume(p, state, "b")
    assert (b / "inputs" / LONGEST / "o").read_bytes() == b"captured"


def test_a_longest_keyed_instances_tampered_list_fits(state: Path) -> None:
    """An instance with a 250-byte escaped key: ``<key>.tampered.jsonl`` was 265 bytes."""
    m = "m" * contract.NAME_MAX_BYTES
    p = plan(
        task("src", emits={"xs": "object"}),
        task(m, needs=["src"], map="src.xs", emits_files=["o"]),
        task("j", needs=[m]),
        task("k", needs=[m]),
    )
    settle(p, state, "src", {"xs": {LONG_KEY: 1}})  # an object's keys are the instance keys
    settle(p, state, m, None, key=LONG_KEY, files={"o": b"captured"})
    StateDir(p, state).settle_fold(m, [LONG_KEY])
    j = consume(p, state, "j")
    _tamper_through(j, f"{m}/{LONG_KEY}/o")
    rec = finish(p, state, "j")
    assert rec["status"] == "failed" and "changed while j held it" in rec["note"]
    listed = state / "shared" / m / "@tampered" / LONG_KEY
    assert listed.stat().st_size > 0
    assert sorted(os.listdir(state / "shared" / m)) == ["@tampered", LONG_KEY]
    k = consume(p, state, "k")
    assert (k / "inputs" / m / LONG_KEY / "o").read_bytes() == b"captured"

"""swap_in_dir: a built tree takes a target's place whatever is there, never
following a symlink, and leaves no temporary behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from crucible.stage._fsio import swap_in_dir


def _built(parent: Path) -> Path:
    built = parent / "@tmp-inputs-abcdefgh"
    built.mkdir()
    (built / "new").write_text("new")
    return built


@pytest.mark.parametrize("there", ["nothing", "empty dir", "full dir", "file", "symlink"])
@pytest.mark.parametrize("durable", [True, False])
def test_swap_replaces_whatever_is_there(tmp_path: Path, there: str, durable: bool) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    target = ws / "inputs"
    if there == "empty dir":
        target.mkdir()
    elif there == "full dir":
        target.mkdir()
        (target / "old").write_text("old")
        (target / "sub").mkdir()
        (target / "sub" / "f").write_text("f")
        (target / "sub").chmod(0o500)  # a read-only directory is removed too
    elif there == "file":
        target.write_text("a file")
    elif there == "symlink":
        target.symlink_to(outside)
    swap_in_dir(_built(ws), target, durable=durable)
    assert not target.is_symlink() and sorted(p.name for p in target.iterdir()) == ["new"]
    assert sorted(p.name for p in ws.iterdir()) == ["inputs"]  # no temporary left
    assert sorted(p.name for p in outside.iterdir()) == ["keep"]  # never followed

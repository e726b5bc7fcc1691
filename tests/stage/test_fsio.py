"""Stage's filesystem helpers: swap_in_dir takes a target's place whatever is
there, never following a symlink; write_atomic creates a missing parent, also
when several processes write its first records at once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crucible.stage._fsio import swap_in_dir, write_atomic


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


def test_first_records_written_at_once_into_a_missing_directory(tmp_path: Path) -> None:
    """Regression: a worker whose first write failed because the directory was
    missing, and which found it created by another worker meanwhile, gave up."""
    for round_ in range(20):
        target = tmp_path / str(round_) / "results" / "measure"
        go_r, go_w = os.pipe()
        pids = []
        for k in range(4):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - child
                code = 1
                try:
                    os.close(go_w)
                    os.read(go_r, 1)  # all start together
                    write_atomic(target / f"{k}.json", b"{}")
                    code = 0
                finally:
                    os._exit(code)
            pids.append(pid)
        os.close(go_r)
        os.write(go_w, b"go" * 4)
        os.close(go_w)
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
        assert codes == [0, 0, 0, 0], f"round {round_}: {codes}"
        assert sorted(p.name for p in target.iterdir()) == [f"{k}.json" for k in range(4)]

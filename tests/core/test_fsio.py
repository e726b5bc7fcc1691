"""crucible.core.fsio: remove_tree and clear_path at any depth, through read-only
directories, never following a symlink out of the tree."""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from crucible.core.fsio import clear_path, remove_tree

DEPTH = 1500  # past the interpreter's recursion limit (1000), within PATH_MAX


def _deep(top: Path, depth: int) -> None:
    path = str(top)
    os.mkdir(path)
    for _ in range(depth):  # one mkdir a level: makedirs and Path.mkdir recurse
        path += "/d"
        os.mkdir(path)
    with open(path + "/leaf", "w") as f:
        f.write("x")


def test_a_tree_nested_past_the_recursion_limit_is_removed(tmp_path: Path) -> None:
    _deep(tmp_path / "t", DEPTH)
    remove_tree(tmp_path / "t")
    assert not (tmp_path / "t").exists()


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12's rmtree walks without recursion")
def test_shutil_rmtree_could_not(tmp_path: Path) -> None:
    # why remove_tree is iterative: the recursive rmtree of 3.11 gives up
    _deep(tmp_path / "t", DEPTH)
    with pytest.raises(RecursionError):
        shutil.rmtree(tmp_path / "t")
    remove_tree(tmp_path / "t")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_directories_are_opened_up_files_never_chmodded(tmp_path: Path) -> None:
    top = tmp_path / "t"
    (top / "a" / "b").mkdir(parents=True)
    kept = tmp_path / "kept"
    kept.write_text("shared")
    kept.chmod(0o444)
    os.link(kept, top / "a" / "b" / "hardlink")  # a staged file shared with others
    for d in (top / "a" / "b", top / "a", top):
        d.chmod(stat.S_IRUSR | stat.S_IXUSR)
    remove_tree(top)
    assert not top.exists()
    assert stat.S_IMODE(kept.stat().st_mode) == 0o444


def test_a_read_only_tree_is_removed(tmp_path: Path) -> None:
    top = tmp_path / "t"
    (top / "a").mkdir(parents=True)
    (top / "a" / "f").write_text("x")
    (top / "a").chmod(0o555)
    top.chmod(0o555)
    remove_tree(top)
    assert not top.exists()


def test_links_are_removed_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    top = tmp_path / "t"
    top.mkdir()
    (top / "to-dir").symlink_to(outside)
    (top / "to-file").symlink_to(outside / "keep")
    os.mkfifo(top / "fifo")
    remove_tree(top)
    assert not top.exists() and (outside / "keep").read_text() == "keep"
    link = tmp_path / "link"
    link.symlink_to(outside)
    remove_tree(link)  # a link at the top is removed, its target kept
    assert not link.is_symlink() and (outside / "keep").exists()


def test_what_is_gone_is_no_error(tmp_path: Path) -> None:
    remove_tree(tmp_path / "missing")
    clear_path(tmp_path / "missing")
    (tmp_path / "f").write_text("x")
    remove_tree(tmp_path / "f")
    assert not (tmp_path / "f").exists()


def test_clear_path_clears_a_deep_tree(tmp_path: Path) -> None:
    _deep(tmp_path / "t", DEPTH)
    clear_path(tmp_path / "t")
    assert not (tmp_path / "t").exists()

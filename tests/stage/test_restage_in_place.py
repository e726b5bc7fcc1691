"""Restaging a recycled workspace in place (issue 14; docs/spec/inputs.md 3.8):
the tree another instance of the same task left is rewritten to exactly what a
fresh staging lays down, value files through their own inodes, unchanged
hard links to the published ancestor files kept — and whatever the previous
task did to it (a symlink out, a hard link to the store, a FIFO, a directory,
a chmod and a write) changes nothing outside, nothing in the store, and never
hangs the staging."""

from __future__ import annotations

import hashlib
import os
import signal
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from crucible.stage import StateDir
from tests.stage.stageplans import plan, settle, task

N_FILES = 50


def _plan(version: int = 2) -> dict[str, Any]:
    return plan(
        task("p", emits_files=["out/**"], emits={"xs": "array"}),
        task("m", needs=["p"], map="p.xs"),
        version=version,
    )


def _files() -> dict[str, bytes]:
    return {f"out/f{i:02}": f"file {i}\n".encode() * (i + 1) for i in range(N_FILES)}


@pytest.fixture
def produced(state: Path) -> dict[str, Any]:
    p = _plan()
    settle(p, state, "p", {"xs": [{"n": i, "text": "x" * i} for i in range(6)]}, files=_files())
    return p


def _tree(top: Path) -> dict[str, tuple[str, bytes | None]]:
    """rel -> (kind, bytes of a regular file) of everything under ``top``."""
    out: dict[str, tuple[str, bytes | None]] = {}
    for root, dirs, files in os.walk(top):
        for name in dirs + files:
            path = Path(root) / name
            rel = str(path.relative_to(top))
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                out[rel] = ("file", path.read_bytes())
                assert stat.S_IMODE(st.st_mode) == 0o444, rel
            else:
                out[rel] = ("dir" if stat.S_ISDIR(st.st_mode) else "other", None)
    return out


def _fresh(p: dict[str, Any], state: Path, key: str) -> Path:
    ws = state.parent / f"fresh-{key}"
    StateDir(p, state).stage_inputs("m", ws, key=key)
    return ws


def _recycle(state: Path, src: Path, key: str) -> Path:
    """What dispatch does: the passed instance's workspace renamed to the next's."""
    dst = state / "work" / "m" / key
    os.rename(src, dst)
    return dst


def _digests(top: Path) -> dict[str, str]:
    return {
        str(path.relative_to(top)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(top.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }


@pytest.fixture
def no_hang() -> Iterator[None]:
    """A staging that blocks (on a FIFO) fails the test instead of hanging it."""

    def boom(signum: int, frame: Any) -> None:
        raise TimeoutError("staging blocked")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(20)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_in_place_equals_fresh_and_keeps_the_ancestor_links(
    state: Path, produced: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    p = produced
    ws0 = state / "work" / "m" / "0"
    StateDir(p, state).stage_inputs("m", ws0, key="0")
    before = {
        rel: os.lstat(ws0 / "inputs" / rel).st_ino
        for rel in ("p/out/f00", "p/out/f49", "@values/item", "@values/index.json")
    }
    if os.lstat(ws0 / "inputs" / "p/out/f00").st_nlink == 1:
        pytest.skip("reflinked: every consumer gets its own inode")
    links: list[str] = []
    real_link = os.link

    def counting_link(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        links.append(str(dst))
        real_link(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", counting_link)
    for key in ("1", "2", "3"):
        ws = _recycle(state, ws0, key)
        staged = StateDir(p, state).stage_inputs("m", ws, key=key, in_place=True)
        assert _tree(ws / "inputs") == _tree(_fresh(p, state, key) / "inputs")
        assert staged.env["CRUCIBLE_INPUTS_DIR"] == str(ws / "inputs" / "@values")
        assert staged.index is not None and staged.index["key"] == key
        after = {rel: os.lstat(ws / "inputs" / rel).st_ino for rel in before}
        assert after == before, key  # same inodes: rewritten, links kept
        ws0 = ws
    assert [d for d in links if "/work/m/" in d] == []  # no link call for a recycled one
    assert (ws0 / "inputs" / "@values" / "item").read_bytes() == b'{"n":3,"text":"xxx"}'


def test_names_no_longer_staged_are_removed(state: Path, produced: dict[str, Any]) -> None:
    p = produced
    ws0 = state / "work" / "m" / "0"
    StateDir(p, state).stage_inputs("m", ws0, key="0")
    (ws0 / "inputs" / "@values" / "stale").write_bytes(b"old")
    (ws0 / "inputs" / "p" / "out" / "extra").write_bytes(b"old")
    (ws0 / "inputs" / "junk").mkdir()
    (ws0 / "inputs" / "junk" / "deep").write_bytes(b"old")
    ws = _recycle(state, ws0, "4")
    StateDir(p, state).stage_inputs("m", ws, key="4", in_place=True)
    assert _tree(ws / "inputs") == _tree(_fresh(p, state, "4") / "inputs")


def _symlink_out(item: Path, outside: Path, store: Path) -> None:
    item.unlink()
    item.symlink_to(outside)


def _hard_link_store(item: Path, outside: Path, store: Path) -> None:
    item.unlink()
    os.link(store, item)


def _fifo(item: Path, outside: Path, store: Path) -> None:
    item.unlink()
    os.mkfifo(item)


def _directory(item: Path, outside: Path, store: Path) -> None:
    item.unlink()
    item.mkdir()
    (item / "inner").write_bytes(b"inner")
    (item / "link").symlink_to(outside)


def _chmod_write(item: Path, outside: Path, store: Path) -> None:
    item.chmod(0o644)
    item.write_bytes(b'"forged"' * 100)


HOSTILE: dict[str, Callable[[Path, Path, Path], None]] = {
    "symlink-out": _symlink_out,
    "hard-link-to-store": _hard_link_store,
    "fifo": _fifo,
    "directory": _directory,
    "chmod-and-write": _chmod_write,
}


@pytest.mark.parametrize("how", sorted(HOSTILE))
@pytest.mark.usefixtures("no_hang")
def test_a_hostile_item_gives_the_next_instance_correct_bytes(
    state: Path, produced: dict[str, Any], tmp_path: Path, how: str
) -> None:
    p = produced
    outside = tmp_path / "outside"
    outside.write_bytes(b"outside, untouched")
    store = state / "files" / "p" / "out" / "f07"
    store_digests = _digests(state / "files")
    ws0 = state / "work" / "m" / "0"
    StateDir(p, state).stage_inputs("m", ws0, key="0")
    shared_digests = _digests(state / "shared" / "p" / "tree")
    assert len(shared_digests) == N_FILES
    HOSTILE[how](ws0 / "inputs" / "@values" / "item", outside, store)
    ws = _recycle(state, ws0, "5")
    StateDir(p, state).stage_inputs("m", ws, key="5", in_place=True)
    item = ws / "inputs" / "@values" / "item"
    st = os.lstat(item)
    assert stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and stat.S_IMODE(st.st_mode) == 0o444
    assert item.read_bytes() == b'{"n":5,"text":"xxxxx"}'
    assert _tree(ws / "inputs") == _tree(_fresh(p, state, "5") / "inputs")
    assert outside.read_bytes() == b"outside, untouched"
    assert _digests(state / "files") == store_digests
    assert _digests(state / "shared" / "p" / "tree") == shared_digests


@pytest.mark.usefixtures("no_hang")
def test_hostile_ancestor_files_and_directories_are_replaced_not_followed(
    state: Path, produced: dict[str, Any], tmp_path: Path
) -> None:
    p = produced
    outside = tmp_path / "outside-dir"
    outside.mkdir()
    (outside / "keep").write_bytes(b"keep")
    store_digests = _digests(state / "files")
    ws0 = state / "work" / "m" / "0"
    StateDir(p, state).stage_inputs("m", ws0, key="0")
    inputs = ws0 / "inputs"
    (inputs / "p" / "out" / "f01").unlink()
    (inputs / "p" / "out" / "f01").symlink_to(outside / "keep")
    (inputs / "p" / "out" / "f02").unlink()
    os.mkfifo(inputs / "p" / "out" / "f02")
    for name in os.listdir(inputs / "@values"):
        os.unlink(inputs / "@values" / name)
    (inputs / "@values").rmdir()
    (inputs / "@values").symlink_to(outside)  # a staged directory turned into a symlink out
    ws = _recycle(state, ws0, "2")
    StateDir(p, state).stage_inputs("m", ws, key="2", in_place=True)
    assert _tree(ws / "inputs") == _tree(_fresh(p, state, "2") / "inputs")
    assert sorted(os.listdir(outside)) == ["keep"]
    assert (outside / "keep").read_bytes() == b"keep"
    assert _digests(state / "files") == store_digests


def test_a_tree_that_is_not_a_directory_any_more_is_staged_fresh(
    state: Path, produced: dict[str, Any], tmp_path: Path
) -> None:
    p = produced
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    ws0 = state / "work" / "m" / "0"
    StateDir(p, state).stage_inputs("m", ws0, key="0")
    from crucible.core.fsio import remove_tree

    remove_tree(ws0 / "inputs")
    (ws0 / "inputs").symlink_to(outside)
    ws = _recycle(state, ws0, "3")
    StateDir(p, state).stage_inputs("m", ws, key="3", in_place=True)
    assert not (ws / "inputs").is_symlink()
    assert _tree(ws / "inputs") == _tree(_fresh(p, state, "3") / "inputs")
    assert os.listdir(outside) == []


def test_edition_1_restages_its_object_in_place(state: Path) -> None:
    p = _plan(version=1)
    settle(p, state, "p", {"xs": ["a", "bb", "ccc"]}, files=_files())
    ws0 = state / "work" / "m" / "0"
    StateDir(p, state).stage_inputs("m", ws0, key="0")
    ino = os.lstat(ws0 / "inputs" / "@inputs.json").st_ino
    ws = _recycle(state, ws0, "2")
    staged = StateDir(p, state).stage_inputs("m", ws, key="2", in_place=True)
    assert _tree(ws / "inputs") == _tree(_fresh(p, state, "2") / "inputs")
    assert os.lstat(ws / "inputs" / "@inputs.json").st_ino == ino
    assert staged.value is not None and staged.value["item"] == "ccc"
    assert staged.env["CRUCIBLE_INPUTS_FILE"] == str(ws / "inputs" / "@inputs.json")


def test_an_ancestor_directory_turned_into_a_symlink_out_is_not_followed(
    state: Path, produced: dict[str, Any], tmp_path: Path
) -> None:
    p = produced
    outside = tmp_path / "outside-tree"
    (outside / "out").mkdir(parents=True)
    (outside / "out" / "f00").write_bytes(b"mine")
    ws0 = state / "work" / "m" / "0"
    StateDir(p, state).stage_inputs("m", ws0, key="0")
    from crucible.core.fsio import remove_tree

    remove_tree(ws0 / "inputs" / "p")
    (ws0 / "inputs" / "p").symlink_to(outside)
    ws = _recycle(state, ws0, "1")
    StateDir(p, state).stage_inputs("m", ws, key="1", in_place=True)
    assert _tree(ws / "inputs") == _tree(_fresh(p, state, "1") / "inputs")
    assert sorted(str(q.relative_to(outside)) for q in outside.rglob("*")) == ["out", "out/f00"]
    assert (outside / "out" / "f00").read_bytes() == b"mine"


def test_a_read_only_value_file_is_rewritten_through_its_inode_without_root(
    state: Path, produced: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not root, a 0444 file cannot be opened for writing: it is opened
    read-only, checked to be the same inode, chmod'ed and reopened through
    /proc/self/fd (simulated here: the write open is refused as for a user)."""
    from crucible.stage import _restage

    p = produced
    ws0 = state / "work" / "m" / "0"
    StateDir(p, state).stage_inputs("m", ws0, key="0")
    ino = os.lstat(ws0 / "inputs" / "@values" / "item").st_ino
    real_open = os.open
    refused: list[str] = []

    def as_a_user(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags == _restage._OPEN_W:
            refused.append(str(path))
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", as_a_user)
    ws = _recycle(state, ws0, "4")
    StateDir(p, state).stage_inputs("m", ws, key="4", in_place=True)
    item = ws / "inputs" / "@values" / "item"
    assert refused and os.lstat(item).st_ino == ino
    assert item.read_bytes() == b'{"n":4,"text":"xxxx"}'
    assert stat.S_IMODE(os.lstat(item).st_mode) == 0o444
    monkeypatch.undo()
    assert _tree(ws / "inputs") == _tree(_fresh(p, state, "4") / "inputs")

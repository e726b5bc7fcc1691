"""Capture's per-file work beside the hash (docs/spec/inputs.md 4.5): a large
file the kernel copies in one step is handed to its hashing thread once copied
(one wake-up, not three), a failed copy of such a file closes its copy, each
directory of the copy is made once, and the clone memo is asked by the devices
capture already knows."""

from __future__ import annotations

import errno
import hashlib
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from crucible.core.errors import OperationalError
from crucible.stage import _files
from crucible.stage._files import KERNEL_COPY_MIN, capture_files

BIG = KERNEL_COPY_MIN + 4321


def _tree(ws: Path, sizes: dict[str, int]) -> None:
    for rel, size in sizes.items():
        p = ws / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(size))


def _sha(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def _capture(ws: Path, dest: Path, patterns: tuple[str, ...]) -> list[dict[str, object]]:
    dest.mkdir(exist_ok=True)
    return capture_files(ws, patterns, dest, budget=1 << 40, require_literals=True).files


def test_a_file_copied_in_one_step_is_handed_over_once_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_files, "_SENDFILE_MAX", BIG + 10)  # "big" takes several steps
    ws = tmp_path / "ws"
    _tree(ws, {"a": BIG, "b": BIG + 10, "big": 3 * BIG})
    handed: list[tuple[str, int | None]] = []
    advanced: list[str] = []
    real_submit, real_advance = _files._Hasher.submit, _files._Copy.advance

    def submit(self: Any, job: Any) -> None:
        handed.append((job.target.name, job.size))  # None: handed over before its copy
        real_submit(self, job)

    def advance(self: Any, copied: int) -> None:
        advanced.append(self.target.name)
        real_advance(self, copied)

    monkeypatch.setattr(_files._Hasher, "submit", submit)
    monkeypatch.setattr(_files._Copy, "advance", advance)
    files = _capture(ws, tmp_path / "dest", ("a", "b", "big"))
    assert handed == [("a", BIG), ("b", BIG + 10), ("big", None)]
    assert set(advanced) == {"big"}  # only a copy in several steps is followed
    assert [f["digest"] for f in files] == [_sha(ws / n) for n in ("a", "b", "big")]


@pytest.mark.parametrize("cores", [1, 2])
def test_a_failed_one_step_copy_closes_its_copy_and_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cores: int
) -> None:
    monkeypatch.setattr(_files, "_hash_threads", lambda: cores)
    ws = tmp_path / "ws"
    _tree(ws, {"a": BIG, "b": BIG, "c": BIG})
    real = _files.kernel_copy_bounded
    copies: list[str] = []

    def copy(src: int, out: int, target: Path, **kw: Any) -> int:
        copies.append(target.name)
        if target.name == "b":
            raise OSError(errno.EIO, "Input/output error")
        return real(src, out, target, **kw)

    monkeypatch.setattr(_files, "kernel_copy_bounded", copy)
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(OperationalError, match="Input/output error"):
        _capture(ws, tmp_path / "dest", ("a", "b", "c"))
    assert copies == ["a", "b"]
    assert set(os.listdir("/proc/self/fd")) == before
    assert not [t for t in threading.enumerate() if t.name == "crucible-capture-hash"]


def test_each_directory_of_the_copy_is_made_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = tmp_path / "ws"
    sizes = {f"out/d{i % 3}/f{i}": 10 * i for i in range(12)}
    sizes |= {f"out/d0/big{i}": BIG for i in range(3)}
    sizes["top.txt"] = 5
    sizes["lit/deep/one.bin"] = 7
    _tree(ws, sizes)
    dest = tmp_path / "dest"
    dest.mkdir()
    existed: list[str] = []
    real_mkdir = os.mkdir

    def mkdir(path: Any, *args: Any, **kw: Any) -> None:
        try:
            real_mkdir(path, *args, **kw)
        except FileExistsError:
            existed.append(str(path))
            raise

    monkeypatch.setattr(os, "mkdir", mkdir)
    patterns = ("out", "top.txt", "lit/deep/one.bin")
    files = capture_files(ws, patterns, dest, budget=1 << 40, require_literals=True).files
    monkeypatch.undo()
    # asked again for no directory it made (before: once for every file), only
    # for ``dest`` itself, which the caller made
    assert existed == [str(dest)]
    assert sorted(str(f["path"]) for f in files) == sorted(sizes)
    for f in files:
        assert f["digest"] == _sha(dest / str(f["path"]))


def test_the_clone_memo_is_asked_by_the_devices_capture_knows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = tmp_path / "ws"
    _tree(ws, {"a": BIG, "b": BIG})
    keys: list[object] = []
    real = _files.clone_fd

    def clone(src: int, out: int, key: tuple[int, int] | None = None) -> bool:
        keys.append(key)
        return real(src, out, key)

    monkeypatch.setattr(_files, "clone_fd", clone)
    dev = os.stat(tmp_path).st_dev
    _capture(ws, tmp_path / "dest", ("a", "b"))
    assert keys == [(dev, dev), (dev, dev)]
